"""`make demo` on a fresh clone, as a user runs it, with its record: the figures of the demo's
README table come from the ``run.json`` and ``accuracy.md`` this writes.

Clones the repository at a commit into ``--work``, runs ``make setup`` and ``make demo`` there
(each timed; the load sampled every 30 s), then waits 20 s and lists every process whose command
line still names the clone. Writes to ``--out``: ``run.json`` (command, commit, machine, date,
load, seconds per part, what was left behind), ``accuracy.md`` (the table the demo printed),
``grpo_reward.png``, and the demo's output as ``demo.log``.

Usage: python bench/demo_run.py --work /tmp/demo --out bench/results/demo/NAME [--commit REV]
       [--family qwen3_vl]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluation.provenance import REPO_ROOT, cpu_model  # noqa: E402

FINISHED = re.compile(r"demo finished in (\d+) s \(SFT \+ eval (\d+) s, GRPO \+ eval (\d+) s\)")
SETTLE_SECONDS = 20
"""Wait after the demo before looking for its processes: torch joins loader workers for up to 5 s
and the resource tracker ends after its last user."""


class LoadSampler:
    """The 1-minute load average every ``every`` seconds, on a thread, until stopped."""

    def __init__(self, every: float = 30.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def describe(self, alone: bool) -> str:
        if not self.samples:
            return "not sampled (under 30 s)"
        where = "the demo alone on the machine" if alone else "the demo beside other work"
        return (
            f"{where}: 1-minute load average median {statistics.median(self.samples):.2f}, max "
            f"{max(self.samples):.2f} ({len(self.samples)} samples, one per 30 s)"
        )


def timed(command: list[str], cwd: Path, log: Path, env: dict[str, str]) -> int:
    """Run ``command`` with its output to ``log``; its wall seconds. A failure stops the record."""
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed with status {code}: see {log}")
    return round(time.monotonic() - started)


def left_behind(clone: Path) -> list[str]:
    """Processes whose command line names the clone (this script's own excluded)."""
    listing = subprocess.run(["ps", "-eo", "pid,etime,args"], capture_output=True, text=True).stdout
    return [line.strip() for line in listing.splitlines()[1:] if str(clone) in line and "ps -eo" not in line]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--work", type=Path, required=True, help="folder for the clone (emptied first)")
    parser.add_argument("--out", type=Path, required=True, help="folder for run.json and the table")
    parser.add_argument("--commit", default="HEAD", help="the commit to clone (default: HEAD)")
    parser.add_argument("--family", default=None, help="FAMILY for make demo (default: the demo's own)")
    parser.add_argument("--beside-other-work", action="store_true", help="say the machine was shared")
    args = parser.parse_args()

    revision = ["git", "rev-parse", "--short", args.commit]
    resolved = subprocess.run(revision, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    commit = resolved.stdout.strip()
    clone = args.work.resolve() / "clone"
    shutil.rmtree(clone, ignore_errors=True)
    clone.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    if args.family:
        env["FAMILY"] = args.family
    print(f"demo_run: {commit} in {clone}", flush=True)
    setup = timed(["make", "setup"], clone, args.out / "setup.log", env)
    with LoadSampler() as load:
        demo = timed(["make", "demo"], clone, args.out / "demo.log", env)
    time.sleep(SETTLE_SECONDS)
    alive = left_behind(clone)
    output = (args.out / "demo.log").read_text()
    finished = FINISHED.search(output)
    if finished is None:
        raise SystemExit(f"make demo printed no 'demo finished in' line: see {args.out / 'demo.log'}")
    run_dir = clone / "runs" / "demo"
    shutil.copy(run_dir / "accuracy.md", args.out / "accuracy.md")
    shutil.copy(run_dir / "grpo_reward.png", args.out / "grpo_reward.png")
    record = {
        "command": "python "
        + " ".join(["bench/demo_run.py", *sys.argv[1:]])
        + "  (git clone; make setup; make demo)",
        "commit": commit,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
            "gpu": None,
        },
        "date": time.strftime("%Y-%m-%d"),
        "family": args.family or "qwen2_5_vl",
        "load": load.describe(alone=not args.beside_other_work),
        "wall_seconds": {
            "setup": setup,
            "demo": demo,
            "sft_and_evaluation": int(finished.group(2)),
            "grpo_and_evaluation": int(finished.group(3)),
        },
        "left_behind": (
            f"no process of the clone alive {SETTLE_SECONDS} s after make demo ended (ps)"
            if not alive
            else f"{len(alive)} process(es) of the clone alive {SETTLE_SECONDS} s after: " + "; ".join(alive)
        ),
        "table": "accuracy.md",
        "plot": "grpo_reward.png",
    }
    (args.out / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    print((args.out / "accuracy.md").read_text(), flush=True)
    print(f"demo_run: {demo} s; {record['left_behind']}", flush=True)


if __name__ == "__main__":
    main()
