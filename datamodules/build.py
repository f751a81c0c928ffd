"""Building WebDataset shards from the released LongVideo-Reason JSONL and video files (``lvrl data build``).

Every JSONL row ends up in exactly one place: a shard (its original video bytes plus the
normalised JSON with the probed duration and frame rate) or the rejects file
``{split}-rejects.jsonl`` (line, id, video, reason code, message). Rows are checked in file
order: the row itself (:func:`datamodules.released.normalise_released_row`), a repeated
``problem_id`` (the first occurrence wins), the video file (present, a supported container,
decodable from its first to its last frame: :func:`datamodules.video.probe_video`). Probing
runs in worker processes; shards are written in input order, so the output does not depend
on the number of workers.

A build is resumable: after each completed shard ``{split}-build-state.json`` records the
first input line not yet in a complete shard; a re-run with the same inputs drops the
unfinished shard and continues from there. ``dataset.json`` gets the split's shards and the
build statistics (counts per category, problem type and container, video durations, rejects
per reason) when the split is complete.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import statistics
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from hashlib import sha1
from pathlib import Path
from typing import Any

from tqdm import tqdm

from datamodules.released import (
    DUPLICATE_ID,
    MALFORMED,
    MISSING_VIDEO,
    REJECT_REASONS,
    UNDECODABLE,
    RowRejected,
    normalise_released_row,
)
from datamodules.rows import QARow
from datamodules.shards import MANIFEST_NAME, ShardWriter, split_entry
from datamodules.stream import VIDEO_EXTENSIONS
from datamodules.video import VideoDecodeError, VideoInfo, probe_video

UNSUPPORTED_CONTAINER = "unsupported_container"
ALL_REJECT_REASONS = (*REJECT_REASONS, UNSUPPORTED_CONTAINER)
STATE_SUFFIX = "-build-state.json"
REJECTS_SUFFIX = "-rejects.jsonl"


class BuildError(RuntimeError):
    """The build cannot start or go on (the message says what to change)."""


@dataclass(frozen=True)
class BuildSettings:
    """Inputs and limits of one ``lvrl data build`` run (one split)."""

    jsonl: Path
    videos_root: Path
    out: Path
    split: str = "train"
    max_bytes_per_shard: int = 1_000_000_000
    max_samples_per_shard: int = 100_000
    workers: int = 1

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between an interrupted build and its resumption."""
        stat = self.jsonl.stat()
        return {
            "jsonl": str(self.jsonl.resolve()),
            "jsonl_size": stat.st_size,
            "jsonl_mtime_ns": stat.st_mtime_ns,
            "videos_root": str(self.videos_root.resolve()),
            "max_bytes_per_shard": self.max_bytes_per_shard,
            "max_samples_per_shard": self.max_samples_per_shard,
        }


@dataclass(frozen=True)
class Reject:
    """A row not written, and why."""

    line: int
    reason: str
    message: str
    problem_id: str | None = None
    video: str | None = None


@dataclass(frozen=True)
class Candidate:
    """A row that passed the text checks; its video still has to be probed."""

    line: int
    row: QARow
    key: str
    path: Path


@dataclass(frozen=True)
class Accepted:
    candidate: Candidate
    info: VideoInfo


@dataclass
class BuildReport:
    """What a build did: the numbers ``lvrl data build`` prints and ``dataset.json`` keeps."""

    split: str
    rows: int
    written: int
    rejected: dict[str, int]
    shards: list[str]
    stats: dict[str, Any] = field(default_factory=dict)
    resumed_from_line: int = 1


def _sample_key(problem_id: str, used: dict[str, str]) -> str:
    # WebDataset keys cannot hold dots (the first dot starts the extension) and go into tar
    # member names: keep [A-Za-z0-9_-], and disambiguate two ids that clean to the same key.
    key = re.sub(r"[^A-Za-z0-9_-]", "_", problem_id)[:120] or "row"
    if used.get(key, problem_id) != problem_id:
        key = f"{key}-{sha1(problem_id.encode()).hexdigest()[:10]}"
    used[key] = problem_id
    return key


def read_rows(settings: BuildSettings, from_line: int = 1) -> Iterator[Candidate | Reject]:
    """Every non-blank JSONL line from ``from_line`` on as a :class:`Candidate` or a :class:`Reject`,
    in file order (earlier lines are read only for their ids: a later repeat is still a duplicate)."""
    seen_ids: dict[str, int] = {}
    keys: dict[str, str] = {}
    with settings.jsonl.open(encoding="utf-8") as lines:
        for line_number, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as err:
                yield Reject(line_number, MALFORMED, f"not JSON ({err})")
                continue
            problem_id = obj.get("problem_id") if isinstance(obj, dict) else None
            video = obj.get("videos") if isinstance(obj, dict) else None
            problem_id = str(problem_id) if problem_id is not None else None
            video = str(video) if video is not None else None
            try:
                row = normalise_released_row(obj)
            except RowRejected as err:
                yield Reject(line_number, err.reason, str(err), problem_id, video)
                continue
            if row.problem_id in seen_ids:
                first = seen_ids[row.problem_id]
                yield Reject(line_number, DUPLICATE_ID, f"problem_id also on line {first}", problem_id, video)
                continue
            seen_ids[row.problem_id] = line_number
            if line_number < from_line:  # already in a shard or the rejects file
                continue
            path = settings.videos_root / row.video
            if not path.is_file():
                yield Reject(line_number, MISSING_VIDEO, f"no file {path}", problem_id, video)
                continue
            if path.suffix.lower().lstrip(".") not in VIDEO_EXTENSIONS:
                message = f"{path.name}: not one of {', '.join(VIDEO_EXTENSIONS)}"
                yield Reject(line_number, UNSUPPORTED_CONTAINER, message, problem_id, video)
                continue
            yield Candidate(line_number, row, _sample_key(row.problem_id, keys), path)


def probe(item: Candidate | Reject) -> Accepted | Reject:
    """Probe a candidate's video (runs in a worker process); a reject passes through."""
    if isinstance(item, Reject):
        return item
    try:
        info = probe_video(item.path)
    except VideoDecodeError as err:
        return Reject(item.line, UNDECODABLE, str(err), item.row.problem_id, item.row.video)
    return Accepted(item, info)


def sample_json(accepted: Accepted) -> dict[str, Any]:
    """The normalised row as stored in the shard, with what probing found out about the video."""
    info = accepted.info
    return {
        **accepted.candidate.row.to_json(),
        "duration": round(info.duration, 3),
        "fps": info.fps,
        "num_frames": info.num_frames,
        "width": info.width,
        "height": info.height,
        "codec": info.codec,
        "source_line": accepted.candidate.line,
    }


def _write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


class _BuildState:
    """The resume record ``{split}-build-state.json`` and the rejects file kept in step with it."""

    def __init__(self, settings: BuildSettings, overwrite: bool) -> None:
        self.settings = settings
        self.path = settings.out / f"{settings.split}{STATE_SUFFIX}"
        self.rejects_path = settings.out / f"{settings.split}{REJECTS_SUFFIX}"
        self.fingerprint = settings.fingerprint()
        self.next_line = 1
        self.shards: list[str] = []
        self.complete = False
        existing = sorted(settings.out.glob(f"{settings.split}-[0-9]*.tar*"))
        if overwrite:
            for path in [*existing, self.path, self.rejects_path]:
                path.unlink(missing_ok=True)
            return
        if self.path.exists():
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            if saved["fingerprint"] != self.fingerprint:
                changed = [k for k, v in self.fingerprint.items() if saved["fingerprint"].get(k) != v]
                raise BuildError(
                    f"{settings.out} holds a build of split {settings.split!r} from other inputs or limits "
                    f"({', '.join(changed)} differ); pass --overwrite to start again or choose another --out"
                )
            self.next_line, self.shards, self.complete = (
                saved["next_line"],
                saved["shards"],
                saved["complete"],
            )
            self._drop_unfinished(existing)
        elif existing:
            raise BuildError(
                f"{settings.out} already holds {existing[0].name} (no build state to resume from); "
                "pass --overwrite to replace the split or choose another --out"
            )

    def _drop_unfinished(self, existing: list[Path]) -> None:
        # Shards past the last recorded one were written after the last state update (or are
        # partial): they are rewritten, and so are rejects from the lines they covered.
        for path in existing:
            if path.name not in self.shards:
                path.unlink()
        if self.rejects_path.exists():
            kept = [
                line
                for line in self.rejects_path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line)["line"] < self.next_line
            ]
            self.rejects_path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")

    def save(self, next_line: int, pending_rejects: list[Reject], new_shard: str | None) -> None:
        """Record that every line before ``next_line`` is in a complete shard or the rejects file."""
        with self.rejects_path.open("a", encoding="utf-8") as out:
            for reject in pending_rejects:
                out.write(json.dumps(asdict(reject), ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
        pending_rejects.clear()
        if new_shard is not None:
            self.shards.append(Path(new_shard).name)
        self.next_line = next_line
        payload = {
            "fingerprint": self.fingerprint,
            "next_line": self.next_line,
            "shards": self.shards,
            "complete": self.complete,
        }
        _write_json_atomically(self.path, payload)

    def rejects(self) -> list[dict[str, Any]]:
        if not self.rejects_path.exists():
            return []
        text = self.rejects_path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _count_rows(path: Path, before_line: int | None = None) -> int:
    """Non-blank lines of a JSONL file (those before ``before_line`` only, if given)."""
    with path.open(encoding="utf-8") as lines:
        return sum(
            1
            for number, text in enumerate(lines, start=1)
            if text.strip() and (before_line is None or number < before_line)
        )


def _outcomes(settings: BuildSettings, items: Iterator[Candidate | Reject]) -> Iterator[Accepted | Reject]:
    if settings.workers == 1:
        yield from map(probe, items)
        return
    # spawn: workers start clean (no inherited threads or open files of the parent).
    with multiprocessing.get_context("spawn").Pool(settings.workers) as pool:
        yield from pool.imap(probe, items, chunksize=1)


def build_shards(settings: BuildSettings, *, overwrite: bool = False, progress: bool = True) -> BuildReport:
    """Convert one released JSONL split into shards, a rejects file and its ``dataset.json`` entry."""
    if not settings.jsonl.is_file():
        raise BuildError(f"no JSONL file {settings.jsonl}")
    if not settings.videos_root.is_dir():
        raise BuildError(f"no videos folder {settings.videos_root}")
    if settings.workers < 1:
        raise BuildError(f"workers={settings.workers} must be at least 1")
    settings.out.mkdir(parents=True, exist_ok=True)
    state = _BuildState(settings, overwrite)
    resumed_from = state.next_line
    if not state.complete:
        _convert(settings, state, progress)
    return _finish(settings, state, resumed_from)


def _convert(settings: BuildSettings, state: _BuildState, progress: bool) -> None:
    pending: list[Reject] = []
    current_line = state.next_line

    def on_shard_done(path: str) -> None:
        # Called while the sample of `current_line` is being added, before it is written.
        state.save(current_line, pending, path)

    items = (item for item in read_rows(settings, state.next_line) if item.line >= state.next_line)
    bar = tqdm(
        total=_count_rows(settings.jsonl),
        initial=_count_rows(settings.jsonl, before_line=state.next_line),
        desc=f"build {settings.split}",
        unit="row",
        disable=not progress,
    )
    counts = Counter[str]()
    writer = ShardWriter(
        settings.out,
        settings.split,
        max_samples_per_shard=settings.max_samples_per_shard,
        max_bytes_per_shard=settings.max_bytes_per_shard,
        first_index=len(state.shards),
        on_shard_done=on_shard_done,
    )
    with writer, bar:
        for outcome in _outcomes(settings, items):
            if isinstance(outcome, Reject):
                pending.append(outcome)
                counts["rejected"] += 1
            else:
                counts["written"] += 1
                current_line = outcome.candidate.line
                extension = outcome.candidate.path.suffix.lower().lstrip(".")
                writer.write(
                    outcome.candidate.key,
                    outcome.candidate.path.read_bytes(),
                    sample_json(outcome),
                    extension,
                )
            bar.update(1)
            bar.set_postfix(counts, refresh=False)
        current_line = 1 << 62  # the last shard covers every remaining line
    state.complete = True
    state.save(current_line, pending, None)


def _split_statistics(shards: list[Path]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-shard entries for the manifest, and the split's counts and durations (read from the shards)."""
    entries: list[dict[str, Any]] = []
    categories: Counter[str] = Counter()
    problem_types: Counter[str] = Counter()
    containers: Counter[str] = Counter()
    durations: list[float] = []
    for shard in shards:
        in_shard = 0
        with tarfile.open(shard) as tar:
            for member in tar:
                extension = member.name.split(".", 1)[-1]
                if extension != "json":
                    containers[extension] += 1
                    continue
                handle = tar.extractfile(member)
                assert handle is not None
                row = json.loads(handle.read())
                in_shard += 1
                categories[row.get("category") or "none"] += 1
                problem_types[row["problem_type"]] += 1
                durations.append(float(row["duration"]))
        entries.append({"name": shard.name, "num_samples": in_shard, "bytes": shard.stat().st_size})
    hours = sum(durations) / 3600
    return entries, {
        "num_samples": len(durations),
        "per_category": dict(sorted(categories.items())),
        "per_problem_type": dict(sorted(problem_types.items())),
        "per_container": dict(sorted(containers.items())),
        "duration_s": {
            "total_hours": round(hours, 3),
            "min": min(durations, default=0.0),
            "median": statistics.median(durations) if durations else 0.0,
            "max": max(durations, default=0.0),
        },
    }


def _finish(settings: BuildSettings, state: _BuildState, resumed_from: int) -> BuildReport:
    shards = [settings.out / name for name in state.shards]
    rejects = state.rejects()
    rejected = Counter(r["reason"] for r in rejects)
    shard_entries, stats = _split_statistics(shards)
    written = stats.pop("num_samples")
    report = BuildReport(
        split=settings.split,
        rows=written + len(rejects),
        written=written,
        rejected={reason: rejected[reason] for reason in ALL_REJECT_REASONS if rejected[reason]},
        shards=[str(p) for p in shards],
        stats=stats,
        resumed_from_line=resumed_from,
    )
    rows_in_file = _count_rows(settings.jsonl)
    if report.rows != rows_in_file:  # every row is written or rejected, nothing else
        raise BuildError(
            f"{report.written} written + {len(rejects)} rejected != {rows_in_file} rows in {settings.jsonl}"
        )
    _update_manifest(settings, report, shard_entries)
    return report


def _update_manifest(
    settings: BuildSettings, report: BuildReport, shard_entries: list[dict[str, Any]]
) -> None:
    # Other splits built into the same folder keep their entries.
    path = settings.out / MANIFEST_NAME
    manifest = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    manifest["generator"] = "lvrl data build"
    entry = split_entry(settings.split, shard_entries)
    entry["build"] = {
        "jsonl": str(settings.jsonl),
        "videos_root": str(settings.videos_root),
        "rows": report.rows,
        "rejected": report.rejected,
        "rejects_file": f"{settings.split}{REJECTS_SUFFIX}",
        **report.stats,
    }
    manifest.setdefault("splits", {})[settings.split] = entry
    _write_json_atomically(path, manifest)
