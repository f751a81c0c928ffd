"""Sequence-parallel prefill (MR-SP stage 2): completion log-probs with the sequence split across ranks.

Every rank of the sequence-parallel group holds the same rows (the same batch, the same cached
video embeddings). The rows come laid out with a width L that divides by the group size P
(:meth:`core.layout.ScoringBatch.from_layouts` with ``length_multiple=P``) and their input
embeddings built by the model side, so each rank keeps one contiguous slice of L / P positions
without re-padding anything. Everything that depends on the whole sequence was computed on the
whole sequence before slicing: the M-RoPE positions (in the layout) and the next-token targets
(shifted by one on the whole row, so the token after a slice boundary is still the target of
the slice's last position). This module knows no model family: it takes the embeddings.
Attention crosses slices through Ulysses or ring attention (:mod:`parallel.attention`). Each
rank scores its own positions, and the per-position log-probs are gathered so that every rank
holds the full ``(rows, completion)`` tensor.

Gradients: every rank computes the same loss from the gathered log-probs, so the gather's
backward hands each rank the gradient of its own slice (no communication). Each rank's parameter
gradients are then its share; their **sum over the group** is the single-process gradient
(:func:`sum_gradients_over`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from core.layout import ScoringBatch
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
    embeddings: torch.Tensor,
    shard: SequenceShard,
    entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(rows, max_completion_len)`` completion log-probs, as :func:`models.logprobs.completion_logprobs`.

    ``embeddings`` are the rows' ``(rows, length, hidden)`` input embeddings (video slots
    filled). The model must use the ``lvrl_sequence_parallel`` attention implementation (this
    function switches it if needed). Rows are forwarded whole (no prompt sharing).
    """
    rows, length = batch.input_ids.shape
    if length % shard.size:
        raise ValueError(
            f"rows of width {length} do not split over {shard.size} ranks: lay them out with "
            f"ScoringBatch.from_layouts(..., length_multiple={shard.size})"
        )
    if model.config._attn_implementation != SEQUENCE_PARALLEL_ATTENTION:
        model.set_attn_implementation(register_sequence_parallel_attention())
    device = embeddings.device
    width = length // shard.size
    # Target of position t is token t + 1 of the whole row (shift before slicing).
    targets = torch.zeros(rows, length, dtype=torch.long)
    targets[:, : length - 1] = batch.input_ids[:, 1:]
    positions = batch.position_ids
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
