"""CoT-SFT on tool traces: the teacher-forcing row is the episode a rollout would play (same
tokens, same positions, the segment in place), only the model's turns are trained, and a trace
the tool cannot serve falls back to the direct target, with a warning."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoProcessor

from core.positions import mrope_position_ids
from core.tool_use.episode import Episode
from core.tool_use.reply import tokenize_reply
from core.tool_use.requests import EpisodeFrames, FrameBudget, request_body, served_text
from datamodules.collate import IGNORE_INDEX, VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from datamodules.tool_traces import ToolTraces, trace_turns
from datamodules.video import decode_frames
from datatools.shard_writer import write_shards
from datatools.synthetic import encoded_samples
from datatools.zoom_task import ZoomConfig
from datatools.zoom_task import encode_sample as zoom_sample
from families import family_of
from models.loading import load_model
from models.sft import SFTModule

MAX_PIXELS = 56 * 56


@pytest.fixture(scope="module")
def zoom_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zoom")
    write_shards(encoded_samples(ZoomConfig(), "val", 4, encode=zoom_sample), out, "val")
    return out


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def collated(request: pytest.FixtureRequest, zoom_dir: Path, family_model_dir) -> dict:
    model_dir = family_model_dir(request.param)
    processor = AutoProcessor.from_pretrained(model_dir)
    family = family_of(load_model(model_dir).config)
    stream = VideoQAStream(
        resolve_shards(str(zoom_dir / "val-*.tar")),
        num_frames=16,
        max_pixels=MAX_PIXELS,
        keep_video_bytes=True,
    )
    samples = list(stream)
    collator = VideoQACollator(processor, family=family, tool_traces=ToolTraces(MAX_PIXELS, 28))
    return {
        "model_dir": model_dir,
        "processor": processor,
        "family": family,
        "samples": samples,
        "batch": collator(samples),
    }


def segment_rows(samples) -> list[int]:
    """Per video of the batch's target layout (row order: each row's prompt video, then its
    trace's segments), the row it belongs to, or -1 for a prompt video."""
    owners = []
    for row, sample in enumerate(samples):
        owners += [-1] + [row] * len(trace_turns(sample.row.extra["tool_trace"]))
    return owners


def test_a_trace_row_is_the_episode_a_rollout_would_play(collated: dict) -> None:
    processor, family, samples, batch = (collated[k] for k in ("processor", "family", "samples", "batch"))
    tokenizer = processor.tokenizer
    rule = family.position_rule
    positions = mrope_position_ids(
        batch["video_mask"],
        batch["attention_mask"],
        batch["target_video_grid_thw"],
        batch["target_second_per_grid_ts"],
        spatial_merge_size=rule.spatial_merge_size,
        tokens_per_second=rule.tokens_per_second,
        temporal=rule.temporal,
    )
    owners = segment_rows(samples)
    assert len(batch["target_video_grid_thw"]) == len(owners)  # a prompt video and its segments each
    assert max(owners.count(row) for row in range(len(samples))) == 2  # some trace asked twice
    for row, sample in enumerate(samples):
        layout = batch["prompts"][row]
        trace = sample.row.extra["tool_trace"]
        # The episode the rollout code builds from the same turns and the same served frames.
        state = EpisodeFrames(FrameBudget())
        episode = Episode(layout, rule=rule)
        for turn in trace_turns(trace):
            plan = state.serve(
                request_body(turn), source_fps=sample.video.fps, num_frames=sample.video.total_num_frames
            )
            assert len(plan.frame_indices) == 16
            frames = decode_frames(sample.video_bytes, plan.frame_indices, MAX_PIXELS).frames
            reply = tokenize_reply(processor, family, served_text(plan), (plan, frames))
            asked = tokenizer(turn, add_special_tokens=False)["input_ids"]
            assert asked[-1] == tokenizer.convert_tokens_to_ids("</tool_call>")
            episode.add_turn(asked, [0.0] * len(asked), "stop")
            episode.add_reply(reply.reply(torch.zeros(int(reply.video_grid_thw.prod()) // 4, 1)))
        last_text = f"<think>{trace['final_reasoning']}</think>\n<answer>{trace['answer']}</answer><|im_end|>"
        last = tokenizer(last_text, add_special_tokens=False)["input_ids"]
        episode.add_turn(last, [0.0] * len(last), "stop")
        length = int(batch["attention_mask"][row].sum())
        ids = batch["input_ids"][row, :length]
        assert ids.tolist() == layout.token_ids.tolist() + episode.token_ids
        assert torch.equal(positions[:, row, :length], episode.positions())
        # Trained: the model's turns (each request closes one); read: the prompt and the replies.
        trained = batch["labels"][row, :length] != IGNORE_INDEX
        assert trained[len(layout) :].tolist() == episode.sampled and not trained[: len(layout)].any()
    # Each segment: 16 frames 1 s apart in temporal patches of 2 (2 s each).
    seconds = batch["target_second_per_grid_ts"].tolist()
    assert [t for t, owner in zip(seconds, owners, strict=True) if owner >= 0] == [2.0] * (
        len(owners) - len(samples)
    )


def test_sft_trains_on_trace_rows(collated: dict) -> None:
    module = SFTModule(str(collated["model_dir"]))
    module.configure_model()
    batch = collated["batch"]
    loss = module.token_mean_loss(batch)
    assert torch.isfinite(loss)
    # The replies' frames are read: other frames in the segments change the loss of the last turns.
    blank = dict(batch, target_pixel_values_videos=batch["target_pixel_values_videos"].clone())
    grids = batch["target_video_grid_thw"]
    offsets = [0, *grids.prod(dim=-1).cumsum(0).tolist()]
    for video, owner in enumerate(segment_rows(collated["samples"])):
        if owner >= 0:
            blank["target_pixel_values_videos"][offsets[video] : offsets[video + 1]] = 0
    assert abs(float(module.token_mean_loss(blank)) - float(loss)) > 1e-4


def test_a_trace_the_tool_cannot_serve_falls_back_with_a_warning(
    collated: dict, caplog: pytest.LogCaptureFixture
) -> None:
    sample = collated["samples"][0]
    extra = dict(sample.row.extra, tool_trace=dict(sample.row.extra["tool_trace"], turns=["<tool_call>{"]))
    broken = dataclasses.replace(sample, row=dataclasses.replace(sample.row, extra=extra))
    collator = VideoQACollator(
        collated["processor"], family=collated["family"], tool_traces=ToolTraces(MAX_PIXELS, 28)
    )
    with caplog.at_level(logging.WARNING):
        batch = collator([broken])
    assert "cannot be served" in caplog.text and sample.key in caplog.text
    assert "target_pixel_values_videos" not in batch  # only the prompt's video: the direct target
    target = batch["input_ids"][0][batch["labels"][0] != IGNORE_INDEX]
    assert collated["processor"].tokenizer.decode(target).startswith("<think>The blue stretch runs")


def test_a_trace_the_budget_refuses_is_not_taught(collated: dict, caplog: pytest.LogCaptureFixture) -> None:
    # A trace of two requests against a budget of one call: the rollout would refuse the second
    # request, so the trace is not taught (its direct target is).
    samples = [s for s in collated["samples"] if len(trace_turns(s.row.extra["tool_trace"])) == 2]
    one_call = ToolTraces(MAX_PIXELS, 28, FrameBudget(max_calls=1))
    collator = VideoQACollator(collated["processor"], family=collated["family"], tool_traces=one_call)
    with caplog.at_level(logging.WARNING):
        batch = collator(samples[:1])
    assert "cannot be served" in caplog.text and "at most 1 requests" in caplog.text
    assert "target_pixel_values_videos" not in batch


def zoom_samples(config: ZoomConfig, split: str, tmp_path: Path, family_model_dir) -> tuple[Any, Any, list]:
    """Two zoom samples of ``split`` rendered with ``config``, read back with their videos'
    bytes, and the Qwen3-VL processor and family that collate them."""
    out = tmp_path / "zoom"
    write_shards(encoded_samples(config, split, 2, encode=zoom_sample), out, split)
    model_dir = family_model_dir("qwen3_vl")
    stream = VideoQAStream(
        resolve_shards(str(out / f"{split}-*.tar")),
        num_frames=16,
        max_pixels=MAX_PIXELS,
        keep_video_bytes=True,
    )
    return AutoProcessor.from_pretrained(model_dir), family_of(load_model(model_dir).config), list(stream)


def test_a_given_first_turn_is_in_the_row_but_not_trained(tmp_path: Path, family_model_dir) -> None:
    # The oracle-crop baseline: the right request comes with the question; SFT teaches the reading.
    processor, family, samples = zoom_samples(
        ZoomConfig(trace_requests="oracle"), "val", tmp_path, family_model_dir
    )
    settings = ToolTraces(MAX_PIXELS, 32, given_first_turn=True)
    given = VideoQACollator(processor, family=family, tool_traces=settings)(samples)
    taught = VideoQACollator(processor, family=family, tool_traces=ToolTraces(MAX_PIXELS, 32))(samples)
    assert torch.equal(given["input_ids"], taught["input_ids"])  # the same rows
    tokenizer = processor.tokenizer
    for row, sample in enumerate(samples):
        (turn,) = trace_turns(sample.row.extra["tool_trace"])
        assert given["meta"][row]["given_turn"] == turn and taught["meta"][row]["given_turn"] is None
        start = len(given["prompts"][row])
        asked = len(tokenizer(turn, add_special_tokens=False)["input_ids"])
        assert (taught["labels"][row, start : start + asked] != IGNORE_INDEX).all()
        assert (given["labels"][row, start : start + asked] == IGNORE_INDEX).all()
        # What follows the reply (the reading and the answer) is trained in both.
        assert torch.equal(
            given["labels"][row, start + asked :] != IGNORE_INDEX,
            taught["labels"][row, start + asked :] != IGNORE_INDEX,
        )


def test_a_trace_marked_given_has_its_first_turn_untrained_but_episodes_start_from_the_question(
    tmp_path: Path, family_model_dir
) -> None:
    # The mixed recipe (lvrl data zoom --given-oracle-share): the mark teaches reading the right
    # stretch in CoT-SFT without the request; an episode of that row still asks on its own.
    mixed = ZoomConfig(given_oracle_share=1.0)
    processor, family, samples = zoom_samples(mixed, "train", tmp_path, family_model_dir)
    batch = VideoQACollator(processor, family=family, tool_traces=ToolTraces(MAX_PIXELS, 32))(samples)
    tokenizer = processor.tokenizer
    for row, sample in enumerate(samples):
        (turn,) = trace_turns(sample.row.extra["tool_trace"])
        assert sample.row.extra["tool_trace"]["first_turn_given"] is True
        assert batch["meta"][row]["given_turn"] is None
        start = len(batch["prompts"][row])
        asked = len(tokenizer(turn, add_special_tokens=False)["input_ids"])
        assert (batch["labels"][row, start : start + asked] == IGNORE_INDEX).all()
        reading = batch["labels"][row, start + asked :]
        taught = tokenizer.decode(reading[reading != IGNORE_INDEX])
        assert taught.startswith("<think>These frames are the blue stretch.") and "<answer>" in taught


def test_a_given_request_needs_tool_use() -> None:
    from datamodules.longvideo_reason import LongVideoReasonDataModule

    with pytest.raises(ValueError, match=r"tool_given_request .* needs tool_use: true"):
        LongVideoReasonDataModule(train_shards="x.tar", processor_path="p", tool_given_request=True)
