"""Scoring completions with the policy: per-token log-probs over the prompts' own layout.

A :class:`~core.layout.ScoringBatch` row is ``prompt layout (video placeholders expanded) +
completion ids`` with the positions of :mod:`core.positions`, the rule the engine sampled
with; here the **cached** video embeddings go into the prompt's video slots (the vision tower
does not run again). Log-probs are of the model's own distribution (temperature 1), as vLLM
reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from core.layout import ScoringBatch
from families import ModelFamily, VisualFeatures, family_of


def completion_logprobs(
    model: torch.nn.Module,
    batch: ScoringBatch,
    video_embeds: Sequence[torch.Tensor | None],
    entropy: torch.Tensor | None = None,
    share_prompts: bool = True,
    segment_embeds: Sequence[Sequence[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """``(batch, max_completion_len)`` log-probs of the completion tokens (0 where masked).

    ``video_embeds`` are the cached encodings per prompt, indexed like ``batch.prompt_of_row``
    (None for a prompt without video). Gradients flow into the language model; into the
    embeddings only if they require grad.
    If ``entropy`` (a tensor shaped like the result) is given, it is filled, without
    gradient, with the entropy of the model's next-token distribution at each scored completion
    token (0 elsewhere).

    With ``share_prompts``, rows of the same prompt (the G completions of one GRPO prompt) run
    that prompt once: its
    keys and values are computed once and reused, with autograd, by each of its completions.
    For a long video the prompt is most of the sequence, so this cuts the forward and backward
    work by about G times; the log-probs equal the one-row-at-a-time ones up to float rounding.

    ``segment_embeds`` (tool-use episodes, :func:`core.tool_use.episode.episode_scoring_batch`): per row,
    the encodings of the video segments the tool put into its completion, in order; the tokens
    the tool wrote get log-prob 0 (``completion_mask`` leaves them out), and no logits are
    computed for them.
    """
    device = next(model.parameters()).device
    family = family_of(model.config)
    embeddings = input_embeddings(model, batch, video_embeds, device, segment_embeds)
    scored = scored_tokens(batch)
    if entropy is not None:
        entropy.zero_()
    out = torch.zeros(batch.completion_mask.shape, device=device, dtype=torch.float32)
    if not any(len(tokens) for tokens in scored):
        return out
    groups = first_row_of_prompt(batch) if share_prompts else []
    if len(set(groups)) < len(groups):
        row_logits = _shared_prompt_logits(
            model, family, batch, embeddings, video_embeds, segment_embeds, groups, scored, device
        )
    else:
        rows = range(len(batch.prompt_of_row))
        encodings = [e for row in rows for e in batch.encodings_of(row, video_embeds, segment_embeds)]
        visual = _visual(family, batch.video_mask, encodings)
        row_logits = _full_sequence_logits(model, family, batch, embeddings, visual, scored, device)
    for i, tokens in enumerate(scored):
        if len(tokens) == 0:
            continue
        log_probs = torch.log_softmax(row_logits[i].float(), dim=-1)
        targets = batch.completion_ids[i, tokens].to(device)
        columns = tokens.to(device)
        out[i, columns] = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if entropy is not None:
            with torch.no_grad():
                entropy[i, columns] = -(log_probs.exp() * log_probs).sum(-1)
    return out


def scored_tokens(batch: ScoringBatch) -> list[torch.Tensor]:
    """Per row, the completion indices that get a log-prob: the sampled tokens
    (``completion_mask``). A tool-use episode's replies are read, not sampled; their tokens (a
    served segment's video tokens: thousands at real frame sizes) get no logits at all.

    >>> from types import SimpleNamespace
    >>> mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    >>> scored_tokens(SimpleNamespace(completion_mask=mask))
    [tensor([0, 1, 4]), tensor([0, 1, 2])]
    """
    return [torch.nonzero(row > 0).squeeze(1) for row in batch.completion_mask]


def first_row_of_prompt(batch: ScoringBatch) -> list[int]:
    """For each row, the first row of the batch with the same prompt.

    >>> from types import SimpleNamespace
    >>> first_row_of_prompt(SimpleNamespace(prompt_of_row=[3, 3, 5, 3]))
    [0, 0, 2, 0]
    """
    first: dict[int, int] = {}
    return [first.setdefault(prompt, row) for row, prompt in enumerate(batch.prompt_of_row)]


def input_embeddings(
    model: torch.nn.Module,
    batch: ScoringBatch,
    video_embeds: Sequence[torch.Tensor | None],
    device: torch.device,
    segment_embeds: Sequence[Sequence[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Token embeddings with each row's cached visual tokens in its video slots: its prompt's,
    then its tool segments' (the placeholder part of each cached encoding,
    :meth:`families.ModelFamily.split_encoding`)."""
    embeddings = model.get_input_embeddings()(batch.input_ids.to(device))
    present = [
        encoding
        for row in range(len(batch.prompt_of_row))
        for encoding in batch.encodings_of(row, video_embeds, segment_embeds)
    ]
    if not present:
        return embeddings
    family = family_of(model.config)
    cached = torch.cat(
        [family.split_encoding(e)[0].to(device=device, dtype=embeddings.dtype) for e in present]
    )
    slots = batch.video_mask.to(device)
    if int(slots.sum()) != cached.shape[0]:
        raise ValueError(f"{int(slots.sum())} video slots but {cached.shape[0]} cached visual tokens")
    return embeddings.masked_scatter(slots.unsqueeze(-1), cached)


def _visual(
    family: ModelFamily, mask: torch.Tensor, encodings: Sequence[torch.Tensor]
) -> VisualFeatures | None:
    """The features to inject at the visual tokens ``mask`` marks, which hold ``encodings`` in order."""
    extra = family.visual_extras(encodings)
    if extra is None:
        return None
    return VisualFeatures(mask.to(extra.device), extra)


def _full_sequence_logits(
    model: torch.nn.Module,
    family: ModelFamily,
    batch: ScoringBatch,
    embeddings: torch.Tensor,
    visual: VisualFeatures | None,
    scored: Sequence[torch.Tensor],
    device: torch.device,
) -> list[torch.Tensor]:
    """Every row forwarded whole: per row, the ``(len(scored[i]), vocab)`` logits predicting its
    scored completion tokens."""
    # Position t predicts token t + 1, so completion token j of a row whose prompt has p tokens
    # is predicted at p - 1 + j. Logits are computed only at the positions some row needs: the
    # rest (a long video prompt, a tool's served frames) would be the largest tensors of the pass.
    wanted = [p - 1 + tokens for p, tokens in zip(batch.prompt_lengths, scored, strict=True)]
    keep = torch.unique(torch.cat(wanted))  # sorted
    logits = family.forward(
        model,
        visual=visual,
        inputs_embeds=embeddings,
        attention_mask=batch.attention_mask.to(device),
        position_ids=batch.position_ids.to(device),
        use_cache=False,
        logits_to_keep=keep.to(device),
    ).logits
    # unbind, not logits[i]: each indexed row's backward would be a zero-filled gradient the size
    # of all the logits (1.9 GB a row with a 152k vocabulary), once per row.
    return [
        row.index_select(0, torch.searchsorted(keep, w).to(device))
        for row, w in zip(logits.unbind(0), wanted, strict=True)
    ]


def _shared_prompt_logits(
    model: torch.nn.Module,
    family: ModelFamily,
    batch: ScoringBatch,
    embeddings: torch.Tensor,
    video_embeds: Sequence[torch.Tensor | None],
    segment_embeds: Sequence[Sequence[torch.Tensor]] | None,
    groups: list[int],
    scored: Sequence[torch.Tensor],
    device: torch.device,
) -> list[torch.Tensor]:
    """Like :func:`_full_sequence_logits`, with each distinct prompt forwarded once.

    Pass 1 runs the distinct prompts (right-padded) and keeps their keys and values; pass 2
    runs every row's completion against its prompt's cache entry, the padding between a short
    prompt and its completion masked out. Positions are the rows' own M-RoPE positions.
    """
    leaders = sorted(set(groups))
    lengths = torch.tensor([batch.prompt_lengths[r] for r in leaders])
    prompt_len = int(lengths.max())
    prompt_mask = (torch.arange(prompt_len).unsqueeze(0) < lengths.unsqueeze(1)).long().to(device)
    # Per-visual-token features: the prompts' videos' in this pass, a tool-use episode's segments'
    # (in its completion) in the next.
    prompt_videos = [e for row in leaders for e in batch.encodings_of(row, video_embeds, None)]
    visual = _visual(family, batch.video_mask[leaders, :prompt_len], prompt_videos)
    prompt_pass = family.forward(
        model,
        visual=visual,
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
    _select_prompt_rows(cache, slot)  # each row gets its prompt's keys and values (differentiable)

    width = batch.completion_mask.shape[1]
    starts = batch.prompt_lengths
    completion_embeds = torch.stack(
        [_pad_columns(embeddings[i, s : s + width], width) for i, s in enumerate(starts)]
    )
    positions = torch.stack(
        [_pad_columns(batch.position_ids[:, i, s : s + width], width, dim=1) for i, s in enumerate(starts)],
        dim=1,
    )
    lengths_after = torch.tensor(batch.completion_lengths()).unsqueeze(1)
    completion_attention = (torch.arange(width).unsqueeze(0) < lengths_after).long().to(device)
    attention_mask = torch.cat([prompt_mask[slot], completion_attention], dim=1)
    completion_slots = torch.stack(
        [_pad_columns(batch.video_mask[i, s : s + width], width) for i, s in enumerate(starts)]
    )
    segments = [
        encoding
        for row in range(len(starts))
        for encoding in batch.encodings_of(row, video_embeds, segment_embeds, prompt=False)
    ]
    # Completion column c predicts token c + 1 (token 0 is predicted by the prompt's last
    # position): logits only at the columns some row's scored tokens need.
    wanted = [tokens[tokens > 0] - 1 for tokens in scored]
    keep = torch.unique(torch.cat(wanted))
    completion_logits = family.forward(
        model,
        visual=_visual(family, completion_slots, segments),
        inputs_embeds=completion_embeds,
        attention_mask=attention_mask,
        position_ids=positions.to(device),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=keep.to(device),
    ).logits
    first = last.index_select(0, slot)
    out = []
    # unbind, not [i]: an indexed row's backward is a zero-filled gradient the size of the whole tensor.
    rows = zip(scored, wanted, completion_logits.unbind(0), first.unbind(0), strict=True)
    for tokens, w, row, first_of_row in rows:
        rest = row.index_select(0, torch.searchsorted(keep, w).to(device))
        out.append(torch.cat([first_of_row.unsqueeze(0), rest]) if len(tokens) and tokens[0] == 0 else rest)
    return out


def _select_prompt_rows(cache: Any, slot: torch.Tensor) -> None:
    """``cache.batch_select_indices(slot)`` with a backward that is the same in every run.

    Advanced indexing (what transformers' ``batch_select_indices`` does) differentiates into
    ``index_put_(accumulate=True)``, which on more than one CPU thread adds the G rows'
    gradients into their shared prompt with atomic float adds in whatever order the threads
    reach them: the update then differs between identical runs in the last bits (measured with
    two threads: 227 of 300 repeats of one (4 rows, 2 heads, 150 tokens, 32) selection differed
    from the first). ``index_select`` differentiates into ``index_add_``, which adds in row
    order.
    """
    for layer in cache.layers:
        if type(layer).batch_select_indices is not DynamicLayer.batch_select_indices:
            layer.batch_select_indices(slot)  # a layer with state of its own: its own selection
        elif layer.get_seq_length() > 0:
            layer.keys = layer.keys.index_select(0, slot)
            layer.values = layer.values.index_select(0, slot)


def _pad_columns(values: torch.Tensor, width: int, dim: int = 0) -> torch.Tensor:
    """``values`` zero-padded (or cut) along ``dim`` to ``width``."""
    missing = width - values.shape[dim]
    if missing <= 0:
        return values.narrow(dim, 0, width)
    shape = list(values.shape)
    shape[dim] = missing
    return torch.cat([values, values.new_zeros(shape)], dim=dim)
