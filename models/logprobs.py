"""Scoring completions with the policy: per-token log-probs over the engine's exact token layout.

The trainer rebuilds each sequence as ``engine prompt ids (video placeholders expanded) +
completion ids``, puts the **cached** video embeddings in the prompt's video slots (the vision
tower does not run again), and gives every token the positions of :mod:`models.positions`,
the rule vLLM sampled with. Log-probs are of the model's own distribution (temperature 1),
as vLLM reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.positions import mrope_position_ids
from rollout.base import VideoEmbedding


@dataclass
class ScoringBatch:
    """Right-padded ``prompt + completion`` rows ready for a forward pass."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    video_mask: torch.Tensor
    """Video slots (prompt placeholders only)."""
    position_ids: torch.Tensor
    """``(3, batch, length)`` M-RoPE positions."""
    prompt_lengths: list[int]
    completion_ids: torch.Tensor
    """``(batch, max_completion_len)``, right-padded with 0."""
    completion_mask: torch.Tensor
    """``(batch, max_completion_len)``, 1.0 at real completion tokens."""

    def select(self, rows: Sequence[int]) -> ScoringBatch:
        """The given rows, in that order (a micro-batch, or the rows that train); padding columns are kept."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        return ScoringBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.video_mask[index],
            self.position_ids[:, index],
            [self.prompt_lengths[i] for i in index.tolist()],
            self.completion_ids[index],
            self.completion_mask[index],
        )


def build_scoring_batch(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    videos: Sequence[VideoEmbedding | None],
    *,
    video_token_id: int,
    pad_token_id: int,
    spatial_merge_size: int,
    tokens_per_second: float,
) -> ScoringBatch:
    """Lay out rows; ``prompt_ids`` are expanded prompts (one placeholder per visual token)."""
    rows = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
    length = max(len(r) for r in rows)
    batch = len(rows)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(batch, length, dtype=torch.long)
    video_mask = torch.zeros(batch, length, dtype=torch.bool)
    max_completion = max(1, max(len(c) for c in completion_ids))
    completions = torch.zeros(batch, max_completion, dtype=torch.long)
    completion_mask = torch.zeros(batch, max_completion)
    for i, (row, prompt, completion) in enumerate(zip(rows, prompt_ids, completion_ids, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        video_mask[i, : len(prompt)] = torch.tensor(prompt) == video_token_id
        completions[i, : len(completion)] = torch.tensor(list(completion), dtype=torch.long)
        completion_mask[i, : len(completion)] = 1.0
    with_video = [v for v in videos if v is not None]
    grids = torch.stack([v.grid_thw.reshape(3) for v in with_video]) if with_video else torch.zeros(0, 3)
    seconds = torch.tensor([v.second_per_grid for v in with_video], dtype=torch.float32)
    positions = mrope_position_ids(
        video_mask,
        attention_mask,
        grids,
        seconds,
        spatial_merge_size=spatial_merge_size,
        tokens_per_second=tokens_per_second,
    )
    return ScoringBatch(
        input_ids,
        attention_mask,
        video_mask,
        positions,
        [len(p) for p in prompt_ids],
        completions,
        completion_mask,
    )


def completion_logprobs(
    model: torch.nn.Module,
    batch: ScoringBatch,
    video_embeds: Sequence[torch.Tensor],
    entropy: torch.Tensor | None = None,
    share_prompts: bool = True,
) -> torch.Tensor:
    """``(batch, max_completion_len)`` log-probs of the completion tokens (0 where masked).

    ``video_embeds`` are the cached encodings, in row order (one per row that has a video).
    Gradients flow into the language model; into the embeddings only if they require grad.
    If ``entropy`` (a tensor shaped like the result) is given, it is filled, without
    gradient, with the entropy of the model's next-token distribution at each completion token.

    With ``share_prompts``, rows that carry the same prompt (same token ids and the same cached
    video tensor object, as the G completions of one GRPO prompt do) run that prompt once: its
    keys and values are computed once and reused, with autograd, by each of its completions.
    For a long video the prompt is most of the sequence, so this cuts the forward and backward
    work by about G times; the log-probs equal the one-row-at-a-time ones up to float rounding.
    """
    device = next(model.parameters()).device
    embeddings = input_embeddings(model, batch, video_embeds, device)
    groups = prompt_groups(batch, video_embeds) if share_prompts else []
    if len(set(groups)) < len(groups):
        first_logits, completion_logits = _shared_prompt_logits(model, batch, embeddings, groups, device)
    else:
        first_logits, completion_logits = _full_sequence_logits(model, batch, embeddings, device)
    out = torch.zeros(batch.completion_mask.shape, device=device, dtype=torch.float32)
    for i in range(len(batch.prompt_lengths)):
        n = int(batch.completion_mask[i].sum())
        if n == 0:
            continue
        step_logits = torch.cat([first_logits[i : i + 1], completion_logits[i, : n - 1]]).float()
        targets = batch.completion_ids[i, :n].to(device)
        log_probs = torch.log_softmax(step_logits, dim=-1)
        out[i, :n] = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if entropy is not None:
            with torch.no_grad():
                entropy[i, :n] = -(log_probs.exp() * log_probs).sum(-1)
    return out


def prompt_groups(batch: ScoringBatch, video_embeds: Sequence[torch.Tensor]) -> list[int]:
    """For each row, the index of the first row with the same prompt ids and the same video tensor."""
    has_video = batch.video_mask.any(dim=-1).tolist()
    videos = iter(video_embeds)
    first_row: dict[tuple[tuple[int, ...], int | None], int] = {}
    groups = []
    for i, length in enumerate(batch.prompt_lengths):
        video = id(next(videos)) if has_video[i] else None
        key = (tuple(batch.input_ids[i, :length].tolist()), video)
        groups.append(first_row.setdefault(key, i))
    return groups


def input_embeddings(
    model: torch.nn.Module, batch: ScoringBatch, video_embeds: Sequence[torch.Tensor], device: torch.device
) -> torch.Tensor:
    """Token embeddings with the cached visual tokens in the video slots."""
    embeddings = model.get_input_embeddings()(batch.input_ids.to(device))
    if not video_embeds:
        return embeddings
    cached = torch.cat([e.to(device=device, dtype=embeddings.dtype) for e in video_embeds])
    slots = batch.video_mask.to(device)
    if int(slots.sum()) != cached.shape[0]:
        raise ValueError(f"{int(slots.sum())} video slots but {cached.shape[0]} cached visual tokens")
    return embeddings.masked_scatter(slots.unsqueeze(-1), cached)


def _full_sequence_logits(
    model: torch.nn.Module, batch: ScoringBatch, embeddings: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row forwarded whole: ``(rows, vocab)`` logits predicting each row's first completion
    token and ``(rows, max_completion_len, vocab)`` logits predicting the ones after it."""
    # Position t predicts token t + 1, so the completion starting at `start` is predicted from
    # start - 1 on; logits before the shortest prompt's end are never needed (and, for a long
    # video prompt with a large vocabulary, would be the biggest tensor of the pass).
    keep_from = min(batch.prompt_lengths) - 1
    logits = model(
        inputs_embeds=embeddings,
        attention_mask=batch.attention_mask.to(device),
        position_ids=batch.position_ids.to(device),
        use_cache=False,
        logits_to_keep=embeddings.shape[1] - keep_from,
    ).logits
    width = batch.completion_mask.shape[1]
    starts = [p - 1 - keep_from for p in batch.prompt_lengths]
    first = torch.stack([logits[i, s] for i, s in enumerate(starts)])
    rest = torch.stack([_pad_columns(logits[i, s + 1 : s + width], width) for i, s in enumerate(starts)])
    return first, rest


def _shared_prompt_logits(
    model: torch.nn.Module,
    batch: ScoringBatch,
    embeddings: torch.Tensor,
    groups: list[int],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`_full_sequence_logits`, with each distinct prompt forwarded once.

    Pass 1 runs the distinct prompts (right-padded) and keeps their keys and values; pass 2
    runs every row's completion against its prompt's cache entry, the padding between a short
    prompt and its completion masked out. Positions are the rows' own M-RoPE positions.
    """
    leaders = sorted(set(groups))
    lengths = torch.tensor([batch.prompt_lengths[r] for r in leaders])
    prompt_len = int(lengths.max())
    prompt_mask = (torch.arange(prompt_len).unsqueeze(0) < lengths.unsqueeze(1)).long().to(device)
    prompt_pass = model(
        inputs_embeds=embeddings[leaders, :prompt_len],
        attention_mask=prompt_mask,
        position_ids=batch.position_ids[:, leaders, :prompt_len].to(device),
        use_cache=True,
        logits_to_keep=prompt_len - int(lengths.min()) + 1,  # only the prompts' last positions are read
    )
    last_index = lengths - int(lengths.min())
    last = prompt_pass.logits[torch.arange(len(leaders)), last_index.to(device)]
    slot = torch.tensor([leaders.index(g) for g in groups], device=device)
    cache = prompt_pass.past_key_values
    cache.batch_select_indices(slot)  # each row gets its prompt's keys and values (differentiable)

    width = batch.completion_mask.shape[1]
    starts = batch.prompt_lengths
    completion_embeds = torch.stack(
        [_pad_columns(embeddings[i, s : s + width], width) for i, s in enumerate(starts)]
    )
    positions = torch.stack(
        [_pad_columns(batch.position_ids[:, i, s : s + width], width, dim=1) for i, s in enumerate(starts)],
        dim=1,
    )
    attention_mask = torch.cat([prompt_mask[slot], batch.completion_mask.to(device).long()], dim=1)
    completion_pass = model(
        inputs_embeds=completion_embeds,
        attention_mask=attention_mask,
        position_ids=positions.to(device),
        past_key_values=cache,
        use_cache=True,
    )
    return last[slot], completion_pass.logits


def _pad_columns(values: torch.Tensor, width: int, dim: int = 0) -> torch.Tensor:
    """``values`` zero-padded (or cut) along ``dim`` to ``width``."""
    missing = width - values.shape[dim]
    if missing <= 0:
        return values.narrow(dim, 0, width)
    shape = list(values.shape)
    shape[dim] = missing
    return torch.cat([values, values.new_zeros(shape)], dim=dim)
