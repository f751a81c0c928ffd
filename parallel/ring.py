"""Ring attention: each rank keeps its queries; key/value blocks travel around the group.

Each rank holds the positions of :meth:`~parallel.shard.SequenceShard.positions`: by default
the ``zigzag`` layout (the row cut into 2P chunks, rank r holding chunks r and 2P-1-r), or one
``contiguous`` slice per rank. In step s a rank attends its queries to the key/value block of
rank ``r - s`` (its own at s = 0) and passes that block on to rank ``r + 1``, combining the
partial results with the online (streaming) softmax: a running row maximum ``m``, running
normaliser ``l`` and running output. Causality by global position decides, per step, which
query x key products are computed at all (:func:`ring_schedule`): with contiguous slices a rank
attends earlier ranks' blocks fully, its own causally, later ones not at all, so rank r does
r + 1 blocks of work and the last rank P times the first's; with zigzag every rank does the
same work (its first chunk sees the first half of an earlier rank's block, its second chunk the
whole block of a later rank). Memory per rank is one extra key/value block, whatever P; any
head count works (the Ulysses constraint does not apply). Liu et al., "Ring Attention with
Blockwise Transformers", arXiv 2310.01889; the zigzag split is the load-balanced one of Llama
3's context parallelism (arXiv 2407.21783, section 3.3.2).

The backward pass is written out (a ``torch.autograd.Function``), since gradients must travel
the ring too: each rank recomputes the attention probabilities block by block from the saved
log-sum-exp, accumulates its query gradient locally, and adds the key/value gradient of each
block to an accumulator that travels with the block and arrives back at its owner after P hops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from parallel.packing import visible
from parallel.shard import SequenceShard


def _pass_on(tensors: list[torch.Tensor], shard: SequenceShard) -> list[torch.Tensor]:
    """Send ``tensors`` to the next rank of the ring and return those received from the previous."""
    size, rank = shard.size, shard.rank
    after, before = shard.global_rank((rank + 1) % size), shard.global_rank((rank - 1) % size)
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), after, shard.group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, before, shard.group) for t in received]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received


QUERY_CHUNK = 1024
"""Queries scored at a time against a key/value block: bounds the transient score matrix to
``QUERY_CHUNK x block`` per head, whatever the slice length."""


@dataclass(frozen=True)
class Block:
    """One product of a ring step: local queries ``queries`` against keys ``keys`` of the received block."""

    queries: slice
    keys: slice
    causal: bool
    """The queries and keys are the same positions: query i sees keys 0..i of the block only."""

    @property
    def score_entries(self) -> int:
        """Query x key scores this block computes per head and row (its share of the work)."""
        return (self.queries.stop - self.queries.start) * (self.keys.stop - self.keys.start)


def ring_schedule(rank: int, size: int, length: int, layout: str) -> list[list[Block]]:
    """Per ring step s (the block of rank ``(rank - s) % size``), the products ``rank`` computes.

    ``length`` is the number of positions each rank holds. Every block of a rank is a run of
    positions in increasing global order, so within the own block a local causal mask is the
    global one.

    >>> [len(step) for step in ring_schedule(0, 4, 8, "contiguous")]  # only its own block
    [1, 0, 0, 0]
    >>> [sum(b.score_entries for b in step) for step in ring_schedule(0, 4, 8, "zigzag")]
    [48, 32, 32, 32]
    """
    everything = slice(0, length)
    steps: list[list[Block]] = []
    for step in range(size):
        source = (rank - step) % size
        if layout == "contiguous":
            if source < rank:  # an earlier slice: wholly in the past
                steps.append([Block(everything, everything, causal=False)])
            elif source == rank:
                steps.append([Block(everything, everything, causal=True)])
            else:  # a later slice: wholly in the future (passed on, not attended)
                steps.append([])
            continue
        if length % 2:
            raise ValueError(f"a zigzag shard holds two equal chunks, not {length} positions")
        half = length // 2
        first, second = slice(0, half), slice(half, length)
        if source == rank:
            # Own chunks r < 2P-1-r: each causally on itself, the second fully on the first.
            steps.append(
                [Block(first, first, causal=True), Block(second, first, False), Block(second, second, True)]
            )
        elif source < rank:
            # Chunk s is before both own chunks, chunk 2P-1-s after both.
            steps.append([Block(everything, first, causal=False)])
        else:
            # Both chunks of a later rank lie between own chunks r and 2P-1-r.
            steps.append([Block(second, everything, causal=False)])
    return steps


def _chunk_scores(
    query: torch.Tensor, key: torch.Tensor, scaling: float, hidden: torch.Tensor | int | None
) -> torch.Tensor:
    """``(B, H, chunk, Lk)`` scaled scores of a query chunk against the keys of a block.

    ``hidden``: for a causal block, the index of the chunk's first query within the block (keys
    after a query are masked); for packed rows, a ``(B, chunk, Lk)`` mask of the pairs the
    segment rule hides; None for a block that lies wholly in the past.
    """
    # In place after the product: each chunk-sized temporary is one more (B, H, chunk, Lk) alive.
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(scaling)
    if isinstance(hidden, torch.Tensor):
        scores.masked_fill_(hidden.unsqueeze(1), float("-inf"))
    elif hidden is not None:
        rows = torch.arange(hidden, hidden + query.shape[2], device=query.device)
        future = torch.arange(key.shape[2], device=query.device).unsqueeze(0) > rows.unsqueeze(1)
        scores.masked_fill_(future, float("-inf"))
    return scores


def _chunks(queries: slice) -> list[slice]:
    """``queries`` in runs of at most :data:`QUERY_CHUNK`."""
    start, stop = queries.start, queries.stop
    return [slice(first, min(first + QUERY_CHUNK, stop)) for first in range(start, stop, QUERY_CHUNK)]


class _Masks:
    """What a query chunk may not see of a block: by position within a causal block, or, for
    packed rows, by :func:`parallel.packing.visible` on global positions and segments."""

    def __init__(self, shard: SequenceShard, length: int, segments: torch.Tensor | None) -> None:
        self.segments = segments
        if segments is not None:
            whole = length * shard.size
            self.held = [shard.positions(whole, rank).to(segments.device) for rank in range(shard.size)]
            self.rank = shard.rank

    def hidden(self, block: Block, rows: slice, step: int) -> torch.Tensor | int | None:
        if self.segments is None:
            return rows.start - block.queries.start if block.causal else None
        queries = self.held[self.rank][rows]
        keys = self.held[(self.rank - step) % len(self.held)][block.keys]
        seen = visible(
            queries[:, None], keys[None, :], self.segments[:, queries, None], self.segments[:, None, keys]
        )
        return ~seen


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        shard: SequenceShard,
        scaling: float,
        segments: torch.Tensor | None,
    ) -> torch.Tensor:
        size = shard.size
        schedule = ring_schedule(shard.rank, size, query.shape[2], shard.layout)
        masks = _Masks(shard, query.shape[2], segments)
        # Scores in float32 whatever the input dtype: the running sums need the range.
        q, k, v = query.float(), key.float(), value.float()
        out = torch.zeros_like(q)
        row_max = torch.full(q.shape[:-1], float("-inf"), device=q.device)
        row_sum = torch.zeros(q.shape[:-1], device=q.device)
        for step, blocks in enumerate(schedule):
            for block in blocks:
                block_k, block_v = k[:, :, block.keys], v[:, :, block.keys]
                for rows in _chunks(block.queries):
                    scores = _chunk_scores(q[:, :, rows], block_k, scaling, masks.hidden(block, rows, step))
                    new_max = torch.maximum(row_max[:, :, rows], scores.amax(dim=-1))
                    # A query that has seen no key yet (all hidden so far) keeps a zero output.
                    finite_max = new_max.masked_fill(new_max == float("-inf"), 0.0)
                    correction = torch.exp(row_max[:, :, rows] - finite_max)  # exp(-inf) = 0 at first
                    weights = scores.sub_(finite_max.unsqueeze(-1)).exp_()  # the scores' memory
                    del scores
                    update = torch.matmul(weights, block_v)
                    out[:, :, rows] = out[:, :, rows] * correction.unsqueeze(-1) + update
                    row_sum[:, :, rows] = row_sum[:, :, rows] * correction + weights.sum(dim=-1)
                    row_max[:, :, rows] = new_max
            if step < size - 1:
                k, v = _pass_on([k, v], shard)
        out = out / row_sum.unsqueeze(-1)
        log_sum_exp = row_max + torch.log(row_sum)
        ctx.save_for_backward(query, key, value, out, log_sum_exp)
        ctx.shard, ctx.scaling, ctx.schedule, ctx.masks = shard, scaling, schedule, masks
        return out.to(query.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        query, key, value, out, log_sum_exp = ctx.saved_tensors
        shard, scaling = ctx.shard, ctx.scaling
        q, k, v, d_out = query.float(), key.float(), value.float(), grad_out.float()
        # d(softmax) needs rowsum(dO * O) per query (the "delta" of the standard derivation).
        delta = (d_out * out).sum(dim=-1, keepdim=True)
        d_q = torch.zeros_like(q)
        d_k, d_v = torch.zeros_like(k), torch.zeros_like(v)  # travel with the block they belong to
        for step, blocks in enumerate(ctx.schedule):
            for block in blocks:
                block_k, block_v = k[:, :, block.keys], v[:, :, block.keys]
                for rows in _chunks(block.queries):
                    q_rows, d_out_rows = q[:, :, rows], d_out[:, :, rows]
                    # Two (B, H, chunk, Lk) float32 tensors at most: the scores become the
                    # probabilities in place, their gradient the scores' gradient in place, and
                    # each goes as soon as it is used (the same values as out of place).
                    scores = _chunk_scores(q_rows, block_k, scaling, ctx.masks.hidden(block, rows, step))
                    probs = scores.sub_(log_sum_exp[:, :, rows].unsqueeze(-1)).exp_()
                    del scores
                    d_v[:, :, block.keys] += torch.matmul(probs.transpose(-1, -2), d_out_rows)
                    d_probs = torch.matmul(d_out_rows, block_v.transpose(-1, -2))
                    d_scores = d_probs.sub_(delta[:, :, rows]).mul_(probs)
                    del probs, d_probs
                    d_q[:, :, rows] += torch.matmul(d_scores, block_k) * scaling
                    d_k[:, :, block.keys] += torch.matmul(d_scores.transpose(-1, -2), q_rows) * scaling
                    del d_scores
            # After P hops a block and its gradient accumulator are back with their owner.
            k, v, d_k, d_v = _pass_on([k, v, d_k, d_v], shard)
        return d_q.to(query.dtype), d_k.to(key.dtype), d_v.to(value.dtype), None, None, None


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    shard: SequenceShard,
    scaling: float,
    segments: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a sequence split over ``shard.group``; returns ``(B, L/P, H, D)``.

    ``query`` is ``(B, H, L/P, D)``, ``key``/``value`` ``(B, H_kv, L/P, D)`` (repeated to ``H``
    heads here; autograd sums the repeats back), each rank's positions those of
    ``shard.positions`` (already rotated with them). ``segments`` (``(B, L)`` in row order,
    packed rows): attend by :func:`parallel.packing.visible` instead of plainly causally.
    """
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = _RingAttention.apply(query, key, value, shard, scaling, segments)
    return out.transpose(1, 2)
