"""CI's script on a fresh clone, as CI runs it, with its record: the suite's figures in the docs
(docs/testing.md) come from the ``ci.json`` this writes.

Clones the repository at a commit into ``--work`` and runs ``.ci/run`` there (``make test``:
the virtual environment's set-up, ruff, then pytest), timed, the load sampled every 30 s, with
per-test durations (``--junitxml``) and CPU seconds (``tests/helpers/cpu_seconds.py``); then
waits 20 s and lists every process whose command line still names the clone. Writes to
``--out``: ``ci.json`` (command, commit, machine, date, conditions, passed, skipped, failed,
pytest's and the whole script's seconds, what was left behind, the suite's CPU seconds per
test and the whole script's, every process it started included: ``bench/process_usage.py``; and
the machine's pace before and after, the CPU seconds of what every ``lvrl`` process imports first:
``bench/process_costs.trainer_imports_pace``), ``junit.xml``, ``cpu.jsonl`` (each test's CPU
seconds) and the log.

Usage: python bench/suite_run.py --work /tmp/ci --out bench/results/suite [--commit REV]
       [--threads 1] [--workers 3] [--beside-other-work]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fresh_clone import (  # noqa: E402
    LoadSampler,
    clean_environment,
    fresh_clone,
    left_behind,
    machine,
    recorder_arguments,
)
from bench.process_costs import trainer_imports_pace  # noqa: E402
from bench.process_usage import run_counted  # noqa: E402

PYTEST_SUMMARY = re.compile(
    r"^=* ?((?:\d+ \w+(?:, )?)+) in ([0-9.]+)s(?: \([0-9:]+\))?(?: =+)?\s*$", re.MULTILINE
)
"""pytest's closing line, with rules (``=== 3 passed in 1.2s ===``) or without (``-q``)."""


def counts(summary: str) -> dict[str, int]:
    """``{"passed": n, "skipped": n, "failed": n, "errors": n}`` from pytest's last line
    ("1130 passed, 2 skipped", "1 failed, 3 errors"); absent words count 0."""
    found = {word.rstrip("s"): int(number) for number, word in re.findall(r"(\d+) (\w+)", summary)}
    return {
        "passed": found.get("passed", 0),
        "skipped": found.get("skipped", 0),
        "failed": found.get("failed", 0),
        "errors": found.get("error", 0),
    }


def cpu_seconds(log: Path) -> dict[str, float] | None:
    """The suite's CPU seconds from ``helpers.cpu_seconds``'s lines: in the pytest workers, in the
    commands they waited for, and in all; None where the clone has no such plugin."""
    if not log.exists():
        return None
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    own, children = (round(sum(line[key] for line in lines)) for key in ("own", "children"))
    return {"tests": own, "their_commands": children, "total": own + children}


def makefile_workers(clone: Path) -> int:
    """The clone's default pytest-xdist worker count (``TEST_WORKERS ?= N`` in its Makefile)."""
    found = re.search(r"^TEST_WORKERS \?= (\d+)$", (clone / "Makefile").read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"no 'TEST_WORKERS ?= N' in {clone / 'Makefile'}")
    return int(found.group(1))


def main() -> None:
    parser = recorder_arguments(__doc__, "ci.json, junit.xml and the log")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the run")
    parser.add_argument(
        "--workers", type=int, default=None, help="pytest-xdist workers (make's TEST_WORKERS; default 2)"
    )
    args = parser.parse_args()

    commit, clone = fresh_clone(args.commit, args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    junit = args.out.resolve() / "junit.xml"
    extra = {"PYTEST_ADDOPTS": f"--junitxml={junit}"}
    cpu_log = args.out.resolve() / "cpu.jsonl"
    cpu_log.unlink(missing_ok=True)
    if (clone / "tests" / "helpers" / "cpu_seconds.py").exists():  # commits before it lack the plugin
        extra["PYTEST_ADDOPTS"] += " -p helpers.cpu_seconds"
        extra["LVRL_TEST_CPU_LOG"] = str(cpu_log)
    if args.threads is not None:
        extra["OMP_NUM_THREADS"] = str(args.threads)
    if args.workers is not None:
        extra["TEST_WORKERS"] = str(args.workers)
    print(f"suite_run: {commit} in {clone}", flush=True)
    pace_before = trainer_imports_pace()
    with LoadSampler() as load, (args.out / "ci.log").open("w") as ci_log:
        # Counted whole: the per-test count misses every process that outlives the command that
        # started it (an lvrl run's fork server and its dataloader workers); as a subreaper this
        # process adopts those and waits for them.
        usage = run_counted(
            [".ci/run"], cwd=clone, env=clean_environment(**extra), stdout=ci_log, stderr=subprocess.STDOUT
        )
    status, seconds = usage.exit_status, round(usage.wall_seconds)
    after = left_behind(clone)
    pace_after = trainer_imports_pace()
    log = (args.out / "ci.log").read_text()
    summaries = PYTEST_SUMMARY.findall(log)
    if not summaries:
        raise SystemExit(f".ci/run printed no pytest summary (status {status}): see {args.out / 'ci.log'}")
    summary, pytest_seconds = summaries[-1]
    tests = ElementTree.parse(junit).getroot().iter("testcase") if junit.exists() else iter(())
    conditions = [f"OMP_NUM_THREADS={args.threads}" if args.threads is not None else "default threads"]
    workers = args.workers if args.workers is not None else makefile_workers(clone)
    conditions.append(load.describe(".ci/run", alone=not args.beside_other_work))
    record = {
        "command": "python " + " ".join(["bench/suite_run.py", *sys.argv[1:]]) + "  (git clone; .ci/run)",
        "commit": commit,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "conditions": "; ".join(conditions),
        "status": status,
        **counts(summary),
        "pytest_seconds": round(float(pytest_seconds)),
        "total_seconds": seconds,
        "worker_seconds": round(sum(float(case.get("time", 0)) for case in tests)),
        "workers": workers,
        "cpu_seconds": cpu_seconds(cpu_log),
        "ci_run_cpu_seconds": round(usage.cpu_seconds) if usage.orphans_left == 0 else None,
        "left_behind": after,
        "pace": {"trainer_imports_cpu_seconds": {"before": pace_before, "after": pace_after}},
    }
    (args.out / "ci.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1), flush=True)


if __name__ == "__main__":
    main()
