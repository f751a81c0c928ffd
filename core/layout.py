"""One prompt layout from the collator to the loss.

:class:`PromptLayout` is built once per sample (by the collator): the prompt's token ids with
one placeholder per visual token, which of them are video slots, and the M-RoPE positions of
every token under :mod:`core.positions`. Everything downstream derives from it without
re-padding or re-inferring: the rollout request (collapsed for an engine that expands
placeholders itself), the position at which generation continues, and the
:class:`ScoringBatch` rows ``prompt + completion`` of the policy and reference passes, whose
completion positions simply continue the prompt's. A scoring batch knows which prompt each row
came from (``prompt_of_row``), so the G completions of a prompt share its video encoding and
its prefix without any matching of tensors; built with ``length_multiple=P`` its width divides
by the sequence-parallel group size, so each rank's slice is a plain view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.placeholders import collapse_video_placeholders
from core.positions import TemporalRule, mrope_positions_1d
from core.video import VideoEmbedding


@dataclass(frozen=True)
class PositionRule:
    """The model constants the M-RoPE rule needs; a model's comes from its family
    (:func:`families.position_rule_of`)."""

    spatial_merge_size: int
    tokens_per_second: float | None
    """Temporal positions per second of video (the ``scaled`` rule only)."""
    temporal: TemporalRule = "scaled"


@dataclass
class PromptLayout:
    """One prompt as the language model reads it (not frozen: Lightning moves its tensors)."""

    token_ids: torch.Tensor
    """``(length,)`` ids, each video placeholder repeated once per visual token."""
    video_slots: torch.Tensor
    """``(length,)`` bool, True at the video placeholders (where cached embeddings go)."""
    positions: torch.Tensor
    """``(3, length)`` M-RoPE positions (time, height, width)."""
    video_grid_thw: torch.Tensor | None
    """``(3,)`` the video's grid in patches (None: a text-only prompt)."""
    second_per_grid: float | None
    """Seconds per temporal patch of the video (None: a text-only prompt)."""
    timestamps: list[float] | None = None
    """Each temporal patch's time in seconds, for a family whose prompt writes it (Qwen3-VL)."""
    template_ids: list[int] | None = None
    """The prompt as the chat template wrote it, before the processor expanded the video, for
    an engine that expands it itself; None: collapsing each run of placeholders gives it back
    (a family whose processor writes text between frames, Qwen3-VL's timestamps, sets it)."""

    @classmethod
    def build(
        cls,
        token_ids: Sequence[int] | torch.Tensor,
        video_token_id: int,
        rule: PositionRule,
        video_grid_thw: torch.Tensor | None = None,
        second_per_grid: float | None = None,
        template_ids: Sequence[int] | None = None,
        timestamps: Sequence[float] | None = None,
    ) -> PromptLayout:
        """The layout of an expanded prompt (as the model's processor returns it); ``template_ids``:
        the prompt as the chat template wrote it, when collapsing the placeholders does not give
        it back (see :attr:`template_ids`)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        slots = ids == video_token_id
        grids = video_grid_thw.reshape(1, 3) if video_grid_thw is not None else torch.zeros(0, 3)
        seconds = torch.tensor([second_per_grid or 0.0], dtype=torch.float32)[: len(grids)]
        positions, _ = mrope_positions_1d(
            slots.tolist(),
            grids,
            seconds,
            spatial_merge_size=rule.spatial_merge_size,
            tokens_per_second=rule.tokens_per_second,
            temporal=rule.temporal,
        )
        grid = video_grid_thw.reshape(3) if video_grid_thw is not None else None
        return cls(
            ids,
            slots,
            positions,
            grid,
            second_per_grid if grid is not None else None,
            list(timestamps) if timestamps is not None and grid is not None else None,
            list(template_ids) if template_ids is not None else None,
        )

    @classmethod
    def from_processor_output(
        cls,
        encoded: Mapping[str, Any],
        row: int,
        video_token_id: int,
        rule: PositionRule,
        template_ids: Sequence[int] | None = None,
        timestamps: Sequence[float] | None = None,
    ) -> PromptLayout:
        """The layout of row ``row`` of a HF processor's output (expanded ids, one video per row;
        ``second_per_grid_ts`` as the model's family completes it,
        :meth:`families.ModelFamily.second_per_grid`)."""
        return cls.build(
            encoded["input_ids"][row],
            video_token_id,
            rule,
            encoded["video_grid_thw"][row],
            float(encoded["second_per_grid_ts"][row]),
            template_ids,
            timestamps,
        )

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def has_video(self) -> bool:
        return self.video_grid_thw is not None

    @property
    def next_position(self) -> int:
        """Position of the first generated token: one past the largest prompt position."""
        return int(self.positions.max()) + 1 if len(self) else 0

    def encoded_video(self, embeds: torch.Tensor) -> VideoEmbedding:
        """This prompt's video as encoded by the vision tower (``embeds``: its visual tokens)."""
        if self.video_grid_thw is None or self.second_per_grid is None:
            raise ValueError("a text-only prompt has no video to encode")
        return VideoEmbedding(embeds, self.video_grid_thw, self.second_per_grid, self.timestamps)

    def collapsed_ids(self) -> list[int]:
        """The prompt with one placeholder per video, as the chat template wrote it."""
        if self.template_ids is not None:
            return list(self.template_ids)
        return collapse_video_placeholders(self.token_ids.tolist(), self.video_slots.tolist())


@dataclass
class ScoringBatch:
    """Right-padded ``prompt + completion`` rows ready for a forward pass."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    video_mask: torch.Tensor
    """Video slots: the prompt's placeholders, and a tool-use episode's segments' in its completion."""
    position_ids: torch.Tensor
    """``(3, batch, length)`` M-RoPE positions (0 at padding)."""
    prompt_lengths: list[int]
    completion_ids: torch.Tensor
    """``(batch, max_completion_len)``, right-padded with 0."""
    completion_mask: torch.Tensor
    """``(batch, max_completion_len)``, 1.0 at the completion tokens the engine sampled (all real
    ones of a single-turn rollout; a tool-use episode's replies are 0)."""
    prompt_of_row: list[int]
    """Index of each row's prompt: rows with the same index share the prompt and its video."""

    def completion_lengths(self) -> list[int]:
        """Tokens after each row's prompt. For a single-turn rollout every one is sampled and
        ``completion_mask`` marks them all; in a tool-use episode the mask leaves out the tool's
        replies (:func:`core.tool_use.episode.episode_scoring_batch`)."""
        return [int(self.attention_mask[i].sum()) - p for i, p in enumerate(self.prompt_lengths)]

    def encodings_of(
        self,
        row: int,
        video_embeds: Sequence[torch.Tensor | None],
        segment_embeds: Sequence[Sequence[torch.Tensor]] | None,
        prompt: bool = True,
        segments: bool = True,
    ) -> list[torch.Tensor]:
        """The cached encodings whose visual tokens ``row`` holds, in the order they stand: its
        prompt's video (``video_embeds`` are per prompt; with ``prompt``), then its tool segments
        (``segment_embeds`` per row; with ``segments``)."""
        encodings = []
        cached = video_embeds[self.prompt_of_row[row]]
        if prompt and cached is not None:
            encodings.append(cached)
        if segments and segment_embeds is not None:
            encodings.extend(segment_embeds[row])
        return encodings

    def select(self, rows: Sequence[int]) -> ScoringBatch:
        """The given rows, in that order (a micro-batch, or the rows that train); padding columns are kept."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        picked = index.tolist()
        return ScoringBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.video_mask[index],
            self.position_ids[:, index],
            [self.prompt_lengths[i] for i in picked],
            self.completion_ids[index],
            self.completion_mask[index],
            [self.prompt_of_row[i] for i in picked],
        )

    @classmethod
    def from_layouts(
        cls,
        prompts: Sequence[PromptLayout],
        completion_ids: Sequence[Sequence[int]],
        prompt_of_row: Sequence[int],
        *,
        pad_token_id: int,
        length_multiple: int = 1,
    ) -> ScoringBatch:
        """Rows ``prompts[prompt_of_row[i]] + completion_ids[i]``, right-padded.

        Completion tokens are text after the prompt, so their positions continue from the
        prompt's :attr:`~PromptLayout.next_position` (the rule vLLM samples with). The width is
        rounded up to a multiple of ``length_multiple`` (the sequence-parallel group size).
        """
        rows = len(completion_ids)
        if len(prompt_of_row) != rows:
            raise ValueError(f"{len(prompt_of_row)} prompt indices for {rows} completions")
        lengths = [len(prompts[p]) + len(c) for p, c in zip(prompt_of_row, completion_ids, strict=True)]
        length = -(-max(lengths) // length_multiple) * length_multiple
        input_ids = torch.full((rows, length), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(rows, length, dtype=torch.long)
        video_mask = torch.zeros(rows, length, dtype=torch.bool)
        positions = torch.zeros(3, rows, length, dtype=torch.long)
        for i, (p, completion) in enumerate(zip(prompt_of_row, completion_ids, strict=True)):
            prompt = prompts[p]
            start, stop = len(prompt), lengths[i]
            input_ids[i, :start] = prompt.token_ids
            input_ids[i, start:stop] = torch.as_tensor(list(completion), dtype=torch.long)
            attention_mask[i, :stop] = 1
            video_mask[i, :start] = prompt.video_slots
            positions[:, i, :start] = prompt.positions
            first = prompt.next_position
            positions[:, i, start:stop] = torch.arange(first, first + stop - start)
        completions, completion_mask = pad_rows(completion_ids, torch.long)
        return cls(
            input_ids,
            attention_mask,
            video_mask,
            positions,
            [len(prompts[p]) for p in prompt_of_row],
            completions,
            completion_mask,
            list(prompt_of_row),
        )


def pad_rows(values: Sequence[Sequence[float]], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, max_len)`` right-padded with 0 (at least one column), and the 1.0/0.0 mask of real entries.

    >>> pad_rows([[3, 4], [5]], torch.long)
    (tensor([[3, 4],
            [5, 0]]), tensor([[1., 1.],
            [1., 0.]]))
    """
    width = max(1, max((len(v) for v in values), default=0))
    out = torch.zeros(len(values), width, dtype=dtype)
    mask = torch.zeros(len(values), width)
    for i, row in enumerate(values):
        out[i, : len(row)] = torch.as_tensor(list(row), dtype=dtype)
        mask[i, : len(row)] = 1.0
    return out, mask
