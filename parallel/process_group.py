"""Ending a run's default process group before the interpreter does.

Lightning starts the process group of a multi-process run and leaves it open (it registers an
exit-time clean-up for NCCL only). A gloo group still open when the process ends can kill a
rank that has finished its work: its worker threads are still running as the process is
torn down, and the C++ runtime aborts ("terminate called without an active exception",
SIGABRT, status 134) instead of the process exiting with 0. Processes that run some
asynchronous all-reduces and exit (``python bench/gloo_exit.py --tries 20``) aborted in 9 of 20
tries with two ranks and 8 of 20 with a one-process group (as vLLM's in-process engine
makes); with the group destroyed first, in none of 20 either way. The suite saw it once, on
rank 1 of a two-process FSDP fit that had written all of its results.

:func:`release_process_group` is called where every rank has passed its last collective (a
command that ended normally, or one stopped by a signal at the end of a step). Not on an
error: ``destroy_process_group`` waits for this rank's collectives still in flight, so a rank
that failed in the middle of one would wait for peers that are waiting for it, until the
collective time-out (30 minutes), where exiting at once lets them fail in seconds.
"""

from __future__ import annotations

import sys

import torch.distributed as dist


def release_process_group() -> bool:
    """Destroy the default process group and its subgroups if one is open; True if one was.

    vLLM's in-process engine makes a one-process group when it finds none (or joins the run's)
    and keeps its own handles to it for the process's life; those go first, so that an engine
    started later in the same process (tests run commands in one process) starts afresh
    instead of using a destroyed group.
    """
    was_open = dist.is_available() and dist.is_initialized()
    vllm_groups = sys.modules.get("vllm.distributed.parallel_state")  # only if vLLM is loaded
    if vllm_groups is not None:
        vllm_groups.destroy_model_parallel()
        vllm_groups.destroy_distributed_environment()  # ends the default group too
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    return was_open
