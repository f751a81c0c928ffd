"""How dataloader workers meet signals, and how the trainer ends them.

A worker must stop when, and only when, the trainer that reads from it ends it:

- **The job's signals leave it serving.** A scheduler pre-empting a job, ``timeout`` or
  ``kill -- -PGID`` sends SIGTERM to every process of the job, and a terminal's Ctrl-C sends
  SIGINT to the whole foreground group. The trainer stops at the end of its step (with a
  checkpoint) and may still fetch a batch before then (Lightning asks for the next batch as a
  step starts). A worker killed by the signal makes torch's SIGCHLD handler raise in the
  trainer wherever it is (seen in a rollout's forward pass and while a checkpoint was being
  written); one that exits fails the trainer's next fetch ("exited unexpectedly"). So a worker
  ignores SIGINT and serves on after the job's first SIGTERM; a second SIGTERM from outside
  ends it quietly (status 0).
- **The trainer's SIGTERM ends it at once.** A trainer that stops part-way through a pass (a
  fit that reaches ``max_steps`` inside an epoch, a run stopped by a signal) leaves its workers
  to Python's exit, which sends each daemonic child exactly one SIGTERM and then joins it with
  no time-out; torch too ends a worker that outlives its loader's shutdown with one SIGTERM.
  A worker that took that SIGTERM for the job's would be joined forever (the hang of
  ``lvrl fit`` after its last step). A signal handler in Python cannot see who sent the signal,
  so the trainer says it: before it sends, or lets Python send, that SIGTERM, it sets the
  pass's :class:`EndingSwitch`, a byte of shared memory the worker reads in its handler. The
  switch is set when a pass ends (read to its end, closed, or its loader torn down) and, for
  every pass still running, at interpreter exit just before multiprocessing's own clean-up.

A trainer that dies without any clean-up (SIGKILL) ends its workers at once: each watches its
trainer's sentinel (``multiprocessing.parent_process()``) on a thread. Torch's own watchdog
cannot be relied on for that: it watches the worker's parent process, which for a worker of a
fork server (:mod:`datamodules.fork_server`) is the server, and the server lives as long as any
of its workers does (each holds the server's keep-alive pipe).
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # registers its exit clean-up first, so that ours runs before it
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any


class EndingSwitch:
    """One byte in shared memory: set, the next SIGTERM a worker gets comes from its trainer.

    Made in the spawn context (raw, no lock: one byte is written whole), so it can go to
    spawned, forked and forkserver workers alike through their ``worker_init_fn``.
    """

    def __init__(self) -> None:
        self._flag: Any = multiprocessing.get_context("spawn").RawValue("b", 0)
        _SWITCHES.add(self)

    @property
    def is_set(self) -> bool:
        return bool(self._flag.value)

    def set(self) -> None:
        self._flag.value = 1

    def clear(self) -> None:
        self._flag.value = 0

    def worker_init_fn(self, chained: Callable[[int], None] | None = None) -> Callable[[int], None]:
        """A DataLoader's ``worker_init_fn`` installing :func:`serve_until_ended` with this switch,
        then calling ``chained`` (a user's own ``worker_init_fn``), if any."""
        return partial(serve_until_ended, self._flag, chained)


_SWITCHES: weakref.WeakSet[EndingSwitch] = weakref.WeakSet()
"""The switches of the passes alive in this process (a pass holds its own switch)."""


@atexit.register
def end_every_pass() -> None:
    """Set the switch of every pass still alive: registered to run at interpreter exit, before
    multiprocessing's own exit function (atexit runs the last registered first, and this module
    imports multiprocessing.util before registering), so that every SIGTERM that function sends
    a worker is taken for the trainer's."""
    for switch in list(_SWITCHES):
        switch.set()


def serve_until_ended(flag: Any, chained: Callable[[int], None] | None, worker_id: int) -> None:
    """Install the worker's signal handling (see the module docstring); runs in the worker.

    SIGINT is ignored (Ctrl-C is the trainer's to handle); SIGTERM ends the worker at once with
    status 0 when its trainer has set the pass's :class:`EndingSwitch`, or when it is the second
    one; otherwise the worker serves on.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    received: list[int] = []

    def on_sigterm(signum: int, frame: object) -> None:
        if flag.value or received:
            os._exit(0)  # nothing left to hand over: the trainer is ending this worker
        received.append(signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    trainer = multiprocessing.parent_process()
    if trainer is not None:
        threading.Thread(target=_end_with, args=(trainer,), name="trainer-watch", daemon=True).start()
    # Registered before the user's function, so that its own exit handlers run first.
    atexit.register(leave_without_native_clean_up, flag)
    if chained is not None:
        chained(worker_id)


def _end_with(trainer: multiprocessing.process.BaseProcess) -> None:
    """Wait for the trainer's sentinel (ready once the trainer process is gone, however it ended),
    then end this worker: nothing it holds has a reader any more."""
    multiprocessing.connection.wait([trainer.sentinel])
    os._exit(0)


def leave_without_native_clean_up(flag: Any) -> None:
    """At a worker's exit, once its trainer has ended the pass: leave with status 0 now.

    A spawned worker ends with ``sys.exit``, so after Python's exit handlers come the native
    libraries' (C++ static destructors): one of them, under load, aborted a finished worker
    ("terminate called without an active exception", status -6), which the trainer would read
    as a crash. Python's handlers have run by then and the worker has nothing left to hand
    over, so it skips the native ones. A worker whose pass was not ended (its trainer died)
    exits the usual way.
    """
    if not flag.value:
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(0)
