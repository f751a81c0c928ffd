"""How often a gloo rank that finished its work aborts at exit, with and without
:func:`parallel.process_group.release_process_group` before it ends.

Each try starts a gloo group of ``--ranks`` processes (1: a one-process group, as vLLM's
in-process engine makes) that run some blocking and some asynchronous all-reduces (as FSDP2
issues them), wait for all of them, and return; with ``release`` they destroy the group first,
as ``lvrl`` commands do. A try fails when a rank does not exit with status 0 (an abort shows
as SIGABRT). Printed: failures out of tries for each size and way.

Usage: python bench/gloo_exit.py [--tries 20] [--ranks 1 2]
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parallel.process_group import release_process_group


def _rank(rank: int, ranks: int, port: int, release: bool) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    summed = torch.ones(1000)
    for _ in range(50):
        dist.all_reduce(summed)
    pending = [dist.all_reduce(torch.ones(1000), async_op=True) for _ in range(20)]
    for work in pending:
        work.wait()
    if release:
        release_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def failures(tries: int, ranks: int, release: bool) -> int:
    failed = 0
    for _ in range(tries):
        try:
            mp.spawn(_rank, args=(ranks, _free_port(), release), nprocs=ranks, start_method="spawn")
        except mp.ProcessExitedException:
            failed += 1
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    for ranks in args.ranks:
        for release in (False, True):
            way = "group destroyed before exit" if release else "group left open at exit"
            failed = failures(args.tries, ranks, release)
            print(f"{ranks} rank(s), {way}: {failed} of {args.tries} tries failed", flush=True)


if __name__ == "__main__":
    main()
