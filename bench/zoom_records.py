"""The zoom bench's records: what each finished stage leaves that the comparison reads, kept in
the repository, so that losing the bench's working folder (a new machine starts empty) costs
only the stages that had not finished.

A stage's record is its training folder and its evaluations' folders (``sft-tool``,
``sft-tool-val``, ``sft-tool-test``, ...) less what is rebuilt or too large to keep: the
checkpoints, the HF export, wandb's files, the library log. What is kept: the config, the
attempts (command, commit, machine, date, CPU seconds of each), the ``done`` mark, the command's
own log, the CSV metrics and the predictions. Files over :data:`COMPRESS_ABOVE` bytes are
stored gzip-compressed and listed in the record's ``record.json``, so a restore gives back the
same bytes under the same names.

Layout: ``RECORDS/seed<N>/<stage>/<folder>/...``, one ``<folder>`` per working folder of the
stage. ``bench/zoom.py --records RECORDS`` writes a stage's record once the stage and its
evaluations are done, and at its start puts back the records of stages its working folder lacks,
except a stage that a later stage still has to start from (its export and checkpoints are not
kept): that one trains again, which gives the same run (every draw is seeded).
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

KEPT_FILES = ("config.yaml", "attempts.jsonl", "done", "run.log", "eval.log")
"""Top-level files of a working folder that a record keeps (``run.log``: a training stage's
command output, ``eval.log``: an evaluation's)."""
KEPT_FOLDERS = ("csv", "predictions")
"""Folders a record keeps whole: Lightning's CSV metrics and the evaluations' answers."""
COMPRESS_ABOVE = 64 * 1024
MANIFEST = "record.json"
READING_SUFFIX = ".md"
"""A record's top-level markdown files are readings written beside it after the run
(``bench/zoom_curve.py --out curve.md``): no working folder holds them, so a restore leaves them
where they are, and rewriting the record drops them with the run they read."""


def _kept(folder: Path) -> list[Path]:
    """The files of ``folder`` that its record keeps, relative to it, in a stable order."""
    files = [Path(name) for name in KEPT_FILES if (folder / name).is_file()]
    for name in KEPT_FOLDERS:
        if (folder / name).is_dir():
            files += sorted(p.relative_to(folder) for p in (folder / name).rglob("*") if p.is_file())
    return files


def keep(records: Path, seed: int, stage: str, folders: Iterable[Path]) -> Path:
    """Write the record of ``stage`` of ``seed`` from its finished working ``folders`` (the
    training folder first, then its evaluations'); an earlier record of it is replaced."""
    folders = list(folders)
    unfinished = [f for f in folders if not (f / "done").exists()]
    if unfinished:
        raise ValueError(f"only finished folders are recorded: {', '.join(map(str, unfinished))} lack 'done'")
    target = records / f"seed{seed}" / stage
    staging = target.with_name(f".{stage}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    compressed: list[str] = []
    for folder in folders:
        for relative in _kept(folder):
            source = folder / relative
            stored = Path(folder.name) / relative
            compress = source.stat().st_size > COMPRESS_ABOVE and source.suffix != ".gz"
            if compress:
                stored = stored.with_name(stored.name + ".gz")
                compressed.append(stored.as_posix())
            destination = staging / stored
            destination.parent.mkdir(parents=True, exist_ok=True)
            if compress:
                # mtime 0: the same file gives the same bytes, so a rewritten record is no change.
                with source.open("rb") as raw, gzip.GzipFile(destination, "wb", mtime=0) as packed:
                    shutil.copyfileobj(raw, packed)
            else:
                shutil.copyfile(source, destination)
    manifest = {"folders": [f.name for f in folders], "compressed": compressed}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    # Replaced whole, at once: a record is never half old and half new.
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def _is_reading(relative: Path) -> bool:
    """Whether a record's file (relative to the record) is a reading written beside it."""
    return len(relative.parts) == 1 and relative.suffix == READING_SUFFIX


def restore(records: Path, out: Path, seed: int, stage: str) -> bool:
    """Put the record of ``stage`` of ``seed`` back into ``out/seed<N>`` (replacing any partial
    working folders of it); False if there is no record or the stage is done in ``out``."""
    source = records / f"seed{seed}" / stage
    working = out / f"seed{seed}"
    if not (source / MANIFEST).exists() or (working / stage / "done").exists():
        return False
    manifest = json.loads((source / MANIFEST).read_text())
    compressed, folders = set(manifest["compressed"]), list(manifest["folders"])
    # The folders are removed and rewritten under the seed's folder: a name that is not a plain
    # folder name (an edited record) could reach outside it.
    if any(Path(name).name != name or name in (".", "..") for name in folders):
        raise ValueError(f"{source / MANIFEST}: folder names must be plain names, not {folders}")
    stored_files = sorted(
        relative
        for relative in (p.relative_to(source) for p in source.rglob("*") if p.is_file())
        if relative != Path(MANIFEST) and not _is_reading(relative)
    )
    strays = [str(relative) for relative in stored_files if relative.parts[0] not in folders]
    if strays:
        raise ValueError(f"{source}: files outside the folders its {MANIFEST} lists: {strays[:5]}")
    for name in folders:
        shutil.rmtree(working / name, ignore_errors=True)
    for relative in stored_files:
        stored = source / relative
        if relative.as_posix() in compressed:
            destination = working / relative.with_name(relative.name.removesuffix(".gz"))
            destination.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(stored, "rb") as packed, destination.open("wb") as raw:
                shutil.copyfileobj(packed, raw)
        else:
            destination = working / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(stored, destination)
    return True


def recorded(records: Path, seed: int, stage: str) -> bool:
    """Whether ``stage`` of ``seed`` has a record in ``records``."""
    return (records / f"seed{seed}" / stage / MANIFEST).exists()


def _restorable(
    records: Path, seed: int, stage: str, stages: list[str], starts_from: Mapping[str, str]
) -> bool:
    """Whether ``stage`` has a record and so has every stage run after it from its weights."""
    later = [s for s, base in starts_from.items() if base == stage and s in stages]
    return recorded(records, seed, stage) and all(
        _restorable(records, seed, s, stages, starts_from) for s in later
    )


def restore_finished(
    records: Path, out: Path, seeds: Iterable[int], stages: Iterable[str], starts_from: Mapping[str, str]
) -> list[str]:
    """Restore every recorded stage of ``seeds`` that ``out`` lacks, but not one that a stage to be
    trained again starts from (``starts_from``: stage -> the stage whose export or checkpoint it
    starts from): the record has no weights, so that one trains again too. Returns what was
    restored, as ``seed<N>/<stage>``."""
    stages = list(stages)
    restored = []
    for seed in seeds:
        for stage in stages:
            if _restorable(records, seed, stage, stages, starts_from) and restore(records, out, seed, stage):
                restored.append(f"seed{seed}/{stage}")
    return restored
