"""Ring attention: each rank keeps its queries; key/value blocks travel around the group.

Rank r holds block r of the sequence. In step s it attends its queries to the key/value block
of rank ``r - s`` (its own at s = 0) and passes that block on to rank ``r + 1``, combining the
partial results with the online (streaming) softmax: a running row maximum ``m``, running
normaliser ``l`` and running output. Causality by global position: blocks from earlier ranks
are attended fully, the own block causally, later blocks not at all (but still passed on).
Memory per rank is one extra key/value block, whatever P; any head count works (the Ulysses
constraint does not apply). Liu et al., "Ring Attention with Blockwise Transformers",
arXiv 2310.01889.

The backward pass is written out (a ``torch.autograd.Function``), since gradients must travel
the ring too: each rank recomputes the attention probabilities block by block from the saved
log-sum-exp, accumulates its query gradient locally, and adds the key/value gradient of each
block to an accumulator that travels with the block and arrives back at its owner after P hops.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

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


def _chunk_scores(
    query: torch.Tensor, key: torch.Tensor, scaling: float, causal_from: int | None
) -> torch.Tensor:
    """``(B, H, chunk, Lk)`` scaled scores of a query chunk against a key block.

    ``causal_from``: for the rank's own block, the index of the chunk's first query within the
    block (keys after a query are masked); None for a block that lies wholly in the past.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if causal_from is not None:
        rows = torch.arange(causal_from, causal_from + query.shape[2], device=query.device)
        future = torch.arange(key.shape[2], device=query.device).unsqueeze(0) > rows.unsqueeze(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


def _chunks(length: int) -> list[slice]:
    return [slice(start, min(start + QUERY_CHUNK, length)) for start in range(0, length, QUERY_CHUNK)]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        shard: SequenceShard,
        scaling: float,
    ) -> torch.Tensor:
        rank, size = shard.rank, shard.size
        # Scores in float32 whatever the input dtype: the running sums need the range.
        q, k, v = query.float(), key.float(), value.float()
        out = torch.zeros_like(q)
        row_max = torch.full(q.shape[:-1], float("-inf"), device=q.device)
        row_sum = torch.zeros(q.shape[:-1], device=q.device)
        for step in range(size):
            source = (rank - step) % size
            if source <= rank:  # later ranks' blocks are entirely in the future
                for rows in _chunks(q.shape[2]):
                    scores = _chunk_scores(q[:, :, rows], k, scaling, rows.start if source == rank else None)
                    new_max = torch.maximum(row_max[:, :, rows], scores.amax(dim=-1))
                    correction = torch.exp(row_max[:, :, rows] - new_max)  # exp(-inf) = 0 at first
                    weights = torch.exp(scores - new_max.unsqueeze(-1))
                    out[:, :, rows] = out[:, :, rows] * correction.unsqueeze(-1) + torch.matmul(weights, v)
                    row_sum[:, :, rows] = row_sum[:, :, rows] * correction + weights.sum(dim=-1)
                    row_max[:, :, rows] = new_max
            if step < size - 1:
                k, v = _pass_on([k, v], shard)
        out = out / row_sum.unsqueeze(-1)
        log_sum_exp = row_max + torch.log(row_sum)
        ctx.save_for_backward(query, key, value, out, log_sum_exp)
        ctx.shard, ctx.scaling = shard, scaling
        return out.to(query.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        query, key, value, out, log_sum_exp = ctx.saved_tensors
        shard, scaling = ctx.shard, ctx.scaling
        rank, size = shard.rank, shard.size
        q, k, v, d_out = query.float(), key.float(), value.float(), grad_out.float()
        # d(softmax) needs rowsum(dO * O) per query (the "delta" of the standard derivation).
        delta = (d_out * out).sum(dim=-1, keepdim=True)
        d_q = torch.zeros_like(q)
        d_k, d_v = torch.zeros_like(k), torch.zeros_like(v)  # travel with the block they belong to
        for step in range(size):
            source = (rank - step) % size
            if source <= rank:
                for rows in _chunks(q.shape[2]):
                    q_rows, d_out_rows = q[:, :, rows], d_out[:, :, rows]
                    scores = _chunk_scores(q_rows, k, scaling, rows.start if source == rank else None)
                    probs = torch.exp(scores - log_sum_exp[:, :, rows].unsqueeze(-1))
                    d_v = d_v + torch.matmul(probs.transpose(-1, -2), d_out_rows)
                    d_scores = probs * (torch.matmul(d_out_rows, v.transpose(-1, -2)) - delta[:, :, rows])
                    d_q[:, :, rows] += torch.matmul(d_scores, k) * scaling
                    d_k = d_k + torch.matmul(d_scores.transpose(-1, -2), q_rows) * scaling
            # After P hops a block and its gradient accumulator are back with their owner.
            k, v, d_k, d_v = _pass_on([k, v, d_k, d_v], shard)
        return d_q.to(query.dtype), d_k.to(key.dtype), d_v.to(value.dtype), None, None


def ring_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, shard: SequenceShard, scaling: float
) -> torch.Tensor:
    """Causal attention of a sequence split over ``shard.group``; returns ``(B, L/P, H, D)``.

    ``query`` is ``(B, H, L/P, D)``, ``key``/``value`` ``(B, H_kv, L/P, D)`` (repeated to ``H``
    heads here; autograd sums the repeats back).
    """
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = _RingAttention.apply(query, key, value, shard, scaling)
    return out.transpose(1, 2)
