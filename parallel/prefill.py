"""Sequence-parallel prefill (MR-SP stage 2): completion log-probs with the sequence split across ranks.

Every rank of the sequence-parallel group holds the same rows (the same batch, the same cached
video embeddings). The full input embeddings are built, right-padded to a multiple of the group
size P, and each rank keeps one contiguous slice of L / P positions. Everything that depends on
the whole sequence is computed on the whole sequence before slicing: the M-RoPE positions (from
:func:`models.logprobs.build_scoring_batch`) and the next-token targets (shifted by one on the
whole row, so the token after a slice boundary is still the target of the slice's last
position). Attention crosses slices through Ulysses or ring attention
(:mod:`parallel.attention`). Each rank scores its own positions, and the per-position
log-probs are gathered so that every rank holds the full ``(rows, completion)`` tensor.

Gradients: every rank computes the same loss from the gathered log-probs, so the gather's
backward hands each rank the gradient of its own slice (no communication). Each rank's parameter
gradients are then its share; their **sum over the group** is the single-process gradient
(:func:`sum_gradients_over`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from models.logprobs import ScoringBatch, input_embeddings
from parallel.attention import SEQUENCE_PARALLEL_ATTENTION, register_sequence_parallel_attention
from parallel.shard import SequenceShard


class _GatherSlices(torch.autograd.Function):
    """All-gather along ``dim`` for a loss every rank computes identically: backward keeps own slice."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, shard: SequenceShard, dim: int) -> torch.Tensor:  # type: ignore[override]
        parts = [torch.empty_like(local) for _ in range(shard.size)]
        dist.all_gather(parts, local.contiguous(), group=shard.group)
        ctx.rank, ctx.size, ctx.dim = shard.rank, shard.size, dim
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        return grad.chunk(ctx.size, dim=ctx.dim)[ctx.rank].contiguous(), None, None


def gather_slices(local: torch.Tensor, shard: SequenceShard, dim: int = 1) -> torch.Tensor:
    """Concatenate every rank's ``local`` along ``dim`` (in rank order), differentiably."""
    return _GatherSlices.apply(local, shard, dim)


def sequence_parallel_completion_logprobs(
    model: torch.nn.Module,
    batch: ScoringBatch,
    video_embeds: Sequence[torch.Tensor],
    shard: SequenceShard,
    entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(rows, max_completion_len)`` completion log-probs, as :func:`models.logprobs.completion_logprobs`.

    The model must use the ``lvrl_sequence_parallel`` attention implementation (this function
    switches it if needed). Rows are forwarded whole (no prompt sharing).
    """
    if model.config._attn_implementation != SEQUENCE_PARALLEL_ATTENTION:
        model.set_attn_implementation(register_sequence_parallel_attention())
    device = next(model.parameters()).device
    embeddings = input_embeddings(model, batch, video_embeds, device)
    rows, length = batch.input_ids.shape
    padded = math.ceil(length / shard.size) * shard.size
    width = padded // shard.size
    # Target of position t is token t + 1 of the whole row (shift before slicing).
    targets = torch.zeros(rows, padded, dtype=torch.long)
    targets[:, : length - 1] = batch.input_ids[:, 1:]
    positions = torch.zeros(3, rows, padded, dtype=batch.position_ids.dtype)
    positions[:, :, :length] = batch.position_ids
    if padded > length:  # padding continues the last position (never read; keeps RoPE in range)
        positions[:, :, length:] = batch.position_ids[:, :, -1:] + 1
    embeddings = torch.nn.functional.pad(embeddings, (0, 0, 0, padded - length))
    first = shard.rank * width
    mine = slice(first, first + width)
    # Logits only where a completion token is predicted (from the shortest prompt's last token
    # on): for a long video, the prompt positions' full-vocabulary logits would be the largest
    # tensor of the pass. A slice that is all prompt keeps none.
    keep_from = min(max(first, min(batch.prompt_lengths) - 1), first + width)
    keep = (torch.arange(keep_from, first + width) - first).to(device)
    logits = model(
        inputs_embeds=embeddings[:, mine],
        position_ids=positions[:, :, mine].to(device),
        attention_mask=None,
        use_cache=False,
        sequence_shard=shard,
        logits_to_keep=keep,
    ).logits
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    kept_targets = targets[:, mine].to(device)[:, keep]
    local = torch.zeros(rows, width, device=device)
    local[:, keep] = log_probs.gather(-1, kept_targets.unsqueeze(-1)).squeeze(-1)
    per_position = gather_slices(local, shard, dim=1)
    if entropy is not None:
        with torch.no_grad():
            local_entropy = torch.zeros(rows, width, device=device)
            local_entropy[:, keep] = -(log_probs.exp() * log_probs).sum(-1)
            entropy_per_position = gather_slices(local_entropy, shard, dim=1)
    out = torch.zeros(batch.completion_mask.shape, device=device, dtype=torch.float32)
    for i, start in enumerate(batch.prompt_lengths):
        n = int(batch.completion_mask[i].sum())
        if n == 0:
            continue
        # Position start - 1 predicts the first completion token.
        out[i, :n] = per_position[i, start - 1 : start - 1 + n]
        if entropy is not None:
            entropy[i, :n] = entropy_per_position[i, start - 1 : start - 1 + n]
    return out


def sum_gradients_over(parameters: Sequence[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
    """All-reduce (sum) each parameter's gradient over ``group``: per-rank shares -> full gradient."""
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM, group=group)
