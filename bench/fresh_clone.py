"""What the fresh-clone recorders share (``bench/demo_run.py``, ``bench/suite_run.py``): a clone
of this repository at a commit, the load sampled while a command runs, a command timed with its
output to a log, and the processes of the clone still alive after it."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

from evaluation.provenance import REPO_ROOT, cpu_model

SETTLE_SECONDS = 20
"""Wait after a command before looking for its processes: torch joins loader workers for up to
5 s and the resource tracker ends after its last user."""


def recorder_arguments(doc: str, writes: str) -> argparse.ArgumentParser:
    """A recorder's command line: ``--work`` (the clone's folder), ``--out`` (for ``writes``),
    ``--commit`` and ``--beside-other-work``; the recorder adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="folder for the clone (emptied first)")
    parser.add_argument("--out", type=Path, required=True, help=f"folder for {writes}")
    parser.add_argument("--commit", default="HEAD", help="the commit to clone (default: HEAD)")
    parser.add_argument("--beside-other-work", action="store_true", help="say the machine was shared")
    return parser


def fresh_clone(commit: str, work: Path) -> tuple[str, Path]:
    """``(short commit, clone)``: this repository cloned into ``work/clone`` (emptied first) and
    checked out at ``commit``."""
    revision = ["git", "rev-parse", "--short", commit]
    resolved = subprocess.run(revision, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    short = resolved.stdout.strip()
    clone = work.resolve() / "clone"
    shutil.rmtree(clone, ignore_errors=True)
    clone.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", short], cwd=clone, check=True)
    return short, clone


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without a virtual environment's or this checkout's paths."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, **extra}


def cpu_times() -> tuple[int, int]:
    """``(busy, total)`` jiffies of all CPUs since boot (/proc/stat; idle and iowait are not busy)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - fields[3] - fields[4], total


class LoadSampler:
    """The 1-minute load average every ``every`` seconds, on a thread, until stopped, and the
    machine's CPU busy fraction over the whole span."""

    def __init__(self, every: float = 30.0) -> None:
        self.samples: list[float] = []
        self.every = every
        self.busy_fraction: float | None = None
        self._start = (0, 0)  # read when the span starts (__enter__)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))

    def __enter__(self) -> LoadSampler:
        self._start = cpu_times()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        busy, total = (end - start for end, start in zip(cpu_times(), self._start, strict=True))
        self.busy_fraction = busy / total if total else None

    def describe(self, what: str, alone: bool) -> str:
        if not self.samples:
            return f"not sampled (under {self.every:g} s)"
        where = f"{what} alone on the machine" if alone else f"{what} beside other work"
        return (
            f"{where}: 1-minute load average median {statistics.median(self.samples):.2f}, max "
            f"{max(self.samples):.2f} ({len(self.samples)} samples, one per {self.every:g} s)"
            + (f", CPU busy {self.busy_fraction:.0%} of the time" if self.busy_fraction is not None else "")
        )


def timed(command: list[str], cwd: Path, log: Path, env: dict[str, str]) -> int:
    """The wall seconds of ``command``, run with its output to ``log``; a failure stops the record."""
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed with status {code}: see {log}")
    return round(time.monotonic() - started)


def left_behind(clone: Path) -> str:
    """What of the clone is still running :data:`SETTLE_SECONDS` after a command (a sentence)."""
    time.sleep(SETTLE_SECONDS)
    listing = subprocess.run(["ps", "-eo", "pid,etime,args"], capture_output=True, text=True).stdout
    alive = [line.strip() for line in listing.splitlines()[1:] if str(clone) in line and "ps -eo" not in line]
    if not alive:
        return f"no process of the clone alive {SETTLE_SECONDS} s after it ended (ps)"
    return f"{len(alive)} process(es) of the clone alive {SETTLE_SECONDS} s after it ended: " + "; ".join(
        alive
    )


def machine() -> dict[str, object]:
    """The machine a record was made on (no GPU: these recorders run CPU commands)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "memory_gib": round(memory / 2**30), "gpu": None}
