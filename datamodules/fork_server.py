"""Dataloader workers forked from a fork server that has already imported what they run.

A spawned worker starts a fresh interpreter and imports torch, transformers and the model
family's processor before its first batch (seconds on 2 cores), paid again by every loader
(training, each validation pass). With ``worker_start_method: forkserver``, multiprocessing
starts one server process per trainer, which imports this module (:func:`worker_context` asks
for it), and every worker is a fork of that server, with those imports already done, and
none inherits the trainer's threads (the reason not to ``fork`` the trainer itself: a fork of a
process whose OpenMP threads an in-process vLLM engine has bound deadlocks).

Signals (see :mod:`datamodules.loader_workers` for the workers'): the server is in the job's
process group, so a scheduler's SIGTERM and a terminal's Ctrl-C reach it too. Python's server
ignores SIGINT; this module makes it ignore SIGTERM as well, because torch's worker watchdog
takes the death of a worker's parent (the server) for the trainer's and ends the worker, which
would fail the trainer's next fetch before it can finish its step and save. The server still
ends with its trainer: it exits when the trainer's end of its pipe closes, whatever ended the
trainer (a SIGKILL included).
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import signal
import sys
from multiprocessing.context import BaseContext


def worker_context(method: str) -> BaseContext:
    """The multiprocessing context for dataloader workers started by ``method``; for
    ``forkserver``, one whose server imports this module (and so the workers' code) first."""
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        # Takes effect when the server starts (the first loader of the process); later calls
        # give the same list.
        context.set_forkserver_preload([__name__])
    return context


def _in_fork_server() -> bool:
    """Whether this process is multiprocessing's fork server (started as ``python -c`` from
    ``multiprocessing.forkserver.main``, which imports its preload list before serving)."""
    return sys.argv == ["-c"] and "multiprocessing.forkserver" in sys.modules


PRELOADED = (
    "torch.utils.data._utils.worker",
    "transformers",
    "transformers.models.qwen2_vl.processing_qwen2_vl",
    "transformers.models.qwen2_vl.image_processing_qwen2_vl",
    "transformers.models.qwen2_vl.video_processing_qwen2_vl",
    "transformers.models.qwen2_5_vl.processing_qwen2_5_vl",
    "transformers.models.qwen3_vl.processing_qwen3_vl",
    "transformers.models.qwen3_vl.video_processing_qwen3_vl",
    "datamodules.collate",
    "datamodules.stream",
)
"""What every worker runs: torch's worker loop, the stream and its collation, and the processors of
the supported families (unpickling a processor imports its family's modules)."""

if _in_fork_server():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by workers until they install theirs
    # The imports are built once and shared by every worker, so the collector should neither walk
    # them while they are built nor later in the workers (where walking them would also copy the
    # shared pages it writes to): collection off while importing, then frozen, as the gc module's
    # documentation recommends for a process that forks without exec.
    gc.disable()
    try:
        for module in PRELOADED:
            importlib.import_module(module)
    finally:
        gc.freeze()
        gc.enable()
