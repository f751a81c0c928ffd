"""One prompt layout: scoring rows derived from it equal the rows laid out and positioned whole."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers.tolerances import assert_identical

from core.layout import PositionRule, PromptLayout, ScoringBatch
from core.positions import mrope_position_ids
from families import family_of

VIDEO = 9


def test_completion_positions_continue_the_prompt_like_whole_rows(
    tiny_model_dir: Path, synth_dir: Path
) -> None:
    from transformers import AutoConfig, AutoProcessor

    from datamodules.collate import VideoQACollator
    from datamodules.shards import resolve_shards
    from datamodules.stream import VideoQAStream

    family = family_of(AutoConfig.from_pretrained(tiny_model_dir))
    rule = family.position_rule
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = [s for _, s in zip(range(2), stream, strict=False)]
    batch = VideoQACollator(AutoProcessor.from_pretrained(tiny_model_dir), family=family)(samples)
    owners = [0, 1, 1, 0]
    video_id = int(batch["prompts"][0].token_ids[batch["prompts"][0].video_slots][0])
    # A completion may contain the placeholder id: it is text there.
    completions = [[5, 6, 7, 8], [], [video_id, 3, 4, 5, 6, 7, 8], [video_id, 2]]
    rows = ScoringBatch.from_layouts(batch["prompts"], completions, owners, pad_token_id=0)
    # The rule applied to each whole row (prompt + completion), as rows used to be laid out.
    whole = mrope_position_ids(
        rows.video_mask,
        rows.attention_mask,
        batch["video_grid_thw"][owners],
        batch["second_per_grid_ts"][owners],
        spatial_merge_size=rule.spatial_merge_size,
        tokens_per_second=rule.tokens_per_second,
    )
    assert_identical(rows.position_ids, whole, reason="layout + continuation vs the rule on whole rows")
    assert rows.prompt_lengths == [len(batch["prompts"][k]) for k in owners]


def test_a_placeholder_id_in_a_completion_is_text() -> None:
    rule = PositionRule(spatial_merge_size=2, tokens_per_second=2.0)
    layout = PromptLayout.build([1, VIDEO, VIDEO, 2], VIDEO, rule, torch.tensor([2, 2, 2]), 1.0)
    assert layout.video_slots.tolist() == [False, True, True, False]
    assert layout.collapsed_ids() == [1, VIDEO, 2]
    batch = ScoringBatch.from_layouts([layout], [[VIDEO, 5]], [0], pad_token_id=0)
    assert batch.video_mask.tolist() == [[False, True, True, False, False, False]]
    # Text after the video continues one past the largest position; the completion goes on from there.
    last_prompt = int(layout.positions[:, -1].max())
    assert batch.position_ids[:, 0, 4:].tolist() == [[last_prompt + 1, last_prompt + 2]] * 3


def test_sequence_parallel_width_only_adds_padding() -> None:
    layouts = [
        PromptLayout.build([1, 2, 3], -1, PositionRule(2, 2.0)),
        PromptLayout.build([4, 5, 6, 7, 8], -1, PositionRule(2, 2.0)),
    ]
    completions, owners = [[9], [10, 11, 12], []], [1, 0, 1]
    plain = ScoringBatch.from_layouts(layouts, completions, owners, pad_token_id=0)
    split = ScoringBatch.from_layouts(layouts, completions, owners, pad_token_id=0, length_multiple=4)
    assert plain.input_ids.shape[1] == 6 and split.input_ids.shape[1] == 8
    for name in ("input_ids", "attention_mask", "video_mask"):
        assert_identical(getattr(split, name)[:, :6], getattr(plain, name), reason=name)
        assert not getattr(split, name)[:, 6:].any()
    assert_identical(split.position_ids[..., :6], plain.position_ids, reason="positions")
    assert split.completion_mask.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    picked = split.select([2, 0])
    assert picked.prompt_of_row == [1, 1] and picked.prompt_lengths == [5, 5]
