"""Streaming video QA samples out of WebDataset shards.

Shards are split first by **data-parallel** rank (sequence-parallel peers, which work on the
same sample, get the same shards), then by dataloader worker. Every sample that cannot be
used (a malformed JSON row, a missing member, a corrupt or truncated video) is skipped with
a warning naming its shard and key, and counted in a :class:`SkipCounter` shared with the
main process, so that the trainer can log how much data was lost.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import webdataset as wds
from torch.utils.data import IterableDataset, get_worker_info

from datamodules.rows import MalformedRow, QARow, parse_row
from datamodules.video import SampledVideo, VideoDecodeError, decode_video

log = logging.getLogger(__name__)

VIDEO_EXTENSIONS = ("mp4", "webm", "mkv", "mov", "avi")
"""Video members a sample may hold (``lvrl data build`` keeps each file's own container)."""


@dataclass
class VideoQASample:
    """One decoded sample: the QA row and its sampled frames."""

    key: str
    shard: str
    row: QARow
    video: SampledVideo


class SkipCounter:
    """A count of rejected samples that dataloader worker processes add to.

    Backed by shared memory, so workers and the main process see one number. Created in the
    spawn context: such a lock can be handed to spawned workers and inherited by forked ones
    (a fork-context lock cannot go to spawned workers).
    """

    def __init__(self) -> None:
        self._value = multiprocessing.get_context("spawn").Value("q", 0)

    def add(self, count: int = 1) -> None:
        with self._value.get_lock():
            self._value.value += count

    @property
    def value(self) -> int:
        return int(self._value.value)


def shards_for_rank(
    shards: Sequence[str], data_parallel_rank: int, data_parallel_size: int, worker_id: int, num_workers: int
) -> list[str]:
    """The shards one (data-parallel rank, worker) pair reads: a strided slice, rank first.

    >>> shards_for_rank([f"s{i}" for i in range(8)], 1, 2, 0, 2)
    ['s1', 's5']
    """
    if not 0 <= data_parallel_rank < data_parallel_size:
        raise ValueError(f"data-parallel rank {data_parallel_rank} outside [0, {data_parallel_size})")
    mine = list(shards)[data_parallel_rank::data_parallel_size]
    return mine[worker_id::num_workers]


class VideoQAStream(IterableDataset):
    """Iterates :class:`VideoQASample` from shards for one data-parallel rank.

    Args:
        shards: shard paths (already resolved; see :func:`datamodules.shards.resolve_shards`).
        num_frames: frames sampled uniformly over each video (the cap when ``sample_fps`` is set).
        sample_fps: sample this many frames per second of video instead, up to ``num_frames``.
        max_pixels: per-frame pixel budget; frames are resized to fit it while decoding.
        data_parallel_rank / data_parallel_size: this rank's place among data-parallel replicas.
        shuffle: shuffle shard order each epoch and samples within a buffer.
        shuffle_buffer: samples held for shuffling (0: shard order only).
        seed: base seed; the shuffle of epoch ``e`` uses ``(seed, e)``, so runs are repeatable.
        skipped: counter shared with the main process for rejected samples.
    """

    def __init__(
        self,
        shards: Sequence[str],
        *,
        num_frames: int,
        max_pixels: int,
        sample_fps: float | None = None,
        data_parallel_rank: int = 0,
        data_parallel_size: int = 1,
        shuffle: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        skipped: SkipCounter | None = None,
    ) -> None:
        super().__init__()
        self.shards = list(shards)
        self.num_frames = num_frames
        self.max_pixels = max_pixels
        self.sample_fps = sample_fps
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.skipped = skipped if skipped is not None else SkipCounter()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _my_shards(self) -> list[str]:
        shards = list(self.shards)
        if self.shuffle:
            random.Random(f"{self.seed}-{self.epoch}").shuffle(shards)
        worker = get_worker_info()
        worker_id, num_workers = (worker.id, worker.num_workers) if worker else (0, 1)
        return shards_for_rank(
            shards, self.data_parallel_rank, self.data_parallel_size, worker_id, num_workers
        )

    def _reject(self, shard: str, key: str, reason: str) -> None:
        self.skipped.add()
        log.warning("skipping sample %r in shard %s: %s", key, shard, reason)

    def _on_tar_error(self, error: Exception) -> bool:
        # A damaged tar member: count it, say where, and keep reading the shard.
        self._reject(str(error.args[-1]) if error.args else "?", "?", f"unreadable tar entry ({error})")
        return True

    def _decode(self, raw: dict[str, Any]) -> VideoQASample | None:
        key, shard = raw.get("__key__", "?"), raw.get("__url__", "?")
        if "json" not in raw:
            self._reject(shard, key, "no .json member")
            return None
        try:
            row = parse_row(json.loads(raw["json"]))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            self._reject(shard, key, f"malformed JSON ({err})")
            return None
        except MalformedRow as err:
            self._reject(shard, key, f"malformed row ({err})")
            return None
        video_ext = next((ext for ext in VIDEO_EXTENSIONS if ext in raw), None)
        if video_ext is None:
            self._reject(shard, key, f"no video member (looked for {', '.join(VIDEO_EXTENSIONS)})")
            return None
        try:
            video = decode_video(raw[video_ext], self.num_frames, self.max_pixels, sample_fps=self.sample_fps)
        except VideoDecodeError as err:
            self._reject(shard, key, f"bad video ({err})")
            return None
        return VideoQASample(key=key, shard=shard, row=row, video=video)

    def _shuffled(self, samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        worker = get_worker_info()
        rng = random.Random(
            f"{self.seed}-{self.epoch}-{self.data_parallel_rank}-{worker.id if worker else 0}"
        )
        buffer: list[dict[str, Any]] = []
        for sample in samples:
            buffer.append(sample)
            if len(buffer) >= self.shuffle_buffer:
                yield buffer.pop(rng.randrange(len(buffer)))
        rng.shuffle(buffer)
        yield from buffer

    def __iter__(self) -> Iterator[VideoQASample]:
        urls = ({"url": shard} for shard in self._my_shards())
        raw_samples: Iterator[dict[str, Any]] = wds.tarfile_to_samples(handler=self._on_tar_error)(urls)
        if self.shuffle and self.shuffle_buffer > 1:
            raw_samples = self._shuffled(raw_samples)
        for raw in raw_samples:
            sample = self._decode(raw)
            if sample is not None:
                yield sample


class EpochAwareDataLoader(torch.utils.data.DataLoader):
    """A DataLoader that tells its :class:`VideoQAStream` the epoch before each pass.

    Lightning only forwards the epoch to samplers, which iterable datasets cannot have; the
    epoch is read from a callable (the trainer's ``current_epoch``) so that a resumed run
    shuffles exactly like an uninterrupted one.
    """

    def __init__(self, dataset: VideoQAStream, *, epoch_fn: Any = None, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self._epoch_fn = epoch_fn
        self._passes = 0

    def __iter__(self):  # type: ignore[override]
        epoch = self._epoch_fn() if self._epoch_fn is not None else self._passes
        self.dataset.set_epoch(int(epoch))  # type: ignore[attr-defined]
        self._passes += 1
        return super().__iter__()
