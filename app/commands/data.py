"""Build datasets: WebDataset shards from the released LongVideo-Reason files, or the synthetic task.

``lvrl data build --jsonl train.jsonl --videos-root videos/ --out shards/ --split train``
converts released rows (see :mod:`datatools.released_build`), and with ``--format videomme``
(``longvideobench``, ``mlvu``, ``lvbench``) a benchmark's annotation file
(:mod:`datatools.benchmarks`); ``lvrl data synth --out data/synth``
writes ``train-*.tar``, ``val-*.tar``, ``test-*.tar`` of the synthetic task. Both write
``<key>.<video>`` + ``<key>.json`` per sample and a ``dataset.json`` manifest.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from datatools.benchmarks import FORMATS, LONGVIDEO_REASON
from datatools.progress import progress_bar
from datatools.released import TextLimits
from datatools.released_build import (
    DEFAULT_MAX_VIDEO_SECONDS,
    SPLIT_NAME,
    BuildError,
    BuildSettings,
    build_shards,
)
from datatools.shard_writer import MANIFEST_NAME, shard_brace_pattern, write_manifest, write_shards
from datatools.synthetic import SPLITS, SynthConfig, encode_sample, encoded_samples, released_row
from datatools.video_probe import DEFAULT_PROBE_FRAMES
from datatools.zoom_task import LISTED_TIMES, TRACE_REQUESTS, ZoomConfig
from datatools.zoom_task import encode_sample as zoom_sample


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from err
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from err
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _split_name(text: str) -> str:
    if not SPLIT_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a safe file-name part: "
            "use 1-64 of A-Z a-z 0-9 _ - (not starting with _ or -)"
        )
    return text


_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def _byte_size(text: str) -> int:
    """``"1GB"``, ``"500MB"``, ``"2.5G"``, ``"1000000"`` as a number of bytes (powers of 1,000)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?B?)\s*", text.upper())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 1GB, 500MB or 1000000")
    number, unit = match.groups()
    unit = unit if unit.endswith("B") or not unit else unit + "B"
    value = int(float(number) * _SIZE_UNITS[unit])
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size")
    return value


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``data`` sub-commands to ``parser``."""
    commands = parser.add_subparsers(dest="data_command", required=True)
    _register_build(commands)
    defaults = SynthConfig()
    synth = commands.add_parser(
        "synth",
        help="render the synthetic long-video QA task into WebDataset shards",
        description=(
            "Render the synthetic long-video reasoning task (coloured scenes with a white square; Temporal, "
            "Spatial, Goal and Purpose and Plot questions with CoT reasoning) into WebDataset shards "
            "OUT/{train,val,test}-NNNNN.tar plus OUT/dataset.json. Deterministic: the same options give "
            "byte-identical shards."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    synth.add_argument(
        "--out", type=Path, required=True, help="output folder for the shards and dataset.json"
    )
    synth.add_argument("--num-train", type=_non_negative_int, default=2000, help="training samples (0: skip)")
    synth.add_argument("--num-val", type=_non_negative_int, default=200, help="validation samples (0: skip)")
    synth.add_argument("--num-test", type=_non_negative_int, default=200, help="test samples (0: skip)")
    synth.add_argument("--frames", type=_positive_int, default=defaults.num_frames, help="frames per video")
    synth.add_argument("--fps", type=float, default=defaults.fps, help="frame rate of the videos")
    synth.add_argument(
        "--size",
        type=_positive_int,
        default=defaults.size,
        help="side of the square frames in pixels (even, >= 28)",
    )
    synth.add_argument(
        "--min-scenes", type=_positive_int, default=defaults.min_scenes, help="fewest scenes per video"
    )
    synth.add_argument(
        "--max-scenes",
        type=_positive_int,
        default=defaults.max_scenes,
        help="most scenes per video (at most 4: one distinct palette colour each)",
    )
    synth.add_argument(
        "--noise", type=_non_negative_int, default=defaults.noise, help="per-pixel noise amplitude"
    )
    synth.add_argument("--seed", type=_non_negative_int, default=defaults.seed, help="base random seed")
    synth.add_argument("--samples-per-shard", type=_positive_int, default=256, help="samples per tar shard")
    synth.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="processes rendering and encoding videos (output is the same)",
    )
    synth.add_argument(
        "--overwrite", action="store_true", help="replace shards and dataset.json already in --out"
    )
    synth.add_argument(
        "--released",
        action="store_true",
        help=(
            "write the released LongVideo-Reason layout instead of shards: OUT/SPLIT.jsonl (options inside "
            "'problem', '<answer>X</answer>') and OUT/videos/KEY.mp4, the input of `lvrl data build`"
        ),
    )
    synth.set_defaults(run=run_synth)
    _register_zoom(commands)


def _register_zoom(commands: argparse._SubParsersAction) -> None:
    defaults = ZoomConfig()
    zoom = commands.add_parser(
        "zoom",
        help="render the frames-on-request task (short markers a sparse overview misses) into shards",
        description=(
            "Render the synthetic zoom task: long videos cut into equal stretches, one of them blue, with "
            "one-second markers; questions ask about the markers in the blue stretch (Temporal, Goal and "
            "Purpose, Spatial, Plot). Rows carry a CoT target for dense frames and a tool-use trace that "
            "asks for stretches (extra 'tool_trace'). Shards OUT/{train,val,test}-NNNNN.tar plus "
            "OUT/dataset.json; deterministic."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    zoom.add_argument("--out", type=Path, required=True, help="output folder for the shards and dataset.json")
    zoom.add_argument("--num-train", type=_non_negative_int, default=2000, help="training samples (0: skip)")
    zoom.add_argument("--num-val", type=_non_negative_int, default=200, help="validation samples (0: skip)")
    zoom.add_argument("--num-test", type=_non_negative_int, default=200, help="test samples (0: skip)")
    zoom.add_argument("--frames", type=_positive_int, default=defaults.num_frames, help="frames per video")
    zoom.add_argument("--fps", type=_positive_float, default=defaults.fps, help="frame rate of the videos")
    zoom.add_argument("--slots", type=_positive_int, default=defaults.slots, help="equal stretches per video")
    zoom.add_argument(
        "--size", type=_positive_int, default=defaults.size, help="side of the frames in pixels"
    )
    zoom.add_argument("--seed", type=_non_negative_int, default=defaults.seed, help="base random seed")
    zoom.add_argument(
        "--listed-times",
        choices=LISTED_TIMES,
        default=defaults.listed_times,
        help="how the readings write a marker's time: clock 'mm:ss' of its frame, or patch: Qwen3-VL's "
        "'<t seconds>' timestamp of its temporal patch, copied as the prompt writes it ('35.5 seconds')",
    )
    zoom.add_argument(
        "--trace-requests",
        choices=TRACE_REQUESTS,
        default=defaults.trace_requests,
        help="where the tool traces' requests come from: random stretches (SFT teaches the syntax, a "
        "search and the reading, not where to look), or the oracle stretch",
    )
    zoom.add_argument(
        "--trace-calls",
        type=_positive_int,
        default=defaults.trace_calls,
        help="most requests of a random trace (the tool budget's max_calls must allow them)",
    )
    zoom.add_argument(
        "--given-oracle-share",
        type=float,
        default=defaults.given_oracle_share,
        help="with random traces, the share of training rows whose trace is the oracle request given "
        "with the question (not trained) and the reading of the blue stretch: reading taught without "
        "a request to imitate",
    )
    zoom.add_argument("--samples-per-shard", type=_positive_int, default=256, help="samples per tar shard")
    zoom.add_argument("--workers", type=_positive_int, default=1, help="rendering processes (same output)")
    zoom.add_argument("--overwrite", action="store_true", help="replace shards already in --out")
    zoom.set_defaults(run=run_zoom)


def _register_build(commands: argparse._SubParsersAction) -> None:
    build = commands.add_parser(
        "build",
        help="convert released LongVideo-Reason JSONL (or a benchmark's annotations) + videos into shards",
        description=(
            "Convert a released LongVideo-Reason JSONL file and its videos into WebDataset shards "
            "OUT/SPLIT-NNNNN.tar (original video bytes + normalised JSON with duration and fps). Every "
            "row (a line with more than whitespace) is written or listed with its line and reason in "
            "OUT/SPLIT-rejects.jsonl: too_long, not_utf8, malformed, not_video, no_answer, no_options, "
            "answer_not_an_option, duplicate_id, outside_root, missing_video, unsupported_container, "
            "video_too_large, undecodable, video_too_long; no line can stop the build. OUT/dataset.json "
            "gets the counts. Re-running after an interruption resumes after the last complete shard. "
            "With --format, the input is instead the annotation file of a long-video benchmark (Video-MME, "
            "LongVideoBench, MLVU, LVBench); each of its questions becomes a multiple-choice row, checked "
            "and written or rejected the same way (its 'line' is its record number)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    build.add_argument(
        "--jsonl",
        "--annotations",
        dest="jsonl",
        type=Path,
        required=True,
        help="input file: the released JSONL (one row per line), or with --format the benchmark's "
        "annotation file (a JSON list or JSONL)",
    )
    build.add_argument(
        "--format",
        dest="source_format",
        choices=FORMATS,
        default=LONGVIDEO_REASON,
        help="what the input file is: longvideo_reason (released rows); videomme (Video-MME's parquet rows "
        "as JSON/JSONL: question_id, videoID -> VIDEOID.mp4, question, options, answer, task_type); "
        "longvideobench (lvb_val.json: id, video_path, question, candidates, correct_choice, "
        "question_category); mlvu (an MLVU-Dev json/N_TASK.json: video, question, candidates, answer text, "
        "question_type); lvbench (video_info.meta.jsonl: key -> KEY.mp4, qa list with uid, question with "
        "'(A) ...' options, answer, question_type)",
    )
    build.add_argument(
        "--videos-root",
        type=Path,
        required=True,
        help="folder the rows' 'videos' file names (a benchmark's video names) are relative to; a path "
        "resolving outside it "
        "(absolute, '..', a symlink out) is rejected as outside_root",
    )
    build.add_argument(
        "--allow-outside-root",
        action="store_true",
        help="accept video paths outside --videos-root (absolute ones included)",
    )
    build.add_argument("--out", type=Path, required=True, help="output folder for shards and manifest")
    build.add_argument(
        "--split",
        type=_split_name,
        default="train",
        help="split name: shard prefix and manifest entry (A-Z a-z 0-9 _ -)",
    )
    build.add_argument(
        "--shard-size", type=_byte_size, default="1GB", help="bytes per shard at most (1GB, 500MB, ...)"
    )
    build.add_argument(
        "--samples-per-shard", type=_positive_int, default=100_000, help="samples per shard at most"
    )
    build.add_argument(
        "--workers", type=_positive_int, default=1, help="processes probing videos (output is the same)"
    )
    build.add_argument(
        "--probe-frames",
        type=_non_negative_int,
        default=DEFAULT_PROBE_FRAMES,
        help="frames decoded per video, spread from the first to the last (0-2: those two only); "
        "a video failing at one is undecodable",
    )
    limits = TextLimits()
    for flag, default, what in (
        ("--max-line-bytes", limits.line_bytes, "bytes of a JSONL line (or a JSON-list entry)"),
        ("--max-question-chars", limits.question_chars, "characters of a question (without its options)"),
        ("--max-reasoning-chars", limits.reasoning_chars, "characters of the reasoning"),
        ("--max-option-chars", limits.option_chars, "characters of each option"),
        ("--max-answer-chars", limits.answer_chars, "characters of the answer"),
    ):
        build.add_argument(flag, type=_positive_int, default=default, help=f"most {what} (longer: too_long)")
    build.add_argument(
        "--max-video-seconds",
        type=_positive_float,
        default=DEFAULT_MAX_VIDEO_SECONDS,
        help="longest video by its headers, in seconds (longer: video_too_long)",
    )
    build.add_argument(
        "--max-video-size",
        type=_byte_size,
        default="4GB",
        help="largest video file (read whole into memory for its shard; larger: video_too_large)",
    )
    build.add_argument(
        "--overwrite", action="store_true", help="delete this split's shards, rejects and state first"
    )
    build.add_argument("--no-progress", action="store_true", help="no progress bar (logs, CI)")
    build.set_defaults(run=run_build)


def run_build(args: argparse.Namespace) -> None:
    """Handler of ``lvrl data build``: convert, then print what was written and rejected."""
    settings = BuildSettings(
        jsonl=args.jsonl,
        videos_root=args.videos_root,
        out=args.out,
        split=args.split,
        max_bytes_per_shard=args.shard_size,
        max_samples_per_shard=args.samples_per_shard,
        workers=args.workers,
        limits=TextLimits(
            line_bytes=args.max_line_bytes,
            question_chars=args.max_question_chars,
            reasoning_chars=args.max_reasoning_chars,
            option_chars=args.max_option_chars,
            answer_chars=args.max_answer_chars,
        ),
        allow_outside_root=args.allow_outside_root,
        probe_frames=args.probe_frames,
        max_video_seconds=args.max_video_seconds,
        max_video_bytes=args.max_video_size,
        source_format=args.source_format,
    )
    try:
        report = build_shards(settings, overwrite=args.overwrite, progress=not args.no_progress)
    except BuildError as err:
        # One line and the usage-error status, like argparse's own errors.
        print(f"lvrl data build: error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    if report.resumed_from_line > 1:
        unit = "line" if args.source_format == LONGVIDEO_REASON else "record"
        print(f"resumed at {unit} {report.resumed_from_line}")
    hours = report.stats["duration_s"]["total_hours"]
    print(
        f"{report.split}: {report.rows} rows, {report.written} written in {len(report.shards)} shards "
        f"({hours:.2f} h of video)"
    )
    for name, counts in (
        ("category", report.stats["per_category"]),
        ("container", report.stats["per_container"]),
    ):
        print(f"  per {name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    rejected = sum(report.rejected.values())
    reasons = ", ".join(f"{reason} {count}" for reason, count in report.rejected.items())
    print(
        f"  rejected {rejected}"
        + (f": {reasons} (see {args.out / (args.split + '-rejects.jsonl')})" if rejected else "")
    )
    print(f"manifest: {args.out / MANIFEST_NAME}")


def _write_released(config: SynthConfig, counts: dict[str, int], out: Path, workers: int) -> None:
    videos = out / "videos"
    videos.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        if counts[split] == 0:
            continue
        path = out / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as jsonl:
            samples = encoded_samples(config, split, counts[split], workers=workers)
            for key, video, row in progress_bar(samples, total=counts[split], desc=split, unit="sample"):
                (videos / f"{key}.mp4").write_bytes(video)
                jsonl.write(json.dumps(released_row(row), ensure_ascii=False) + "\n")
        print(f"{split}: {counts[split]} rows -> {path} (videos in {videos})")


def _existing_outputs(out: Path) -> list[Path]:
    found = [p for split in SPLITS for p in out.glob(f"{split}-[0-9]*.tar*")]
    found += [p for split in SPLITS for p in out.glob(f"{split}.jsonl")]
    manifest = out / MANIFEST_NAME
    return sorted([*found, manifest] if manifest.exists() else found)


def _clear_outputs(out: Path, overwrite: bool, command: str) -> None:
    """Remove an earlier dataset in ``out`` when asked to, else refuse to write over it: stale
    shards from an earlier, larger run would be picked up by a ``train-*.tar`` glob."""
    existing = _existing_outputs(out)
    if existing and not overwrite:
        raise SystemExit(
            f"{command}: error: {out} already holds a dataset ({existing[0].name}, ...); "
            "pass --overwrite to replace it or choose another --out"
        )
    for path in existing:
        path.unlink()


def run_synth(args: argparse.Namespace) -> None:
    """Handler of ``lvrl data synth``: render, encode and shard every split, then write the manifest."""
    try:
        config = SynthConfig(
            num_frames=args.frames,
            fps=args.fps,
            size=args.size,
            min_scenes=args.min_scenes,
            max_scenes=args.max_scenes,
            seed=args.seed,
            noise=args.noise,
        )
    except ValueError as err:
        raise SystemExit(f"lvrl data synth: error: {err}") from err
    out: Path = args.out
    _clear_outputs(out, args.overwrite, "lvrl data synth")

    counts = {"train": args.num_train, "val": args.num_val, "test": args.num_test}
    if args.released:
        _write_released(config, counts, out, args.workers)
        return
    _write_splits(config, counts, args, encode_sample, "lvrl data synth")


def _write_splits(
    config: Any, counts: dict[str, int], args: argparse.Namespace, encode: Any, generator: str
) -> None:
    """Render every split of a synthetic task (``encode``: its ``encode_sample``) into shards in
    ``args.out``, then write the manifest."""
    out: Path = args.out
    written: dict[str, list[str]] = {}
    for split in SPLITS:
        count = counts[split]
        if count == 0:
            written[split] = []
            print(f"{split}: skipped (0 samples)")
            continue
        start = time.perf_counter()
        samples = encoded_samples(config, split, count, workers=args.workers, encode=encode)
        written[split] = write_shards(
            samples, out, split, max_samples_per_shard=args.samples_per_shard, total=count
        )
        seconds = time.perf_counter() - start
        megabytes = sum(Path(p).stat().st_size for p in written[split]) / 1e6
        pattern = out / shard_brace_pattern(split, len(written[split]))
        num_shards = len(written[split])
        shards = f"{num_shards} shard{'s' if num_shards > 1 else ''}"
        print(f"{split}: {count} samples in {shards}, {megabytes:.1f} MB, {seconds:.1f} s -> {pattern}")
    manifest = write_manifest(out, written, config.to_json(), generator=generator)
    print(f"manifest: {manifest}")


def run_zoom(args: argparse.Namespace) -> None:
    """Handler of ``lvrl data zoom``: the frames-on-request task (:mod:`datatools.zoom_task`)."""
    try:
        config = ZoomConfig(
            num_frames=args.frames,
            fps=args.fps,
            slots=args.slots,
            size=args.size,
            seed=args.seed,
            listed_times=args.listed_times,
            trace_requests=args.trace_requests,
            trace_calls=args.trace_calls,
            given_oracle_share=args.given_oracle_share,
        )
    except ValueError as err:
        raise SystemExit(f"lvrl data zoom: error: {err}") from err
    _clear_outputs(args.out, args.overwrite, "lvrl data zoom")
    counts = {"train": args.num_train, "val": args.num_val, "test": args.num_test}
    _write_splits(config, counts, args, zoom_sample, "lvrl data zoom")
