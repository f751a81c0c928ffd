"""Writing WebDataset shards (``<key>.<video>`` + ``<key>.json`` samples) and their ``dataset.json`` manifest.

A shard set is a folder of plain tar files named ``{split}-{index:05d}.tar`` plus a
``dataset.json`` manifest (split -> shard names and sample counts, and the configuration
that generated them). Tars are written with a fixed mtime and owner, so the same samples
give byte-identical shards, and each shard is written under a temporary name and renamed
when complete, so an interrupted run never leaves a truncated shard that looks finished.
Reading shards back is runtime work: :func:`datamodules.shards.resolve_shards`.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import webdataset as wds

from datatools.progress import progress_bar

MANIFEST_NAME = "dataset.json"
# Fixed tar metadata: reproducible bytes, and no leak of the writer's clock or user name.
_TAR_MTIME = 0.0
_TAR_OWNER = "lvrl"


def shard_name(split: str, index: int) -> str:
    """File name of shard ``index`` of a split.

    >>> shard_name("train", 3)
    'train-00003.tar'
    """
    return f"{split}-{index:05d}.tar"


def shard_brace_pattern(split: str, num_shards: int) -> str:
    """The brace pattern naming shards ``0 .. num_shards-1`` of a split.

    It is what :func:`datamodules.shards.resolve_shards` expands.

    >>> shard_brace_pattern("train", 8), shard_brace_pattern("val", 1)
    ('train-{00000..00007}.tar', 'val-00000.tar')
    """
    if num_shards < 1:
        raise ValueError("a split has at least one shard")
    if num_shards == 1:
        return shard_name(split, 0)
    return f"{split}-{{{0:05d}..{num_shards - 1:05d}}}.tar"


def _check_key(key: str, seen: set[str]) -> None:
    # WebDataset splits a member name at its first dot into key and extension, so a dot in
    # the key would silently break the sample into pieces.
    if not key or "." in key:
        raise ValueError(f"invalid sample key {key!r}: keys must be non-empty and contain no dot")
    if key in seen:
        raise ValueError(f"duplicate sample key {key!r}")
    seen.add(key)


class ShardWriter:
    """Writes samples into ``{out_dir}/{split}-{index:05d}.tar``, starting a new shard at a size limit.

    Each sample becomes ``<key>.<video extension>`` (the video bytes as given) and
    ``<key>.json``. A shard is written as ``<name>.partial`` and renamed when complete, so a
    crash never leaves a truncated shard under a final name; :meth:`close` (or leaving the
    ``with`` block) completes the last shard, and an exception drops it.

    Args:
        out_dir: folder for the shards (created if missing).
        split: shard name prefix, e.g. ``"train"``.
        max_samples_per_shard: samples per tar at most.
        max_bytes_per_shard: video + JSON bytes per tar at most (a single larger sample gets
            a shard of its own); ``None``: no byte limit.
        first_index: number of the first shard written (a resumed build continues numbering).
        on_shard_done: called with each completed shard's path, before the next one starts.
    """

    def __init__(
        self,
        out_dir: str | Path,
        split: str,
        *,
        max_samples_per_shard: int = 256,
        max_bytes_per_shard: int | None = None,
        first_index: int = 0,
        on_shard_done: Callable[[str], None] | None = None,
    ) -> None:
        if max_samples_per_shard < 1:
            raise ValueError(f"max_samples_per_shard={max_samples_per_shard} must be at least 1")
        if max_bytes_per_shard is not None and max_bytes_per_shard < 1:
            raise ValueError(f"max_bytes_per_shard={max_bytes_per_shard} must be positive")
        if not split or "/" in split or "." in split:
            raise ValueError(f"invalid split name {split!r}")
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.split = split
        self.max_samples = max_samples_per_shard
        self.max_bytes = max_bytes_per_shard
        self.next_index = first_index
        self.on_shard_done = on_shard_done
        self.paths: list[str] = []
        """Shards completed by this writer, in order."""
        self._seen: set[str] = set()
        self._writer: wds.TarWriter | None = None
        self._partial = self._final = Path()
        self._samples = self._bytes = 0

    def write(self, key: str, video: bytes, row: Mapping[str, Any], video_extension: str = "mp4") -> None:
        """Add one sample; ``key`` must be unique and contain no dot."""
        _check_key(key, self._seen)
        # We encode ourselves (the TarWriter's encoder is off): the JSON bytes are exactly ours.
        # Standard JSON only: a NaN or Infinity would be unreadable for other JSON parsers.
        row_bytes = json.dumps(row, ensure_ascii=False, allow_nan=False).encode("utf-8")
        size = len(video) + len(row_bytes)
        if self._writer is not None and (
            self._samples >= self.max_samples
            or (self.max_bytes is not None and self._bytes + size > self.max_bytes)
        ):
            self._finish_shard()
        if self._writer is None:
            self._final = self.out / shard_name(self.split, self.next_index)
            self._partial = self._final.with_name(self._final.name + ".partial")
            self._writer = wds.TarWriter(
                str(self._partial), user=_TAR_OWNER, group=_TAR_OWNER, mtime=_TAR_MTIME, encoder=False
            )
        self._writer.write({"__key__": key, video_extension: bytes(video), "json": row_bytes})
        self._samples += 1
        self._bytes += size

    def _finish_shard(self) -> None:
        assert self._writer is not None
        self._writer.close()
        self._writer = None
        os.replace(self._partial, self._final)
        self.paths.append(str(self._final))
        self.next_index += 1
        self._samples = self._bytes = 0
        if self.on_shard_done is not None:
            self.on_shard_done(str(self._final))

    def close(self) -> None:
        """Complete the shard being written (if any)."""
        if self._writer is not None:
            self._finish_shard()

    def abort(self) -> None:
        """Drop the shard being written (an interrupted build resumes from the last complete one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._partial.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_shards(
    samples: Iterable[tuple[str, bytes, Mapping[str, Any]]],
    out_dir: str | Path,
    split: str,
    *,
    max_samples_per_shard: int = 256,
    video_extension: str = "mp4",
    total: int | None = None,
    progress: bool = True,
) -> list[str]:
    """Write ``(key, video bytes, JSON row)`` samples into ``{out_dir}/{split}-{index:05d}.tar``.

    A :class:`ShardWriter` with a sample-count limit; no samples, no shard.

    Args:
        samples: ``(key, video_bytes, row)``; keys must be unique and contain no dot.
        out_dir: folder for the shards (created if missing).
        split: shard name prefix, e.g. ``"train"``.
        max_samples_per_shard: samples per tar file.
        video_extension: extension of the video member (``mp4``, ``webm``, ``mkv``).
        total: number of samples, for the progress bar only.
        progress: show a tqdm progress bar over samples.

    Returns:
        The paths of the written shards, in order.
    """
    with ShardWriter(out_dir, split, max_samples_per_shard=max_samples_per_shard) as writer:
        samples = progress_bar(samples, total=total, desc=split, unit="sample", enabled=progress)
        for key, video, row in samples:
            writer.write(key, video, row, video_extension)
    return writer.paths


def count_samples(shard: str | Path) -> int:
    """Samples in a tar shard, counted from its ``.json`` members (reads headers only)."""
    with tarfile.open(shard) as tar:
        return sum(1 for member in tar if member.name.endswith(".json"))


def split_entry(split: str, shards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The manifest entry of a split from its shards' ``{"name", "num_samples", ...}`` records:
    the total, the records, and the brace pattern when the names are ``split-00000..`` in order."""
    entry: dict[str, Any] = {"num_samples": sum(s["num_samples"] for s in shards), "shards": list(shards)}
    if shards and [s["name"] for s in shards] == [shard_name(split, i) for i in range(len(shards))]:
        entry["pattern"] = shard_brace_pattern(split, len(shards))
    return entry


def write_manifest(
    out_dir: str | Path, splits: Mapping[str, Sequence[str]], config: Mapping[str, Any], **info: Any
) -> Path:
    """Write ``{out_dir}/dataset.json``: per split its shard names (relative) and sample counts.

    Args:
        out_dir: the shard folder.
        splits: split name -> shard paths (as returned by :func:`write_shards`).
        config: the generation configuration, stored verbatim.
        info: further top-level fields (e.g. ``generator``).
    """
    out = Path(out_dir)
    manifest: dict[str, Any] = {**info, "config": dict(config), "splits": {}}
    for split, paths in splits.items():
        shards = [{"name": Path(p).name, "num_samples": count_samples(p)} for p in paths]
        manifest["splits"][split] = split_entry(split, shards)
    path = out / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path
