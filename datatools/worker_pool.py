"""The process pool of the data tools (rendering synthetic videos, probing released ones).

Workers start by ``spawn``: the parent may hold threads (tqdm, torch) that ``fork`` would copy in
a bad state.

The command alone decides when its workers end. Each worker leaves the command's session as it
starts, so a signal to the command's process group (a terminal's Ctrl-C, a scheduler's or
``timeout``'s SIGTERM, ``kill -- -PGID``) reaches the command only; the command stops, says so,
and ends the pool (``Pool.terminate``, from its ``with`` block). Were the workers in the group, a
SIGTERM would kill them where they stand: a worker waiting for its next task holds the task
queue's read lock, a killed one never releases it, and ``Pool.terminate`` first takes that lock,
so the command would hang forever (it did, under load). A session rather than a group: a process
outside the terminal's session gets no job-control stops for writing to it.

A command killed outright (SIGKILL) still takes its workers with it: its end closes the task
pipe, a waiting worker reads end-of-file and leaves, a busy one fails to send its result and
leaves.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.pool import Pool


def _leave_the_commands_session() -> None:
    # Until this runs (the first moments of the worker's start) a group signal may still reach
    # it; a worker killed then holds no lock yet, and the pool replaces it.
    os.setsid()


def worker_pool(processes: int) -> Pool:
    """A pool of ``processes`` spawned workers that only the command ends; use it in ``with``."""
    return multiprocessing.get_context("spawn").Pool(processes, initializer=_leave_the_commands_session)
