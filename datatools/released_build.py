"""Building WebDataset shards from the released LongVideo-Reason JSONL and video files (``lvrl data build``).

Every row of the JSONL file (every line holding more than JSON whitespace:
:mod:`datatools.jsonl_rows`) ends up in exactly one place: a shard (its original video bytes
plus the normalised JSON with the probed duration and frame rate) or the rejects file
``{split}-rejects.jsonl`` (line, id, video, reason code, message). Nothing in a line can stop
the build. Rows are checked in file order: the line's bytes and JSON
(:func:`~datatools.jsonl_rows.decode_line`), the row itself and its text lengths
(:func:`~datatools.released.normalise_released_row`), a repeated ``problem_id`` (the first
occurrence wins), the video path (confined to the videos root: :func:`datatools.ingest.locate_video`),
the video file (a supported container, decodable at ``probe_frames`` frames spread from the
first to the last, not longer than ``max_video_seconds``: :func:`datatools.video_probe.probe_video`).
Probing runs in worker processes; shards are written in input order, so the output does not
depend on the number of workers. Shard keys are a pure function of the id
(:func:`datatools.ingest.sample_key`).

A build is resumable: after each completed shard ``{split}-build-state.json`` records the
first input line not yet in a complete shard; a re-run with the same inputs drops the
unfinished shard and continues from there (the text checks of the earlier lines run again, so
a later repeat of an earlier id is still a duplicate, and the output is byte-identical to an
uninterrupted build). ``dataset.json`` gets the split's shards and the build statistics
(counts per category, problem type and container, video durations, rejects per reason) when
the split is complete.

``BuildSettings.source_format`` picks what the input file is: the released LongVideo-Reason
JSONL (the default, as above) or the annotation file of a long-video benchmark
(:mod:`datatools.benchmarks`). For a benchmark a row is one of its questions and its "line" (in
the rejects file, the build state and ``source_line``) is the question's record number
(:attr:`datatools.benchmarks.Record.number`: the JSONL line or JSON-list position of its entry;
for LVBench, the question's count over the file); everything after the row is checked is the same.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from datamodules.rows import QARow
from datamodules.video import VideoDecodeError, VideoInfo
from datatools.annotation_files import AnnotationFileError
from datatools.benchmarks import FORMATS, LONGVIDEO_REASON, LVBENCH, benchmark_records
from datatools.ingest import downloaded_videos, locate_video, sample_key
from datatools.jsonl_rows import Line, decode_line, read_lines
from datatools.progress import progress_bar
from datatools.released import (
    DUPLICATE_ID,
    MISSING_VIDEO,
    REJECT_REASONS,
    UNDECODABLE,
    VIDEO_TOO_LONG,
    RowRejected,
    TextLimits,
    normalise_released_row,
)
from datatools.shard_writer import MANIFEST_NAME, ShardWriter, split_entry
from datatools.video_probe import DEFAULT_PROBE_FRAMES, VideoTooLong, probe_video
from datatools.worker_pool import worker_pool

ALL_REJECT_REASONS = REJECT_REASONS
STATE_SUFFIX = "-build-state.json"
REJECTS_SUFFIX = "-rejects.jsonl"
SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""A split name: a safe file-name component (it prefixes the shard and rejects file names)."""
DEFAULT_MAX_VIDEO_SECONDS = 4 * 3600.0
DEFAULT_MAX_VIDEO_BYTES = 4_000_000_000
"""A video is read whole into memory to go into its shard: this bounds the builder's memory."""
_MESSAGE_CHARS = 300


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
    limits: TextLimits = field(default_factory=TextLimits)
    allow_outside_root: bool = False
    """Accept video paths that resolve outside ``videos_root`` (absolute ones included)."""
    probe_frames: int = DEFAULT_PROBE_FRAMES
    max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS
    max_video_bytes: int = DEFAULT_MAX_VIDEO_BYTES
    source_format: str = LONGVIDEO_REASON
    """What ``jsonl`` holds: one of :data:`datatools.benchmarks.FORMATS`."""

    def fingerprint(self) -> dict[str, Any]:
        """What must not change between an interrupted build and its resumption."""
        stat = self.jsonl.stat()
        # The format is recorded only when it is not the default, so that the state of a
        # LongVideo-Reason build started before formats existed still resumes.
        chosen = {} if self.source_format == LONGVIDEO_REASON else {"format": self.source_format}
        return {
            **chosen,
            "jsonl": str(self.jsonl.resolve()),
            "jsonl_size": stat.st_size,
            "jsonl_mtime_ns": stat.st_mtime_ns,
            "videos_root": str(self.videos_root.resolve()),
            "max_bytes_per_shard": self.max_bytes_per_shard,
            "max_samples_per_shard": self.max_samples_per_shard,
            "limits": asdict(self.limits),
            "allow_outside_root": self.allow_outside_root,
            "probe_frames": self.probe_frames,
            "max_video_seconds": self.max_video_seconds,
            "max_video_bytes": self.max_video_bytes,
        }


def _printable(text: Any) -> str | None:
    """A string as the rejects file can hold it (valid UTF-8, at most a few hundred characters)."""
    if not isinstance(text, str):
        return None
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS] + "..."


@dataclass(frozen=True)
class Reject:
    """A row not written, and why (the id and video as the row gave them, if strings)."""

    line: int
    reason: str
    message: str
    problem_id: str | None = None
    video: str | None = None

    @classmethod
    def of(cls, line: int, reason: str, message: str, problem_id: Any = None, video: Any = None) -> Reject:
        return cls(line, reason, _printable(message) or "", _printable(problem_id), _printable(video))


@dataclass(frozen=True)
class Candidate:
    """A row that passed the text and path checks; its video still has to be probed."""

    line: int
    row: QARow
    key: str
    path: Path
    """The video file, resolved."""
    extension: str
    probe_frames: int
    max_video_seconds: float


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


def _checked_row(line: Line, limits: TextLimits) -> QARow | Reject:
    """The row of one line, or why it is rejected: a pure function of the line's bytes."""
    try:
        obj = decode_line(line, limits.line_bytes)
    except RowRejected as err:
        return Reject.of(line.number, err.reason, str(err))
    problem_id = obj.get("problem_id") if isinstance(obj, dict) else None
    video = obj.get("videos") if isinstance(obj, dict) else None
    try:
        return normalise_released_row(obj, limits)
    except RowRejected as err:
        return Reject.of(line.number, err.reason, str(err), problem_id, video)


def _checked_rows(settings: BuildSettings) -> Iterator[tuple[int, QARow | Reject]]:
    """Every row of the input file with its line (record) number: normalised, or why not."""
    if settings.source_format == LONGVIDEO_REASON:
        for line in read_lines(settings.jsonl, settings.limits.line_bytes):
            yield line.number, _checked_row(line, settings.limits)
        return
    for record in benchmark_records(settings.jsonl, settings.source_format, settings.limits):
        if record.row is not None:
            yield record.number, record.row
        else:
            error = record.error
            assert error is not None  # a record holds a row or its rejection
            yield (
                record.number,
                Reject.of(record.number, error.reason, str(error), record.problem_id, record.video),
            )


def read_rows(settings: BuildSettings, from_line: int = 1) -> Iterator[Candidate | Reject]:
    """Every row from line ``from_line`` on as a :class:`Candidate` or a :class:`Reject`, in file order.

    A repeated id is not decided here: the first row of an id that is *written* keeps it
    (:class:`WrittenKeys`), so a good row is not lost to an earlier one with the same id that
    was rejected (its video missing, say).
    """
    videos_root = settings.videos_root.resolve()
    # LVBench's download names videos by number, their YouTube ids in sidecar files.
    downloaded = downloaded_videos(videos_root) if settings.source_format == LVBENCH else {}
    for number, outcome in _checked_rows(settings):
        if number < from_line:  # already in a shard or the rejects file
            continue
        if isinstance(outcome, Reject):
            yield outcome
            continue
        row = outcome
        key = sample_key(row.problem_id)
        name = row.video
        if Path(name).stem in downloaded and not (videos_root / name).exists():
            name = downloaded[Path(name).stem]
        try:
            path = locate_video(
                videos_root,
                name,
                allow_outside_root=settings.allow_outside_root,
                max_bytes=settings.max_video_bytes,
            )
        except RowRejected as err:
            yield Reject.of(number, err.reason, str(err), row.problem_id, row.video)
            continue
        extension = path.suffix.lower().lstrip(".")  # the file found (its name may differ in case)
        yield Candidate(number, row, key, path, extension, settings.probe_frames, settings.max_video_seconds)


def probe(item: Candidate | Reject) -> Accepted | Reject:
    """Probe a candidate's video (runs in a worker process); a reject passes through.

    Any failure of the decoder on one file rejects that row only (``undecodable``).
    """
    if isinstance(item, Reject):
        return item
    problem_id, video = item.row.problem_id, item.row.video
    try:
        info = probe_video(item.path, item.probe_frames, max_seconds=item.max_video_seconds)
    except VideoTooLong as err:
        return Reject.of(item.line, VIDEO_TOO_LONG, str(err), problem_id, video)
    except VideoDecodeError as err:
        return Reject.of(item.line, UNDECODABLE, str(err), problem_id, video)
    except Exception as err:  # an exotic file can raise anything inside PyAV; it is still one row
        return Reject.of(item.line, UNDECODABLE, f"{type(err).__name__}: {err}", problem_id, video)
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


def _json_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The records of a rejects file we wrote, with their text; a line cut short by a kill (after
    the last state update, so past the resume line) is dropped."""
    records = []
    # Split on "\n" only: a message may hold U+2028 or U+0085, which str.splitlines splits on.
    for text in path.read_bytes().decode("utf-8", "replace").split("\n"):
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("line"), int):
            records.append((text, record))
    return records


class WrittenKeys:
    """The shard keys written so far (read back from the finished shards on a resumption): a row
    whose key is taken is a ``duplicate_id``, however its own checks went."""

    def __init__(self, shards: list[Path], unit: str) -> None:
        self.unit = unit
        self.first: dict[str, tuple[int, str]] = {}  # key -> (line, problem id) of its written row
        for shard in shards:
            with tarfile.open(shard) as tar:
                for member in tar:
                    if member.name.endswith(".json") and (handle := tar.extractfile(member)) is not None:
                        row = json.loads(handle.read())
                        self.first[member.name.removesuffix(".json")] = (
                            int(row["source_line"]),
                            str(row["problem_id"]),
                        )

    def claim(self, candidate: Candidate) -> Reject | None:
        """None if ``candidate`` may be written (its key is now taken), else its rejection."""
        key, row = candidate.key, candidate.row
        if key not in self.first:
            self.first[key] = (candidate.line, row.problem_id)
            return None
        first_line, first_id = self.first[key]
        message = (
            f"problem_id also on {self.unit} {first_line}"
            if first_id == row.problem_id
            else f"shard key {key} also belongs to the id on {self.unit} {first_line}"
        )
        return Reject.of(candidate.line, DUPLICATE_ID, message, row.problem_id, row.video)


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
            try:
                saved = json.loads(self.path.read_text(encoding="utf-8"))
                saved_fingerprint, next_line = saved["fingerprint"], int(saved["next_line"])
                shards, complete = [str(name) for name in saved["shards"]], bool(saved["complete"])
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise BuildError(
                    f"cannot read the build state {self.path} ({err}); pass --overwrite to start again"
                ) from err
            if saved_fingerprint != self.fingerprint:
                # Over both sets of keys: a key only one side has (the format) is a difference too.
                keys = [*self.fingerprint, *(k for k in saved_fingerprint if k not in self.fingerprint)]
                changed = [k for k in keys if saved_fingerprint.get(k) != self.fingerprint.get(k)]
                raise BuildError(
                    f"{settings.out} holds a build of split {settings.split!r} from other inputs or limits "
                    f"({', '.join(changed)} differ); pass --overwrite to start again or choose another --out"
                )
            self.next_line, self.shards, self.complete = next_line, shards, complete
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
            kept = [line for line in _json_lines(self.rejects_path) if line[1]["line"] < self.next_line]
            self.rejects_path.write_text("".join(f"{text}\n" for text, _ in kept), encoding="utf-8")

    def save(self, next_line: int, pending_rejects: list[Reject], new_shard: str | None) -> None:
        """Record that every line before ``next_line`` is in a complete shard or the rejects file."""
        with self.rejects_path.open("a", encoding="utf-8") as out:
            for reject in pending_rejects:
                out.write(json.dumps(asdict(reject), ensure_ascii=False, allow_nan=False) + "\n")
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
        return [reject for _, reject in _json_lines(self.rejects_path)]


def _count_rows(settings: BuildSettings, before_line: int | None = None) -> int:
    """Rows of the JSONL file as :func:`read_rows` sees them (only those before ``before_line``, if given)."""
    if settings.source_format == LONGVIDEO_REASON:  # lines are rows: no need to normalise them
        lines = read_lines(settings.jsonl, settings.limits.line_bytes)
        numbers: Iterator[int] = (line.number for line in lines)
    else:
        records = benchmark_records(settings.jsonl, settings.source_format, settings.limits)
        numbers = (record.number for record in records)
    return sum(1 for number in numbers if before_line is None or number < before_line)


def _outcomes(settings: BuildSettings, items: Iterator[Candidate | Reject]) -> Iterator[Accepted | Reject]:
    if settings.workers == 1:
        yield from map(probe, items)
        return
    with worker_pool(settings.workers) as pool:
        yield from pool.imap(probe, items, chunksize=1)


def _check_settings(settings: BuildSettings) -> None:
    """Refuse, with one line saying what to change, settings the build cannot run with."""
    if not SPLIT_NAME.fullmatch(settings.split):
        raise BuildError(
            f"split {settings.split[:80]!r} is not a safe file-name part: use 1-64 of A-Z a-z 0-9 _ - "
            "(not starting with _ or -)"
        )
    if settings.source_format not in FORMATS:
        raise BuildError(f"format {settings.source_format[:80]!r} is not one of {', '.join(FORMATS)}")
    if not settings.jsonl.is_file() or not os.access(settings.jsonl, os.R_OK):
        what = "JSONL" if settings.source_format == LONGVIDEO_REASON else "annotation"
        raise BuildError(f"no readable {what} file {settings.jsonl}")
    if settings.source_format != LONGVIDEO_REASON:
        try:  # a file that is not entries at all (Parquet, a broken JSON list) stops here, before any output
            _count_rows(settings)
        except AnnotationFileError as err:
            raise BuildError(str(err)) from err
    if not settings.videos_root.is_dir():
        raise BuildError(f"no videos folder {settings.videos_root}")
    if settings.workers < 1:
        raise BuildError(f"workers={settings.workers} must be at least 1")
    if settings.probe_frames < 0:
        raise BuildError(f"probe_frames={settings.probe_frames} must be 0 or more")
    if not settings.max_video_seconds > 0 or settings.max_video_bytes < 1:
        raise BuildError("max_video_seconds and max_video_bytes must be positive")
    if settings.out.exists() and not settings.out.is_dir():
        raise BuildError(f"--out {settings.out} is a file, not a folder")
    try:
        settings.out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BuildError(f"cannot create the output folder {settings.out}: {err.strerror}") from err
    if not os.access(settings.out, os.W_OK | os.X_OK):
        raise BuildError(f"the output folder {settings.out} is not writable")


def build_shards(settings: BuildSettings, *, overwrite: bool = False, progress: bool = True) -> BuildReport:
    """Convert one released JSONL split into shards, a rejects file and its ``dataset.json`` entry."""
    _check_settings(settings)
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
    bar = progress_bar(
        total=_count_rows(settings),
        initial=_count_rows(settings, before_line=state.next_line),
        desc=f"build {settings.split}",
        unit="row",
        enabled=progress,
    )
    counts = Counter[str]()
    unit = "line" if settings.source_format == LONGVIDEO_REASON else "record"
    written = WrittenKeys([settings.out / name for name in state.shards], unit)
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
            elif (duplicate := written.claim(outcome.candidate)) is not None:
                pending.append(duplicate)
                counts["rejected"] += 1
            else:
                candidate = outcome.candidate
                try:
                    video = candidate.path.read_bytes()
                except OSError as err:  # removed or made unreadable since it was probed
                    row, message = candidate.row, f"cannot read {candidate.row.video[:200]}: {err.strerror}"
                    reject = Reject.of(candidate.line, MISSING_VIDEO, message, row.problem_id, row.video)
                    pending.append(reject)
                    counts["rejected"] += 1
                    bar.update(1)
                    continue
                counts["written"] += 1
                current_line = candidate.line
                writer.write(candidate.key, video, sample_json(outcome), candidate.extension)
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
    rows_in_file = _count_rows(settings)
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
        "format": settings.source_format,
        "videos_root": str(settings.videos_root),
        "rows": report.rows,
        "rejected": report.rejected,
        "rejects_file": f"{settings.split}{REJECTS_SUFFIX}",
        **report.stats,
    }
    manifest.setdefault("splits", {})[settings.split] = entry
    _write_json_atomically(path, manifest)
