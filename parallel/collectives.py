"""Small collectives shared by callbacks, rollouts, data modules and sequence-parallel attention."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
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


class PeerFailed(RuntimeError):
    """Work shared out in a group failed on another rank of the group (which raises its own error)."""


def share_out(
    items: Sequence[Item], work: Callable[[list[Item]], list[Result]], group: dist.ProcessGroup
) -> list[Result]:
    """``work(items)`` done together by the ranks of ``group``, which all pass the same items.

    Rank r does items ``r, r + size, ...``; the results are exchanged so that every rank
    returns all of them, in item order. ``work`` returns one result per item it is given.
    Work that raises on some ranks still reaches the exchange, so every rank raises: those
    ranks their own error, the others :class:`PeerFailed` (none is left waiting in the exchange,
    and the group can retry together).
    """
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    mine = list(items[rank::size])
    failure: Exception | None = None
    local: list[Result] = []
    try:
        local = work(mine) if mine else []
    except Exception as error:  # raised after the exchange, which the peers are waiting in
        failure = error
    shares: list[tuple[list[Result], str | None]] = [([], None) for _ in range(size)]
    reason = None if failure is None else f"{type(failure).__name__}: {failure}"
    dist.all_gather_object(shares, (local, reason), group=group)
    if failure is not None:
        raise failure
    failed = {peer: why for peer, (_, why) in enumerate(shares) if why is not None}
    if failed:
        peer, why = next(iter(failed.items()))
        raise PeerFailed(f"the shared work failed on group rank(s) {sorted(failed)} (rank {peer}: {why})")
    results: list[Result] = [None] * len(items)  # type: ignore[list-item]
    for peer, (share, _) in enumerate(shares):
        results[peer::size] = share
    return results


class _AllToAll(torch.autograd.Function):
    """All-to-all of equally shaped chunks with autograd: backward sends each gradient back.

    ``torch.distributed.nn.functional.all_to_all`` falls back, on gloo, to scatters whose source
    is a group rank passed as a global one, which fails for a group that does not start at
    global rank 0 (a sequence-parallel group of the second data-parallel replica).
    """

    @staticmethod
    def forward(ctx: Any, group: dist.ProcessGroup, *chunks: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.group = group
        received = [torch.empty_like(c) for c in chunks]
        dist.all_to_all(received, [c.contiguous() for c in chunks], group=group)
        return tuple(received)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        returned = [torch.empty_like(g) for g in grads]
        dist.all_to_all(returned, [g.contiguous() for g in grads], group=ctx.group)
        return (None, *returned)


def all_to_all(chunks: list[torch.Tensor], group: dist.ProcessGroup) -> list[torch.Tensor]:
    """Chunk ``j`` of this rank goes to rank ``j`` of ``group``; returns the chunk each rank sent here."""
    return list(_AllToAll.apply(group, *chunks))
