"""Small collectives shared by callbacks, rollouts and data modules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

Item = TypeVar("Item")
Result = TypeVar("Result")


def gather_from_all_ranks(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by global rank; ``[obj]`` when no process group is running.

    Used for state that each rank holds but only rank 0 writes to the checkpoint (data stream
    positions, RNG states): every rank must call it, as for any collective.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def share_out(
    items: Sequence[Item], work: Callable[[list[Item]], list[Result]], group: dist.ProcessGroup
) -> list[Result]:
    """``work(items)`` done together by the ranks of ``group``, which all pass the same items.

    Rank r does items ``r, r + size, ...``; the results are exchanged so that every rank
    returns all of them, in item order. ``work`` returns one result per item it is given.
    """
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = list(items[rank::size])
    local = work(mine) if mine else []
    shares: list[list[Result]] = [[] for _ in range(size)]
    dist.all_gather_object(shares, local, group=group)
    results: list[Result] = [None] * len(items)  # type: ignore[list-item]
    for peer, share in enumerate(shares):
        results[peer::size] = share
    return results
