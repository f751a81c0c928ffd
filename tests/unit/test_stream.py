"""The streaming dataset skips broken samples, names them, and counts them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from bad_shards import BROKEN_KEYS, write_shard_with_broken_samples

from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream, shards_for_rank
from datamodules.synthetic import SynthConfig


def test_broken_samples_are_skipped_named_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = tmp_path / "mixed-00000.tar"
    good_keys = write_shard_with_broken_samples(shard, SynthConfig(num_frames=20, size=56))
    stream = VideoQAStream([str(shard)], num_frames=8, max_pixels=56 * 56)
    with caplog.at_level(logging.WARNING, logger="datamodules.stream"):
        keys = [sample.key for sample in stream]
    assert keys == good_keys
    assert stream.skipped.value == len(BROKEN_KEYS)
    for key in BROKEN_KEYS:
        messages = [r.getMessage() for r in caplog.records if key in r.getMessage()]
        assert messages, f"no warning names {key}"
        assert str(shard) in messages[0]
    text = caplog.text
    assert (
        "bad video" in text
        and "malformed JSON" in text
        and "malformed row" in text
        and "no video member" in text
    )


def test_sample_contents(synth_dir: Path) -> None:
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = list(stream)
    assert len(samples) == 8
    first = samples[0]
    assert first.video.frames.shape == (8, 56, 56, 3)
    assert first.row.is_multiple_choice and len(first.row.options) == 4
    assert first.key == first.row.problem_id


def test_shards_for_rank_partitions_exactly() -> None:
    shards = [f"s{i}" for i in range(11)]
    pieces = [shards_for_rank(shards, r, 3, w, 2) for r in range(3) for w in range(2)]
    flat = [s for piece in pieces for s in piece]
    assert sorted(flat) == sorted(shards) and len(flat) == len(set(flat))
    with pytest.raises(ValueError):
        shards_for_rank(shards, 3, 3, 0, 1)
