"""Packing each prompt once with its completions (the rows sequence parallelism forwards).

What the packed rows compute is checked against one process in
``tests/distributed/test_sequence_parallel.py`` (log-probs, entropy, gradients); here, what
they hold: every completion token at the position, embedding and target it has in its whole row.
"""

from __future__ import annotations

import torch
from helpers.tolerances import assert_identical

from core.layout import PositionRule, PromptLayout, ScoringBatch
from parallel.packing import PADDING, SHARED, shared_prompt_rows, whole_rows


def batch_of_two_prompts() -> ScoringBatch:
    rule = PositionRule(2, 2.0)
    prompts = [PromptLayout.build([11, 12, 13, 14], -1, rule), PromptLayout.build([21, 22], -1, rule)]
    # Rows 0, 2, 3 share prompt 0; row 3's completion is empty.
    return ScoringBatch.from_layouts(
        prompts, [[31, 32], [41, 42, 43], [51], []], [0, 1, 0, 0], pad_token_id=0, length_multiple=1
    )


def test_each_prompt_once_then_its_completions() -> None:
    batch = batch_of_two_prompts()
    embeddings = torch.randn(*batch.input_ids.shape, 3, generator=torch.Generator().manual_seed(0))
    packed = shared_prompt_rows(batch, embeddings)
    # Prompt 0: 3 shared tokens, then [14 31 32], [14 51], [14]; prompt 1: [21], then [22 41 42 43].
    assert packed.segments is not None
    assert packed.segments.tolist() == [
        [SHARED] * 3 + [1, 1, 1, 2, 2, 3],
        [SHARED, 1, 1, 1, 1] + [PADDING] * 4,
    ]
    assert packed.targets.tolist() == [[12, 13, 0, 31, 32, 0, 51, 0, 0], [0, 41, 42, 43, 0, 0, 0, 0, 0]]
    assert packed.spans == [(0, 3, 2), (1, 1, 3), (0, 6, 1), (0, 8, 0)]
    # Each span's positions carry the row's own embeddings and M-RoPE positions, and predict
    # its completion tokens, exactly as positions start - 1 ... of the whole row do.
    whole = whole_rows(batch, embeddings)
    for (row, first, count), (same_row, whole_first, same_count) in zip(
        packed.spans, whole.spans, strict=True
    ):
        assert count == same_count
        take, whole_take = slice(first, first + count), slice(whole_first, whole_first + count)
        why = f"row {same_row}: packed copies of its whole row"
        assert_identical(packed.embeddings[row, take], embeddings[same_row, whole_take], reason=why)
        assert_identical(
            packed.positions[:, row, take], batch.position_ids[:, same_row, whole_take], reason=why
        )
        assert_identical(packed.targets[row, take], whole.targets[same_row, whole_take], reason=why)


def test_padding_to_a_multiple() -> None:
    batch = batch_of_two_prompts()
    packed = shared_prompt_rows(batch, torch.zeros(*batch.input_ids.shape, 2)).padded_to(4)
    assert packed.targets.shape == (2, 12)
    assert packed.segments is not None and packed.segments[:, 9:].eq(PADDING).all()
    plain = whole_rows(batch, torch.zeros(*batch.input_ids.shape, 2))
    assert plain.padded_to(1) is plain
    assert plain.padded_to(4).embeddings.shape[1] % 4 == 0
