"""Sequence-parallel prefill (MR-SP stage 2): completion log-probs with the sequence split across ranks.

Every rank of the sequence-parallel group holds the same rows (the same batch, the same cached
video embeddings), with their input embeddings built by the model side. Each rank keeps the
positions :meth:`~parallel.shard.SequenceShard.positions` gives it: one contiguous slice of
L / P (Ulysses, or ring with ``ring_layout="contiguous"``), or two chunks of L / 2P, r and
2P - 1 - r (ring's balanced ``zigzag`` layout). Rows laid out with a width that divides into
those parts (:meth:`core.layout.ScoringBatch.from_layouts` with ``length_multiple=
shard.length_multiple``) are split without copying; others are right-padded here first
(padding after every real token is never attended by one, under the causal mask).
Everything that depends on the whole sequence was computed on the whole sequence before
splitting: the M-RoPE positions (in the layout) and the next-token targets (shifted by one on
the whole row, so the token after a chunk boundary is still the target of the chunk's last
position). It takes the embeddings built by the model side; the forward is the model family's
(:meth:`families.ModelFamily.forward`, which injects Qwen3-VL's DeepStack features).
Attention crosses ranks through Ulysses or ring attention (:mod:`parallel.attention`). Each
rank scores its own positions, and the per-position log-probs are gathered back into row order
so that every rank holds the full ``(rows, completion)`` tensor. With ``share_prompts`` the rows
split are not the ``prompt + completion`` rows but one packed row per distinct prompt, its
completions after it (:mod:`parallel.packing`), the same way.

Gradients: every rank computes the same loss from the gathered log-probs, so the gather's
backward hands each rank the gradient of its own positions (no communication). Each rank's
parameter gradients are then its share; their **sum over the group** is the single-process
gradient (:func:`sum_gradients_over`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from core.layout import ScoringBatch
from families import VisualFeatures, family_of
from parallel.attention import SEQUENCE_PARALLEL_ATTENTION, register_sequence_parallel_attention
from parallel.packing import ScoringRows, shared_prompt_rows, whole_rows
from parallel.shard import SequenceShard


class _GatherSlices(torch.autograd.Function):
    """All-gather along ``dim`` into row order, for a loss every rank computes identically:
    backward keeps the rank's own positions."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, shard: SequenceShard, dim: int) -> torch.Tensor:  # type: ignore[override]
        parts = [torch.empty_like(local) for _ in range(shard.size)]
        dist.all_gather(parts, local.contiguous(), group=shard.group)
        gathered = torch.cat(parts, dim=dim)
        length = gathered.shape[dim]
        ctx.mine, ctx.dim = shard.positions(length).to(local.device), dim
        if shard.layout == "contiguous":
            return gathered  # rank order is row order
        held = torch.cat([shard.positions(length, rank) for rank in range(shard.size)]).to(local.device)
        return gathered.index_select(dim, torch.argsort(held))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        return grad.index_select(ctx.dim, ctx.mine), None, None


def gather_slices(local: torch.Tensor, shard: SequenceShard, dim: int = 1) -> torch.Tensor:
    """Every rank's ``local`` (its positions along ``dim``, in its local order) put together in
    row order, differentiably."""
    return _GatherSlices.apply(local, shard, dim)


def sequence_parallel_completion_logprobs(
    model: torch.nn.Module,
    batch: ScoringBatch,
    embeddings: torch.Tensor,
    shard: SequenceShard,
    entropy: torch.Tensor | None = None,
    share_prompts: bool = False,
    video_embeds: Sequence[torch.Tensor | None] | None = None,
    segment_embeds: Sequence[Sequence[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """``(rows, max_completion_len)`` completion log-probs, as :func:`models.logprobs.completion_logprobs`.

    ``embeddings`` are the rows' ``(rows, length, hidden)`` input embeddings (video slots
    filled). The model must use the ``lvrl_sequence_parallel`` attention implementation (this
    function switches it if needed). Rows are forwarded whole, or with ``share_prompts`` each
    distinct prompt once with all its completions packed after it
    (:func:`parallel.packing.shared_prompt_rows`: about G times less prompt work for G
    completions a prompt; the same log-probs and gradients up to float rounding). A width that
    does not divide into ``shard.length_multiple`` parts is right-padded first. ``video_embeds``
    (the prompts' cached encodings, as ``completion_logprobs`` takes them) are needed only by a
    family with per-visual-token features (Qwen3-VL's DeepStack): each rank injects those of
    its own positions' visual tokens; with them, ``segment_embeds`` (a tool-use episode's
    segments per row, as ``completion_logprobs`` takes them) too.
    """
    family = family_of(model.config)
    if model.config._attn_implementation != SEQUENCE_PARALLEL_ATTENTION:
        model.set_attn_implementation(register_sequence_parallel_attention())
    device = embeddings.device
    pack = (
        shared_prompt_rows
        if share_prompts and len(set(batch.prompt_of_row)) < len(batch.prompt_of_row)
        else None
    )
    scoring = (pack or whole_rows)(batch, embeddings).padded_to(shard.length_multiple)
    rows, length = scoring.targets.shape
    mine = shard.positions(length)
    width = len(mine)
    if shard.layout == "contiguous":  # one run of positions: a view, no copy
        local_embeddings = scoring.embeddings[:, int(mine[0]) : int(mine[0]) + width]
    else:
        local_embeddings = scoring.embeddings.index_select(1, mine.to(device))
    # Logits only where some row's sampled completion token is predicted: a long video
    # prompt's or a tool's served frames' full-vocabulary logits would be the largest tensors of
    # the pass. A rank holding only prompt positions keeps none.
    keep = torch.nonzero(scored_positions(scoring, batch.completion_mask)[mine]).squeeze(1)
    segments = {} if scoring.segments is None else {"sequence_segments": scoring.segments.to(device)}
    extra = None
    if video_embeds is not None:
        extra = family.visual_extras(_encodings_in_order(scoring, batch, video_embeds, segment_embeds))
    visual = None
    if extra is not None:
        visual = VisualFeatures(scoring.visual_mask, extra.to(device)).select(columns=mine)
        visual.mask = visual.mask.to(device)
    logits = family.forward(
        model,
        visual=visual,
        inputs_embeds=local_embeddings,
        position_ids=scoring.positions[:, :, mine].to(device),
        attention_mask=None,
        use_cache=False,
        sequence_shard=shard,
        logits_to_keep=keep.to(device),
        **segments,
    ).logits
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    kept_targets = scoring.targets[:, mine[keep]].to(device)
    keep = keep.to(device)
    local = torch.zeros(rows, width, device=device)
    local[:, keep] = log_probs.gather(-1, kept_targets.unsqueeze(-1)).squeeze(-1)
    per_position = gather_slices(local, shard, dim=1)
    if entropy is not None:
        with torch.no_grad():
            local_entropy = torch.zeros(rows, width, device=device)
            local_entropy[:, keep] = -(log_probs.exp() * log_probs).sum(-1)
            entropy_per_position = gather_slices(local_entropy, shard, dim=1)
    out = torch.zeros(batch.completion_mask.shape, device=device, dtype=torch.float32)
    for i, (row, first, n) in enumerate(scoring.spans):
        if n == 0:
            continue
        out[i, :n] = per_position[row, first : first + n]
        if entropy is not None:
            entropy[i, :n] = entropy_per_position[row, first : first + n]
    # A tool-use episode's replies were read, not sampled: no log-prob (a no-op on single-turn rows).
    mask = batch.completion_mask.to(device)
    if entropy is not None:
        entropy.mul_(mask)
    return out * mask


def scored_positions(scoring: ScoringRows, completion_mask: torch.Tensor) -> torch.Tensor:
    """``(length,)`` True at the positions of ``scoring``'s rows where some row predicts a sampled
    completion token (``completion_mask``, per batch row): where logits are needed.

    >>> from types import SimpleNamespace
    >>> rows = SimpleNamespace(targets=torch.zeros(2, 8), spans=[(0, 2, 4), (1, 3, 3)])
    >>> mask = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    >>> scored_positions(rows, mask).nonzero().squeeze(1).tolist()
    [2, 3, 4, 5]
    """
    scored = torch.zeros(scoring.targets.shape[1], dtype=torch.bool)
    for i, (_, first, n) in enumerate(scoring.spans):
        scored[first + torch.nonzero(completion_mask[i, :n] > 0).squeeze(1)] = True
    return scored


def _encodings_in_order(
    scoring: ScoringRows,
    batch: ScoringBatch,
    video_embeds: Sequence[torch.Tensor | None],
    segment_embeds: Sequence[Sequence[torch.Tensor]] | None,
) -> list[torch.Tensor]:
    """The cached encodings whose visual tokens ``scoring``'s rows hold, in the order they stand:
    per row, its prompt's video, then the tool segments of each completion it holds."""
    encodings = []
    for source, completions in zip(scoring.source_rows, scoring.segment_rows, strict=True):
        encodings += batch.encodings_of(source, video_embeds, None)
        for row in completions:
            encodings += batch.encodings_of(row, video_embeds, segment_embeds, prompt=False)
    return encodings


def sum_gradients_over(parameters: Sequence[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
    """All-reduce (sum) each parameter's gradient over ``group``: per-rank shares -> full gradient."""
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM, group=group)
