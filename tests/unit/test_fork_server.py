"""Dataloader workers forked from the fork server (datamodules/fork_server.py) start with the
workers' code imported and that heap frozen, collection on: nothing to import, and their
collections leave the shared pages alone."""

from __future__ import annotations

import gc
import sys
from multiprocessing.connection import Connection

from datamodules.fork_server import PRELOADED, worker_context


def report_heap(reply: Connection) -> None:
    """Run in a worker: what it found imported and how its collector stands, before doing anything."""
    reply.send(
        {
            "imported": [module for module in PRELOADED if module in sys.modules],
            "frozen": gc.get_freeze_count(),
            "collecting": gc.isenabled(),
        }
    )
    reply.close()


def test_a_worker_starts_with_the_preloaded_heap_frozen_and_collection_on() -> None:
    context = worker_context("forkserver")
    receiving, sending = context.Pipe(duplex=False)
    worker = context.Process(target=report_heap, args=(sending,))
    worker.start()
    sending.close()
    found = receiving.recv() if receiving.poll(120) else None
    worker.join(30)
    assert found is not None and worker.exitcode == 0
    assert found["imported"] == list(PRELOADED)
    # torch and transformers alone are a few hundred thousand tracked objects; a heap frozen
    # before the imports, or not at all, holds none of them.
    assert found["frozen"] > 100_000
    assert found["collecting"]
