"""The CPU time a command spends, with every process it starts, counted whole.

A bench's "trainer seconds" measured as wall time counts the hours a run was paused (SIGSTOP) or
shared the machine with other work. CPU time does not: a stopped process uses none, and a run
beside other work uses about what it would alone. The kernel adds a child's CPU time, with that of
every descendant it waited for, to the parent's ``RUSAGE_CHILDREN`` once the parent waits for it.
One gap: a descendant that outlives the process that started it is handed to init, and its time
(with that of everything it waited for) is lost. ``lvrl`` leaves one such process behind for a
moment at exit: multiprocessing's fork server, the parent of every dataloader worker, which exits
only when it sees the trainer's end. Marked a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``,
Linux), this process adopts such orphans instead, waits for them, and their time is counted. It
waits for them as they exit, while the command runs: an orphan left a zombie would pass for a live
process to the command's own checks (the suite's, counted by ``bench/suite_run.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
"""From linux/prctl.h (Linux >= 3.4)."""

ORPHAN_WAIT_SECONDS = 60.0
"""How long to wait for adopted descendants to exit after the command has: a fork server exits as
soon as it reads the end of the trainer's pipe, so a minute is far more than enough; one still
alive after it is reported, not waited for (its time is then missing, and said to be)."""


@dataclass(frozen=True)
class Usage:
    """What one command cost: its exit status, CPU seconds (user + system, the command and every
    descendant that exited), wall seconds, how many adopted descendants were still alive when
    counting stopped (0 when the CPU figure is whole), and the stop signals this process received
    while the command ran (the caller should stop after it)."""

    exit_status: int
    cpu_seconds: float
    wall_seconds: float
    orphans_left: int = 0
    stop_requests: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A record read back from JSON gives a list; the value stays immutable, as the rest is.
        object.__setattr__(self, "stop_requests", tuple(self.stop_requests))


def children_cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its own children; False where the kernel has no
    such setting (not Linux), in which case their CPU time goes uncounted."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def wait_for_adopted(deadline_seconds: float) -> int:
    """Wait for every remaining child of this process (after the command, only adopted orphans:
    a bench runs one command at a time) until ``deadline_seconds`` pass; returns how many were
    still alive then."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0  # no children left
        if pid:
            continue
        if time.monotonic() >= deadline:
            return len(adopted_children())
        time.sleep(0.05)


def adopted_children() -> list[int]:
    """This process's living children, read from /proc (empty where /proc is absent)."""
    me, found = os.getpid(), []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    # Fields after the parenthesised name: state, then the parent's pid.
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == me:
                found.append(int(entry.name))
    return found


REAP_EVERY_SECONDS = 0.5
"""How often adopted orphans that have exited are waited for while the command runs: until then
each stays a zombie, which a check such as ``kill(pid, 0)`` takes for a live process (the suite
asserts that processes end; ``bench/suite_run.py`` counts it this way)."""


def reap_adopted(besides: int) -> None:
    """Wait for every child of this process that has exited, except ``besides`` (the command,
    which its ``Popen`` waits for)."""
    for pid in adopted_children():
        if pid != besides:
            with contextlib.suppress(ChildProcessError):  # waited for meanwhile
                os.waitpid(pid, os.WNOHANG)


@contextlib.contextmanager
def stops_wait_for() -> Iterator[list[str]]:
    """While a command runs, a stop request (SIGTERM, a first Ctrl-C) does not end this process:
    it is noted in the yielded list and this process keeps waiting for the command's end, so a
    stopped command is counted and recorded like a finished one. Nothing is passed on: a job-wide
    SIGTERM (a scheduler's, or pausing a bench) and a terminal's Ctrl-C reach the command too,
    which stops after its step and saves, and a second signal could cut that short (an ``lvrl``
    tool stops again in its own clean-up). A signal to this process alone lets the command run
    to its end; the caller stops after it. A second Ctrl-C interrupts the wait. Without this, a
    job-wide SIGTERM ended this process at once and the command's attempt went unrecorded."""
    requests: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield requests  # signal handlers belong to the main thread
        return

    def note(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and signal.Signals.SIGINT.name in requests:
            raise KeyboardInterrupt
        requests.append(signal.Signals(signum).name)
        print(
            f"{signal.Signals(signum).name}: waiting for the command under way to stop or end, then stopping"
            + (" (Ctrl-C again to stop waiting)" if signum == signal.SIGINT else ""),
            file=sys.stderr,
            flush=True,
        )

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield requests
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_counted(command: Sequence[str], **popen: Any) -> Usage:
    """Run ``command`` to its end (``subprocess.Popen`` keyword arguments in ``popen``) and count
    what it used, its orphans included; a stop request waits for the command's end and is
    returned in ``stop_requests`` (:func:`stops_wait_for`). Meant for one command at a time: this
    process's other children would be counted too, and waited for when they exit."""
    become_subreaper()
    cpu_before, wall_before = children_cpu_seconds(), time.perf_counter()
    with subprocess.Popen(list(command), **popen) as process, stops_wait_for() as requests:
        while process.poll() is None:
            reap_adopted(besides=process.pid)
            time.sleep(REAP_EVERY_SECONDS)
    status = process.returncode
    left = wait_for_adopted(ORPHAN_WAIT_SECONDS)
    cpu = children_cpu_seconds() - cpu_before
    return Usage(status, cpu, time.perf_counter() - wall_before, left, tuple(sorted(set(requests))))
