"""The fresh-clone recorders (``bench/suite_run.py``, ``bench/demo_run.py``) read their figures
from what the commands printed: pytest's summary line and the demo's closing line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench import demo_run, fresh_clone, suite_run


def test_pytest_summaries_are_read_whatever_they_hold() -> None:
    log = "....\n===== 1130 passed, 2 skipped, 3 warnings in 743.21s (0:12:23) =====\n"
    ((summary, seconds),) = suite_run.PYTEST_SUMMARY.findall(log)
    assert seconds == "743.21"
    assert suite_run.counts(summary) == {"passed": 1130, "skipped": 2, "failed": 0, "errors": 0}
    assert suite_run.counts("1 failed, 1128 passed, 1 error") == {
        "passed": 1128,
        "skipped": 0,
        "failed": 1,
        "errors": 1,
    }
    assert suite_run.counts("3 errors") == {"passed": 0, "skipped": 0, "failed": 0, "errors": 3}
    assert suite_run.PYTEST_SUMMARY.findall("..   [100%]\n1130 passed, 2 skipped in 743.21s (0:12:23)\n") == [
        ("1130 passed, 2 skipped", "743.21")
    ]  # -q's line has no rules
    assert not suite_run.PYTEST_SUMMARY.findall("reading the 12 shards in 3.5s\n")


def test_the_demo_s_closing_line_gives_its_parts() -> None:
    line = "demo finished in 1011 s (SFT + eval 267 s, GRPO + eval 744 s)"
    assert demo_run.FINISHED.search(f"...\n{line}\n").groups() == ("1011", "267", "744")


def test_a_clone_with_nothing_left_running_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fresh_clone, "SETTLE_SECONDS", 0)
    assert fresh_clone.left_behind(tmp_path / "never-run") == (
        "no process of the clone alive 0 s after it ended (ps)"
    )


def test_each_test_s_cpu_seconds_are_recorded_and_totalled(pytester, monkeypatch) -> None:
    # A test that computes for a while in its own process, and one that waits for a command that
    # does: each line charges the work where it was done.
    pytester.makepyfile(
        test_work="""
        import subprocess, sys, time

        def busy(seconds):
            end = time.process_time() + seconds
            while time.process_time() < end:
                pass

        def test_own():
            busy(0.3)

        def test_command():
            code = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"
            subprocess.run([sys.executable, "-c", code], check=True)
        """
    )
    log = pytester.path / "cpu.jsonl"
    monkeypatch.setenv("LVRL_TEST_CPU_LOG", str(log))
    pytester.runpytest_inprocess("-p", "helpers.cpu_seconds", "-p", "no:cacheprovider").assert_outcomes(
        passed=2
    )
    own, command = (json.loads(line) for line in log.read_text().splitlines())
    assert own["test"] == "test_work.py::test_own" and command["test"] == "test_work.py::test_command"
    assert own["own"] >= 0.25 and own["children"] == 0  # process_time: the process's own CPU
    assert command["children"] >= 0.25 and command["own"] < 0.25
    totals = suite_run.cpu_seconds(log)
    assert totals is not None and totals["total"] == totals["tests"] + totals["their_commands"]
    assert suite_run.cpu_seconds(pytester.path / "absent.jsonl") is None


def test_the_pace_probe_counts_its_command_s_cpu_seconds_each_time(monkeypatch) -> None:
    """The suite record's pace (bench/process_costs.trainer_imports_pace): the CPU seconds of one
    command, run several times, summarised; here a command that computes 0.2 s instead of the
    trainer's imports (seconds), so the count is checked against a known amount."""
    from bench import process_costs

    busy = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass"
    monkeypatch.setattr(process_costs, "TRAINER_IMPORTS", busy)
    # Another child of the caller, alive throughout (a pytest worker has its fork server): the
    # probe waits for its own command only, where a counting subreaper waits a minute for it.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        started = time.monotonic()
        pace = process_costs.trainer_imports_pace(repeats=2)
        waited = time.monotonic() - started
    finally:
        other.kill()
        other.wait()
    assert pace["runs"] == 2
    assert 0.2 <= pace["min"] <= pace["median"] <= pace["max"] < 5.0  # an interpreter's start and 0.2 s
    assert waited < 30, f"the probe waited {waited:.0f} s: it waited for another child"
