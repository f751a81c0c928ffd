"""Gloo ranks for the tests, forked from the fork server that the dataloader workers use
(:mod:`datamodules.fork_server`) instead of spawned: a spawned rank starts a fresh interpreter
and imports torch and transformers before it does anything (seconds each, for every rank of
every test); a rank forked from the server has them already. The server has no threads and no
process group of its own, so each rank still starts as a process of its own (its own gloo
group, its own thread count), as a spawned one would, and with the caller's environment as it is
now (the server's is the one it started with, possibly inside another test's settings).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from datamodules.fork_server import worker_context


def spawn_ranks(fn: Callable[..., None], args: tuple[Any, ...] = (), nprocs: int = 1) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes, waited for; a rank's exception fails the
    caller with its traceback (as ``torch.multiprocessing.spawn``)."""
    worker_context("forkserver")  # the server, when it starts, imports the workers' code first
    environment = dict(os.environ)
    mp.start_processes(
        _rank, args=(fn, environment, *args), nprocs=nprocs, join=True, start_method="forkserver"
    )


def _rank(index: int, fn: Callable[..., None], environment: dict[str, str], *args: Any) -> None:
    # The server ignores SIGTERM (datamodules.fork_server says why), and forked children inherit
    # that; a rank is a process of its own and ends on it as a spawned one does.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(environment)
    fn(index, *args)
