"""The rows a sequence-parallel scoring pass forwards: every row whole, or each prompt once.

Forwarding the G completions of a prompt as G whole rows repeats the prompt G times; for a long
video the prompt is nearly all of the row. :func:`shared_prompt_rows` packs each distinct
prompt with all of its completions into one row instead::

    prompt[:-1] | prompt[-1] completion_1 | prompt[-1] completion_2 | ...
    segment 0   | segment 1               | segment 2               | ...

and attention follows :func:`visible`: a position sees the earlier positions of the shared
segment 0 and of its own segment, never another completion's. Each completion segment starts
with its own copy of the prompt's last token (which predicts the completion's first token and
sees exactly what it sees in the whole row), and keeps the positions (M-RoPE) it has in its
whole row, so every position computes what it computes in its whole row: the same log-probs up
to float rounding, with about G times less prompt work. The packed row is one long sequence,
so sequence parallelism splits it like any other (``parallel/prefill.py``), and Ulysses and
ring attention apply the segment rule (``parallel/ulysses.py``, ``parallel/ring.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.layout import ScoringBatch

SHARED, PADDING = 0, -1
"""Segment ids: the shared prompt, and padding after a row's last real position."""


@dataclass
class ScoringRows:
    """Rows ready to split across ranks, and where each completion's log-probs are read."""

    embeddings: torch.Tensor
    """``(rows, length, hidden)`` input embeddings (video slots filled)."""
    positions: torch.Tensor
    """``(3, rows, length)`` M-RoPE positions."""
    targets: torch.Tensor
    """``(rows, length)`` the token each position predicts (0 where none is read)."""
    segments: torch.Tensor | None
    """``(rows, length)`` segment ids for packed rows (see :func:`visible`); None: plain causal rows."""
    spans: list[tuple[int, int, int]]
    """Per batch row ``(row, first, count)``: positions ``first .. first + count - 1`` of ``row``
    predict its ``count`` completion tokens."""
    visual_mask: torch.Tensor
    """``(rows, length)`` True at the video slots (a family with per-visual-token features, Qwen3-VL's
    DeepStack, injects them there)."""
    source_rows: list[int]
    """The batch row whose prompt (and video) each row holds."""
    segment_rows: list[list[int]]
    """The batch rows whose completions (and their tool segments, in a tool-use episode) each
    row holds, in order: a row's visual tokens are its prompt video's, then those segments'."""

    def padded_to(self, multiple: int) -> ScoringRows:
        """Right-padded to a width that divides by ``multiple`` (padding is never attended by a
        real position: it comes after all of them)."""
        length = self.embeddings.shape[1]
        missing = -length % multiple
        if not missing:
            return self
        rows, hidden = self.embeddings.shape[0], self.embeddings.shape[2]
        pad = torch.nn.functional.pad
        return ScoringRows(
            torch.cat([self.embeddings, self.embeddings.new_zeros(rows, missing, hidden)], dim=1),
            pad(self.positions, (0, missing)),
            pad(self.targets, (0, missing)),
            None if self.segments is None else pad(self.segments, (0, missing), value=PADDING),
            self.spans,
            pad(self.visual_mask, (0, missing), value=False),
            self.source_rows,
            self.segment_rows,
        )


def visible(
    query_index: torch.Tensor, key_index: torch.Tensor, query_segment: torch.Tensor, key_segment: torch.Tensor
) -> torch.Tensor:
    """Whether a query sees a key (broadcasting): an earlier or equal position, in the shared
    segment or in the query's own.

    >>> index = torch.arange(5)
    >>> segment = torch.tensor([0, 0, 1, 2, 2])  # shared prompt, then two completions
    >>> visible(index[:, None], index[None, :], segment[:, None], segment[None, :]).int()
    tensor([[1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 0, 1, 0],
            [1, 1, 0, 1, 1]], dtype=torch.int32)
    """
    return (key_index <= query_index) & ((key_segment == SHARED) | (key_segment == query_segment))


def whole_rows(batch: ScoringBatch, embeddings: torch.Tensor) -> ScoringRows:
    """Every ``prompt + completion`` row as it is: position ``start - 1`` predicts the first token."""
    rows, length = batch.input_ids.shape
    # Target of position t is token t + 1 of the whole row (shifted before any split).
    targets = torch.zeros(rows, length, dtype=torch.long)
    targets[:, : length - 1] = batch.input_ids[:, 1:]
    spans = [(i, start - 1, completion_count(batch, i)) for i, start in enumerate(batch.prompt_lengths)]
    return ScoringRows(
        embeddings,
        batch.position_ids,
        targets,
        None,
        spans,
        batch.video_mask,
        list(range(rows)),
        [[row] for row in range(rows)],
    )


def shared_prompt_rows(batch: ScoringBatch, embeddings: torch.Tensor) -> ScoringRows:
    """One packed row per distinct prompt (see the module docstring), its rows' completions in
    batch order. The shared part's embeddings are the prompt's first row's."""
    leaders: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    for row, prompt in enumerate(batch.prompt_of_row):
        leaders.setdefault(prompt, row)
        members.setdefault(prompt, []).append(row)
    pieces = []
    spans: dict[int, tuple[int, int, int]] = {}
    for packed, (prompt, leader) in enumerate(leaders.items()):
        start = batch.prompt_lengths[leader]
        ids, parts, positions, segments, visual = [], [], [], [], []
        shared = slice(0, start - 1)
        ids.append(batch.input_ids[leader, shared])
        visual.append(batch.video_mask[leader, shared])
        parts.append(embeddings[leader, shared])
        positions.append(batch.position_ids[:, leader, shared])
        segments.append(torch.full((start - 1,), SHARED, dtype=torch.long))
        first = start - 1
        for segment, row in enumerate(members[prompt], start=1):
            count = completion_count(batch, row)
            own = slice(start - 1, start + count)  # the prompt's last token, then the completion
            ids.append(batch.input_ids[row, own])
            visual.append(batch.video_mask[row, own])  # a tool-use episode's segments
            parts.append(embeddings[row, own])
            positions.append(batch.position_ids[:, row, own])
            segments.append(torch.full((count + 1,), segment, dtype=torch.long))
            spans[row] = (packed, first, count)
            first += count + 1
        token_ids = torch.cat(ids)
        # Position t predicts token t + 1 within its segment; a segment's last position, nothing.
        targets = torch.zeros_like(token_ids)
        segment_ids = torch.cat(segments)
        follows = segment_ids[1:] == segment_ids[:-1]
        targets[:-1] = torch.where(follows, token_ids[1:], 0)
        pieces.append(
            (torch.cat(parts), torch.cat(positions, dim=1), targets, segment_ids, torch.cat(visual))
        )
    width = max(len(p[2]) for p in pieces)
    rows, hidden = len(pieces), embeddings.shape[2]
    packed_embeddings = embeddings.new_zeros(rows, width, hidden)
    packed_positions = torch.zeros(3, rows, width, dtype=batch.position_ids.dtype)
    packed_targets = torch.zeros(rows, width, dtype=torch.long)
    packed_segments = torch.full((rows, width), PADDING, dtype=torch.long)
    packed_visual = torch.zeros(rows, width, dtype=torch.bool)
    for row, (row_embeddings, row_positions, row_targets, row_segments, row_visual) in enumerate(pieces):
        length = len(row_targets)
        packed_embeddings[row, :length] = row_embeddings
        packed_positions[:, row, :length] = row_positions
        packed_targets[row, :length] = row_targets
        packed_segments[row, :length] = row_segments
        packed_visual[row, :length] = row_visual
    return ScoringRows(
        packed_embeddings,
        packed_positions,
        packed_targets,
        packed_segments,
        [spans[row] for row in range(len(batch.prompt_of_row))],
        packed_visual,
        list(leaders.values()),
        [members[prompt] for prompt in leaders],
    )


def completion_count(batch: ScoringBatch, row: int) -> int:
    """Tokens after ``row``'s prompt (a tool-use episode's replies included: they are scored
    where they stand, and ``completion_mask`` leaves them out afterwards)."""
    return int(batch.attention_mask[row].sum()) - batch.prompt_lengths[row]
