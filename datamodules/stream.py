"""Streaming video QA samples out of WebDataset shards.

Shards are split first by **data-parallel** rank (sequence-parallel peers, which work on the
same sample, get the same shards), then by dataloader worker. Every sample that cannot be
used (a malformed JSON row, a missing member, a corrupt or truncated video, a text over the
token limits) is skipped with a warning naming its shard, key and reason, and counted per
reason (:data:`SKIP_REASONS`) in a :class:`SkipCounter` shared with the main process, so
that the trainer can log how much data was lost and why.

Every sample carries its place in the stream: ``(epoch, worker, position)``, the position
counting the raw samples that worker read in that epoch (after shuffling, rejected ones
included). The stream is a pure function of (shards, seed, epoch, rank, worker), so a resumed
run that skips, per worker, the positions already trained on continues with exactly the samples
an uninterrupted run would have seen next (:meth:`VideoQAStream.resume_from`); skipped samples
are not decoded. Positions below that point that were read but not trained on (a batch the
trainer had fetched ahead while dynamic sampling drew later ones) are named and read again.
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

from datamodules.loader_workers import EndingSwitch
from datamodules.qwen_video import QwenVideoSettings
from datamodules.rows import MalformedRow, QARow, parse_row
from datamodules.video import PATCH_FACTOR, SampledVideo, VideoDecodeError, decode_video

log = logging.getLogger(__name__)

VIDEO_EXTENSIONS = ("mp4", "webm", "mkv", "mov", "avi")
"""Video members a sample may hold (``lvrl data build`` keeps each file's own container)."""


def data_parallel_coordinates(
    global_rank: int, world_size: int, sequence_parallel_size: int
) -> tuple[int, int]:
    """``(data_parallel_rank, data_parallel_size)`` when consecutive ranks form sequence-parallel groups.

    >>> [data_parallel_coordinates(r, 4, 2) for r in range(4)]
    [(0, 2), (0, 2), (1, 2), (1, 2)]
    """
    if sequence_parallel_size < 1 or world_size % sequence_parallel_size:
        raise ValueError(
            f"world size {world_size} is not divisible by sequence_parallel_size={sequence_parallel_size}"
        )
    return global_rank // sequence_parallel_size, world_size // sequence_parallel_size


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
    video_bytes: bytes | None = None
    """The encoded video itself, kept when tool-use rollouts decode more of it on request."""


SKIP_REASONS: tuple[str, ...] = (
    "no_json",
    "malformed_json",
    "malformed_row",
    "no_video",
    "bad_video",
    "unreadable_tar_entry",
    "prompt_too_long",
    "target_too_long",
    "unrecorded",
)
"""Why a sample was skipped; each is counted (``data/skipped/<reason>`` in the logs). ``unrecorded``:
skips restored from a checkpoint written before the reasons were counted."""


class SkipCounter:
    """Counts of rejected samples, per reason (:data:`SKIP_REASONS`), that dataloader workers add to.

    Backed by shared memory, so workers and the main process see the same numbers. Created in
    the spawn context: such a lock can be handed to spawned workers and inherited by forked
    ones (a fork-context lock cannot go to spawned workers).
    """

    def __init__(self) -> None:
        self._counts = multiprocessing.get_context("spawn").Array("q", len(SKIP_REASONS))

    def add(self, count: int = 1, reason: str = "bad_video") -> None:
        index = SKIP_REASONS.index(reason)  # an unknown reason is a bug: ValueError
        with self._counts.get_lock():
            self._counts[index] += count

    @property
    def value(self) -> int:
        """Samples skipped for any reason."""
        with self._counts.get_lock():
            return int(sum(self._counts[:]))

    def by_reason(self) -> dict[str, int]:
        """``{reason: count}`` of the reasons that occurred."""
        with self._counts.get_lock():
            counts = list(self._counts[:])
        return {reason: int(n) for reason, n in zip(SKIP_REASONS, counts, strict=True) if n}

    def restore(self, by_reason: dict[str, int]) -> None:
        """Set the counts to a saved :meth:`by_reason` (a resumed run continues its counts)."""
        with self._counts.get_lock():
            for index, reason in enumerate(SKIP_REASONS):
                self._counts[index] = int(by_reason.get(reason, 0))


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
        frame_factor: frame sides are multiples of this (the pixels one merged visual token
            covers: 28 for Qwen2/2.5-VL, 32 for Qwen3-VL), so the processor never resizes again.
        data_parallel_rank / data_parallel_size: this rank's place among data-parallel replicas.
        shuffle: shuffle shard order each epoch and samples within a buffer.
        shuffle_buffer: samples held for shuffling (0: shard order only).
        seed: base seed; the shuffle of epoch ``e`` uses ``(seed, e)``, so runs are repeatable.
        skipped: counter shared with the main process for rejected samples.
        text_lengths: ``row -> (prompt tokens, target tokens)`` of the templated text
            (:class:`datamodules.collate.TextTokenCounter`); None: text lengths unchecked.
        max_prompt_tokens: skip (``prompt_too_long``) a sample whose templated prompt has more
            text tokens than this (the video's placeholder counts as one); None: no limit.
        max_target_tokens: skip (``target_too_long``) a sample whose SFT target (reasoning and
            answer) has more tokens than this; None: no limit.
        keep_video_bytes: keep each sample's encoded video (``VideoQASample.video_bytes``), for
            tool-use rollouts that decode the frames a model asks for.
        qwen_video: sample frames and sizes as Qwen's own preprocessing does
            (:mod:`datamodules.qwen_video`), within ``num_frames`` and ``max_pixels``.

    Text limits are checked before the video is decoded, so a sample they reject costs one
    tokenisation. The video's own tokens are bounded by ``num_frames`` and ``max_pixels``.
    """

    def __init__(
        self,
        shards: Sequence[str],
        *,
        num_frames: int,
        max_pixels: int,
        frame_factor: int = PATCH_FACTOR,
        sample_fps: float | None = None,
        data_parallel_rank: int = 0,
        data_parallel_size: int = 1,
        shuffle: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        skipped: SkipCounter | None = None,
        text_lengths: Callable[[QARow], tuple[int, int]] | None = None,
        max_prompt_tokens: int | None = None,
        max_target_tokens: int | None = None,
        keep_video_bytes: bool = False,
        qwen_video: QwenVideoSettings | None = None,
    ) -> None:
        super().__init__()
        self.keep_video_bytes = keep_video_bytes
        self.qwen_video = qwen_video
        self.shards = list(shards)
        self.num_frames = num_frames
        self.max_pixels = max_pixels
        self.frame_factor = frame_factor
        self.sample_fps = sample_fps
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.skipped = skipped if skipped is not None else SkipCounter()
        self.text_lengths = text_lengths
        self.max_prompt_tokens = max_prompt_tokens
        self.max_target_tokens = max_target_tokens
        self.epoch = 0
        self._resume: tuple[int, dict[int, int], dict[int, set[int]]] | None = None

    def resume_from(
        self, epoch: int, next_positions: dict[int, int], reread: dict[int, Sequence[int]] | None = None
    ) -> None:
        """In ``epoch``, let worker ``w`` start at raw position ``next_positions[w]`` (the rest: 0),
        except for the positions ``reread[w]`` below it, which are read again."""
        again = {worker: set(positions) for worker, positions in (reread or {}).items()}
        self._resume = (epoch, dict(next_positions), again)

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

    def _reject(self, shard: str, key: str, reason: str, detail: str) -> None:
        self.skipped.add(reason=reason)
        log.warning("skipping sample %r in shard %s: %s (%s)", key, shard, reason, detail)

    def _on_tar_error(self, error: Exception) -> bool:
        # A damaged tar member: count it, say where, and keep reading the shard.
        shard = str(error.args[-1]) if error.args else "?"
        self._reject(shard, "?", "unreadable_tar_entry", f"unreadable tar entry: {error}")
        return True

    def _too_long(self, row: QARow) -> tuple[str, str] | None:
        """``(reason, detail)`` when the row's text exceeds a token limit; checked before decoding."""
        if self.text_lengths is None:
            return None
        prompt, target = self.text_lengths(row)
        if self.max_prompt_tokens is not None and prompt > self.max_prompt_tokens:
            limit = f"data.max_prompt_tokens={self.max_prompt_tokens}"
            return "prompt_too_long", f"prompt of {prompt} text tokens after templating > {limit}"
        if self.max_target_tokens is not None and target > self.max_target_tokens:
            limit = f"data.max_target_tokens={self.max_target_tokens}"
            return "target_too_long", f"reasoning + answer of {target} tokens > {limit}"
        return None

    def _decode(self, raw: dict[str, Any]) -> VideoQASample | None:
        key, shard = raw.get("__key__", "?"), raw.get("__url__", "?")
        if "json" not in raw:
            self._reject(shard, key, "no_json", "no .json member")
            return None
        try:
            row = parse_row(json.loads(raw["json"]))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            self._reject(shard, key, "malformed_json", f"malformed JSON: {err}")
            return None
        except MalformedRow as err:
            self._reject(shard, key, "malformed_row", f"malformed row: {err}")
            return None
        too_long = self._too_long(row)
        if too_long is not None:
            self._reject(shard, key, *too_long)
            return None
        video_ext = next((ext for ext in VIDEO_EXTENSIONS if ext in raw), None)
        if video_ext is None:
            looked = ", ".join(VIDEO_EXTENSIONS)
            self._reject(shard, key, "no_video", f"no video member (looked for {looked})")
            return None
        try:
            video = decode_video(
                raw[video_ext],
                self.num_frames,
                self.max_pixels,
                sample_fps=self.sample_fps,
                factor=self.frame_factor,
                qwen=self.qwen_video,
            )
        except VideoDecodeError as err:
            self._reject(shard, key, "bad_video", f"bad video: {err}")
            return None
        kept = bytes(raw[video_ext]) if self.keep_video_bytes else None
        return VideoQASample(key=key, shard=shard, row=row, video=video, video_bytes=kept)

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
        skip, again = 0, set()
        if self._resume is not None and self._resume[0] == self.epoch:
            skip, again = self._resume[1].get(worker_id, 0), self._resume[2].get(worker_id, set())
        urls = ({"url": shard} for shard in self._my_shards())
        raw_samples: Iterator[dict[str, Any]] = wds.tarfile_to_samples(handler=self._on_tar_error)(urls)
        if self.shuffle and self.shuffle_buffer > 1:
            raw_samples = self._shuffled(raw_samples)
        for position, raw in enumerate(raw_samples):
            if position < skip and position not in again:  # trained on before the resume: not decoded
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
    ``on_fetched(batch)`` sees every batch the pass hands out (to the trainer or to
    :meth:`draw`), when it is handed out.
    """

    def __init__(
        self,
        dataset: VideoQAStream,
        *,
        epoch_fn: Callable[[], int] | None = None,
        on_exhausted: Callable[[int], None] | None = None,
        on_fetched: Callable[[Any], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self._epoch_fn = epoch_fn
        self._on_exhausted = on_exhausted
        self._on_fetched = on_fetched
        self._passes = 0
        self._live: Iterator[Any] | None = None
        self._user_worker_init_fn = self.worker_init_fn

    def __iter__(self):  # type: ignore[override]
        epoch = int(self._epoch_fn()) if self._epoch_fn is not None else self._passes
        self.dataset.set_epoch(epoch)  # type: ignore[attr-defined]
        self._passes += 1
        switch = None
        if self.num_workers > 0:
            # Each pass's workers learn from their own switch when a SIGTERM is the trainer's.
            switch = EndingSwitch()
            self.worker_init_fn = switch.worker_init_fn(self._user_worker_init_fn)
        self._live = self._watched(super().__iter__(), epoch, switch)
        return self._live

    def close(self) -> None:
        """End the pass under way, if any: its workers are shut down now (a pass the trainer
        stopped reading part-way, e.g. at ``max_steps``, would otherwise keep them to the exit)."""
        live, self._live = self._live, None
        if live is not None:
            live.close()  # type: ignore[attr-defined]

    def draw(self) -> Any | None:
        """The next batch of the pass the trainer is reading (the same iterator: what is drawn
        here, the trainer does not get); None when the pass is read to its end."""
        if self._live is None:
            raise RuntimeError("draw() needs a pass under way: iterate the loader first")
        return next(self._live, None)

    def _watched(self, iterator: Iterator[Any], epoch: int, switch: EndingSwitch | None) -> Iterator[Any]:
        try:
            for batch in iterator:
                if self._on_fetched is not None:
                    self._on_fetched(batch)
                yield batch
            if self._on_exhausted is not None:
                self._on_exhausted(epoch)
        finally:
            # Read to its end, closed or collected: torch shuts the workers down as `iterator`
            # goes with this frame, ending any that outlive that with a SIGTERM of its own.
            if switch is not None:
                switch.set()
