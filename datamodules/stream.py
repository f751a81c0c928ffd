"""Streaming video QA samples out of WebDataset shards.

Shards are split first by **data-parallel** rank (sequence-parallel peers, which work on the
same sample, get the same shards), then by dataloader worker. Every sample that cannot be
used (a malformed JSON row, a missing member, a corrupt or truncated video) is skipped with
a warning naming its shard and key, and counted in a :class:`SkipCounter` shared with the
main process, so that the trainer can log how much data was lost.

Every sample carries its place in the stream: ``(epoch, worker, position)``, the position
counting the raw samples that worker read in that epoch (after shuffling, rejected ones
included). The stream is a pure function of (shards, seed, epoch, rank, worker), so a resumed
run that skips, per worker, the positions already trained on continues with exactly the samples
an uninterrupted run would have seen next (:meth:`VideoQAStream.resume_from`); skipped samples
are not decoded.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import random
from collections.abc import Callable, Iterator, Sequence
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
    epoch: int = 0
    worker: int = 0
    """Dataloader worker that read the sample (0 without workers)."""
    position: int = 0
    """Index of the sample among the raw samples its worker read this epoch."""


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
        self._resume: tuple[int, dict[int, int]] | None = None

    def resume_from(self, epoch: int, next_positions: dict[int, int]) -> None:
        """In ``epoch``, let worker ``w`` start at raw position ``next_positions[w]`` (the rest: 0)."""
        self._resume = (epoch, dict(next_positions))

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
        worker = get_worker_info()
        worker_id = worker.id if worker else 0
        skip = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            skip = self._resume[1].get(worker_id, 0)
        urls = ({"url": shard} for shard in self._my_shards())
        raw_samples: Iterator[dict[str, Any]] = wds.tarfile_to_samples(handler=self._on_tar_error)(urls)
        if self.shuffle and self.shuffle_buffer > 1:
            raw_samples = self._shuffled(raw_samples)
        for position, raw in enumerate(raw_samples):
            if position < skip:  # trained on before the resume: not decoded again
                continue
            sample = self._decode(raw)
            if sample is not None:
                sample.epoch, sample.worker, sample.position = self.epoch, worker_id, position
                yield sample


class EpochAwareDataLoader(torch.utils.data.DataLoader):
    """A DataLoader that tells its :class:`VideoQAStream` the epoch before each pass.

    Lightning only forwards the epoch to samplers, which iterable datasets cannot have. The
    epoch of each pass comes from ``epoch_fn`` (called once per pass; by default the passes are
    counted), and ``on_exhausted(epoch)`` is called when a pass has been read to its end, so
    that the datamodule knows, at a checkpoint, whether the epoch it is in was finished.
    """

    def __init__(
        self,
        dataset: VideoQAStream,
        *,
        epoch_fn: Callable[[], int] | None = None,
        on_exhausted: Callable[[int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self._epoch_fn = epoch_fn
        self._on_exhausted = on_exhausted
        self._passes = 0

    def __iter__(self):  # type: ignore[override]
        epoch = int(self._epoch_fn()) if self._epoch_fn is not None else self._passes
        self.dataset.set_epoch(epoch)  # type: ignore[attr-defined]
        self._passes += 1
        iterator = super().__iter__()
        if self._on_exhausted is None:
            return iterator
        return self._watched(iterator, epoch)

    def _watched(self, iterator: Iterator[Any], epoch: int) -> Iterator[Any]:
        yield from iterator
        assert self._on_exhausted is not None
        self._on_exhausted(epoch)
