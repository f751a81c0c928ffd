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
) -> torch.Tensor:
    """``(batch, max_completion_len)`` log-probs of the completion tokens (0 where masked).

    ``video_embeds`` are the cached encodings, in row order (one per row that has a video).
    Gradients flow into the language model; into the embeddings only if they require grad.
    If ``entropy`` (a tensor shaped like the result) is given, it is filled, without
    gradient, with the entropy of the model's next-token distribution at each completion token.
    """
    device = next(model.parameters()).device
    input_ids = batch.input_ids.to(device)
    embeddings = model.get_input_embeddings()(input_ids)
    if video_embeds:
        cached = torch.cat([e.to(device=device, dtype=embeddings.dtype) for e in video_embeds])
        slots = batch.video_mask.to(device)
        if int(slots.sum()) != cached.shape[0]:
            raise ValueError(f"{int(slots.sum())} video slots but {cached.shape[0]} cached visual tokens")
        embeddings = embeddings.masked_scatter(slots.unsqueeze(-1), cached)
    logits = model(
        inputs_embeds=embeddings,
        attention_mask=batch.attention_mask.to(device),
        position_ids=batch.position_ids.to(device),
        use_cache=False,
    ).logits
    out = torch.zeros(batch.completion_mask.shape, device=device, dtype=torch.float32)
    for i, start in enumerate(batch.prompt_lengths):
        n = int(batch.completion_mask[i].sum())
        if n == 0:
            continue
        # Position t predicts token t + 1: the completion starts at `start`, predicted from start - 1.
        step_logits = logits[i, start - 1 : start - 1 + n].float()
        targets = batch.completion_ids[i, :n].to(device)
        log_probs = torch.log_softmax(step_logits, dim=-1)
        out[i, :n] = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if entropy is not None:
            with torch.no_grad():
                entropy[i, :n] = -(log_probs.exp() * log_probs).sum(-1)
    return out
