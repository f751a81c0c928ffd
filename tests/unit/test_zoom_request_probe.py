"""bench/zoom_request_probe.py: a zoom question scored once per stretch as the first request, the
candidates the task's own first turns, and the paired comparison of two models."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoProcessor

from bench.zoom_request_probe import (
    ModelRequests,
    first_requests,
    landmark_slot,
    paired_line,
    request_log_probs,
)
from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from datamodules.tool_traces import ToolTraces, trace_turns
from datatools.shard_writer import write_shards
from datatools.synthetic import encoded_samples
from datatools.zoom_task import ZoomConfig, slot_span
from datatools.zoom_task import encode_sample as zoom_sample
from models.sft import SFTModule

MAX_PIXELS = 56 * 56


def test_each_stretch_is_asked_for_as_the_task_writes_a_first_request(
    tmp_path: Path, family_model_dir
) -> None:
    config = ZoomConfig()
    write_shards(encoded_samples(config, "val", 2, encode=zoom_sample), tmp_path, "val")
    samples = list(
        VideoQAStream(
            resolve_shards(str(tmp_path / "val-*.tar")),
            num_frames=16,
            max_pixels=MAX_PIXELS,
            keep_video_bytes=True,
        )
    )
    model_dir = family_model_dir("qwen3_vl")
    module = SFTModule(str(model_dir))
    module.configure_model()
    module.eval()
    collator = VideoQACollator(
        AutoProcessor.from_pretrained(model_dir),
        family=module.family,
        tool_traces=ToolTraces(MAX_PIXELS, module.family.merged_patch_pixels),
    )
    for sample in samples:
        trace = sample.row.extra["tool_trace"]
        start_s, end_s = sample.row.extra["relevant_span_s"]
        assert slot_span(config, landmark_slot(config, sample)) == (start_s, end_s)
        candidates = list(first_requests(config, sample))
        assert len(candidates) == config.slots
        # The stretch the row's own random trace asked for first is written the same way here.
        asked = round(trace["requests"][0]["start_s"] / slot_span(config, 1)[0])
        assert trace_turns(candidates[asked].row.extra["tool_trace"]) == trace_turns(trace)[:1]
        assert candidates[0].row.extra["relevant_span_s"] == [start_s, end_s]  # the rest of the row kept
        log_probs = request_log_probs(module, collator, candidates)
        assert log_probs.shape == (config.slots,)
        assert float(torch.logsumexp(log_probs, 0)) == pytest.approx(0.0, abs=1e-12)
        # The requests differ only in their times: an untrained model tells them apart a little.
        assert len({round(float(v), 9) for v in log_probs}) > 1


def test_the_paired_change_of_the_blue_stretch() -> None:
    base = ModelRequests("start", [math.log(p) for p in (0.1, 0.2, 0.1)], [False, True, False], [2.0] * 3)
    new = ModelRequests("after", [math.log(p) for p in (0.2, 0.5, 0.3)], [True, False, True], [1.9] * 3)
    assert base.row() == ["start", "0.1333", "0.333", "2.000"]
    # Differences 0.1, 0.3, 0.2: mean 0.2, sd 0.1, t = 0.2 / (0.1 / sqrt 3) = 3.464 on 2 degrees of
    # freedom: two-sided p = 1 - t / sqrt(t^2 + 2) = 0.0742. Most likely: 2 gained, 1 lost: p = 1.
    assert paired_line(base, new) == (
        "- after vs start, same 3 questions: P(blue stretch) +0.2000 per question (sd 0.1000), paired "
        "t-test p = 0.074; blue stretch most likely in 2 questions only after, 1 only before, exact "
        "McNemar p = 1"
    )
