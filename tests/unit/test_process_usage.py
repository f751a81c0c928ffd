"""bench/process_usage.py: the CPU time of a command counted with every process it left behind,
and the record bench/grpo_runs.run_lvrl keeps of each attempt."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import grpo_runs
from bench.process_usage import Usage

REPO = Path(__file__).resolve().parents[2]

ORPHAN_SECONDS = 0.5
# The command forks a child that burns ORPHAN_SECONDS of CPU after its parent has exited: the
# shape of lvrl's fork server, which outlives the trainer for a moment.
LEAVES_AN_ORPHAN = f"""
import os, time
if os.fork() == 0:
    start = time.process_time()
    while time.process_time() - start < {ORPHAN_SECONDS}:
        pass
    os._exit(0)
os._exit(0)
"""

COUNT_IT = f"""
import json, sys
from bench.process_usage import run_counted
print(json.dumps(run_counted([sys.executable, "-c", {LEAVES_AN_ORPHAN!r}]).__dict__))
"""


def test_an_orphans_cpu_time_is_counted_and_waited_for() -> None:
    """Run in its own process (the counting process becomes a subreaper and waits for every
    child it has: not something to do to pytest's). The orphan's CPU time is measured by the
    orphan itself (``process_time``), so the count is at least that whatever the load; without
    the subreaper it would go to init and the count would be the parent's start-up alone."""
    counted = subprocess.run(
        [sys.executable, "-c", COUNT_IT], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    )
    usage = Usage(**json.loads(counted.stdout))
    assert usage.exit_status == 0 and usage.orphans_left == 0
    assert usage.cpu_seconds >= ORPHAN_SECONDS
    assert usage.wall_seconds >= ORPHAN_SECONDS  # the count waited for the orphan to end


# The command's child starts a grandchild and exits, so the grandchild is adopted by the counting
# process; the grandchild exits at once, and the command, still running, watches its pid: it must
# vanish (be waited for) while the command runs, not stay a zombie until the command ends.
REAPED_WHILE_IT_RUNS = """
import os, time
read, write = os.pipe()
if os.fork() == 0:
    grandchild = os.fork()
    if grandchild == 0:
        os._exit(0)
    os.write(write, str(grandchild).encode())
    os._exit(0)
os.waitpid(-1, 0)
grandchild = int(os.read(read, 32))
deadline = time.monotonic() + 30
while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
    time.sleep(0.05)
print(not os.path.exists(f"/proc/{grandchild}"), flush=True)
"""

REAP_IT = f"""
import sys
from bench.process_usage import run_counted
run_counted([sys.executable, "-c", {REAPED_WHILE_IT_RUNS!r}], stdout=sys.stdout)
"""


def test_an_adopted_orphan_is_waited_for_while_the_command_runs() -> None:
    """A zombie passes ``kill(pid, 0)`` as a live process, so an orphan left unwaited until the
    command's end would fail the suite's checks that processes end, under ``bench/suite_run.py``.
    The command gives it 30 s (the counting process looks every 0.5 s)."""
    counted = subprocess.run(
        [sys.executable, "-c", REAP_IT], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    )
    assert counted.stdout.split() == ["True"], counted.stderr[-2000:]


# A command that stops on SIGTERM as lvrl does: it finishes what it is doing (half a second), then
# exits with 143. Otherwise it ends with status 0 once the file named by its argument exists.
STOPS_ON_SIGTERM = """
import os, signal, sys, time
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
print("ready", flush=True)
deadline = time.monotonic() + 60
while not stopped and not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.5)
sys.exit(143 if stopped else 0 if os.path.exists(sys.argv[1]) else 1)
"""

COUNT_A_STOPPED_ONE = f"""
import json, sys
from bench.process_usage import run_counted
usage = run_counted([sys.executable, "-c", {STOPS_ON_SIGTERM!r}, sys.argv[1]])
print(json.dumps(usage.__dict__), flush=True)
"""


@pytest.mark.parametrize(
    "to_the_group", [True, False], ids=["SIGTERM to the group", "SIGTERM to the counter"]
)
def test_a_stop_request_waits_for_the_command_and_is_returned(to_the_group: bool, tmp_path: Path) -> None:
    """A job-wide SIGTERM must not end the counting process before its command: the command stops
    in its own time (status 143) and the count is still returned, with the request, for a bench
    to record the attempt and stop. A SIGTERM to the counting process alone is not passed on: the
    command runs to its end (status 0), and the request is returned all the same."""
    finish = tmp_path / "finish"
    counter = subprocess.Popen(
        [sys.executable, "-c", COUNT_A_STOPPED_ONE, str(finish)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert counter.stdout is not None and counter.stderr is not None
        assert counter.stdout.readline().strip() == "ready"
        if to_the_group:
            os.killpg(counter.pid, signal.SIGTERM)
        else:
            counter.send_signal(signal.SIGTERM)
            assert counter.stderr.readline().startswith("SIGTERM: waiting for the command")
            finish.touch()
        out, err = counter.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(counter.pid, signal.SIGKILL)  # whatever is left of it, on failure
    assert counter.returncode == 0, err[-2000:]
    usage = Usage(**json.loads(out))
    assert usage.exit_status == (143 if to_the_group else 0)
    assert usage.stop_requests == ("SIGTERM",)


def test_every_attempt_is_recorded_with_its_cost_and_a_stopped_one_ends_the_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished attempt and a stopped one (SIGTERM: exit status 143) each append their record:
    the lvrl arguments, where the code came from, and what they used; the stopped one then ends
    the bench with the command to continue."""
    outcomes = iter([Usage(0, 12.5, 20.0), Usage(143, 3.0, 4.0)])
    monkeypatch.setattr(grpo_runs, "run_counted", lambda command, **popen: next(outcomes))
    grpo_runs.run_lvrl(tmp_path, ["fit", "--config", "c.yaml"])
    (tmp_path / "run.log").write_text("stopped by a signal; continue with --ckpt_path last\n")
    with pytest.raises(SystemExit, match=r"lvrl fit stopped \(exit status 143\): stopped by a signal"):
        grpo_runs.run_lvrl(tmp_path, ["fit", "--config", "c.yaml", "--ckpt_path", "last"], append=True)
    records = grpo_runs.attempts(tmp_path)
    assert [(r["exit_status"], r["cpu_seconds"], r["wall_seconds"]) for r in records] == [
        (0, 12.5, 20.0),
        (143, 3.0, 4.0),
    ]
    assert records[1]["lvrl"][-2:] == ["--ckpt_path", "last"]
    assert {"command", "commit", "machine", "date"} <= set(records[0])


def test_a_stop_request_to_the_bench_alone_ends_it_after_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command finished (status 0) while a SIGTERM to the bench was waiting: its attempt is
    recorded, with the request, and the bench stops instead of starting the next stage."""
    monkeypatch.setattr(
        grpo_runs, "run_counted", lambda command, **popen: Usage(0, 5.0, 6.0, 0, ("SIGTERM",))
    )
    with pytest.raises(
        SystemExit, match=r"stopped \(SIGTERM\) after the command under way finished: validate"
    ):
        grpo_runs.run_lvrl(tmp_path, ["validate", "--config", "c.yaml"])
    [record] = grpo_runs.attempts(tmp_path)
    assert (record["exit_status"], record["stop_requests"]) == (0, ["SIGTERM"])
