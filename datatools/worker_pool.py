"""The process pool of the data tools (rendering synthetic videos, probing released ones).

Workers start by ``spawn``: the parent may hold threads (tqdm, torch) that ``fork`` would copy in
a bad state. They ignore SIGINT: a terminal's Ctrl-C reaches the whole foreground group, and the
command itself answers it (it stops, says so, and ends the pool); workers that each raised
``KeyboardInterrupt`` would only add a traceback apiece.
"""

from __future__ import annotations

import multiprocessing
import signal
from multiprocessing.pool import Pool


def _ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker_pool(processes: int) -> Pool:
    """A pool of ``processes`` spawned workers that leave Ctrl-C to the command; use it in ``with``."""
    return multiprocessing.get_context("spawn").Pool(processes, initializer=_ignore_interrupts)
