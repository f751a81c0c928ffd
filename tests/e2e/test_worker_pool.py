"""datatools/worker_pool.py: a data tool's pool ends when the command ends it, whatever signal
reached the command's process group, and a command killed outright takes its workers with it.

Each case runs a small command in a session of its own (the process group is what is under test):
it starts a one-worker pool, runs one task (the worker then waits for its next one, holding the
task queue's read lock), and prints the worker's pid. A worker that the group's SIGTERM killed
there would never release that lock and ``Pool.terminate`` would wait for it forever.

Bounds (a hang is infinite, so they only decide how soon it is reported): starting a spawned
worker and ending the pool take a few seconds even with both cores busy; ``COMMAND_WITHIN``
leaves ample room. A worker left without its command reads end-of-file at once;
``WORKER_GONE_WITHIN`` allows for a loaded machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from helpers.cli import REPO_ROOT

COMMAND_WITHIN = 60.0
WORKER_GONE_WITHIN = 15.0

START_A_POOL = """
import os, signal, sys, time
from datatools.worker_pool import worker_pool
pool = worker_pool(1)
print(pool.apply(os.getpid), flush=True)
time.sleep(0.5)  # the worker is back in the task queue's read
"""
# The command answers SIGTERM as the data tools do: it stops and ends its pool.
TERM_THE_GROUP_THEN_END = (
    START_A_POOL
    + """
signal.signal(signal.SIGTERM, lambda *_: None)
os.killpg(0, signal.SIGTERM)
time.sleep(0.5)
pool.terminate()
print("ended", flush=True)
"""
)
WAIT_TO_BE_KILLED = (
    START_A_POOL
    + """
time.sleep(600)
"""
)


def start(script: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_sigterm_to_the_group_leaves_the_pool_to_the_command() -> None:
    command = start(TERM_THE_GROUP_THEN_END)
    try:
        out, err = command.communicate(timeout=COMMAND_WITHIN)
    except subprocess.TimeoutExpired:
        os.killpg(command.pid, signal.SIGKILL)
        out, err = command.communicate()
        raise AssertionError(f"the pool did not end within {COMMAND_WITHIN:.0f} s: {err[-2000:]}") from None
    assert command.returncode == 0, err[-2000:]
    worker, ended = out.split()
    assert ended == "ended"
    assert gone_within(int(worker), WORKER_GONE_WITHIN)


def test_a_command_killed_outright_takes_its_worker_with_it() -> None:
    command = start(WAIT_TO_BE_KILLED)
    assert command.stdout is not None
    worker = int(command.stdout.readline())
    assert os.getsid(worker) != os.getsid(command.pid), "the worker left the command's session"
    command.kill()  # the command alone, as a SIGKILL to one process
    command.communicate()
    assert gone_within(worker, WORKER_GONE_WITHIN), "the worker outlived its command"
