"""The M-RoPE position rule shared by trainer and rollout (hand-computed values)."""

import pytest
import torch

from core.positions import mrope_position_ids, mrope_positions_1d


def test_text_video_text_positions_by_hand() -> None:
    # 2 text tokens, a video of 2 temporal patches x (2x2 patches -> 1 merged token each) = 2 slots, 2 text.
    flags = [False, False, True, True, False, False]
    grid = torch.tensor([[2, 2, 2]])
    # 1.5 s per temporal patch at 2 tokens/s -> t_factor 3: temporal indices 0 and 3.
    positions, delta = mrope_positions_1d(
        flags, grid, torch.tensor([1.5]), spatial_merge_size=2, tokens_per_second=2
    )
    assert positions.tolist() == [
        [0, 1, 2, 5, 6, 7],  # time: text 0,1; video starts at 2 -> 2+0, 2+3; text resumes at max+1 = 6
        [0, 1, 2, 2, 6, 7],  # height
        [0, 1, 2, 2, 6, 7],  # width
    ]
    assert delta == 8 - 6


def test_generated_placeholder_ids_are_text_and_padding_is_ignored() -> None:
    video_mask = torch.tensor([[0, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    attention = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]])  # row 1 is left-padded
    # Row 1's first valid token is not a video slot: its mask is [1 (pad), 1, 0, 0, 0] -> one slot.
    grids = torch.tensor([[2, 2, 2], [2, 2, 2]])
    grids[1] = torch.tensor([1, 2, 2])
    positions = mrope_position_ids(
        video_mask, attention, grids, torch.tensor([1.0, 1.0]), spatial_merge_size=2, tokens_per_second=2
    )
    assert positions[0, 0].tolist() == [0, 1, 3, 4, 0]
    assert positions[0, 1].tolist() == [0, 0, 1, 2, 3]


def test_qwen2_vl_index_rule_by_hand() -> None:
    # Same prompt as above: Qwen2-VL's temporal index is the patch's index, whatever the seconds.
    flags = [False, False, True, True, False, False]
    positions, delta = mrope_positions_1d(
        flags,
        torch.tensor([[2, 2, 2]]),
        torch.tensor([1.5]),
        spatial_merge_size=2,
        tokens_per_second=None,
        temporal="index",
    )
    assert positions.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 2, 4, 5], [0, 1, 2, 2, 4, 5]]
    assert delta == 0


def test_qwen3_vl_frames_rule_by_hand() -> None:
    # 1 text token, then 2 temporal patches of 2x4 patches (1x2 merged tokens each), each its own
    # run with one timestamp token between: each run has t = 0 and starts one past the last max.
    flags = [False, True, True, False, True, True, False]
    positions, delta = mrope_positions_1d(
        flags,
        torch.tensor([[2, 2, 4]]),
        torch.tensor([9.0]),
        spatial_merge_size=2,
        tokens_per_second=None,
        temporal="frames",
    )
    assert positions.tolist() == [
        [0, 1, 1, 3, 4, 4, 6],  # time: each run at its start (no temporal offset); text at max + 1
        [0, 1, 1, 3, 4, 4, 6],  # height: one row of merged tokens
        [0, 1, 2, 3, 4, 5, 6],  # width: two columns
    ]
    assert delta == 0
    with pytest.raises(ValueError, match="frame run 1"):
        mrope_positions_1d(
            [True, True, False, True],
            torch.tensor([[2, 2, 4]]),
            torch.tensor([1.0]),
            spatial_merge_size=2,
            tokens_per_second=None,
            temporal="frames",
        )


def test_frames_rule_in_a_padded_batch_matches_rows_alone() -> None:
    flags = [[False, True, False, True, False, False], [True, False, True, False, True, False]]
    grids = torch.tensor([[2, 2, 2], [3, 2, 2]])  # row 0: a 2-patch video, row 1: a 3-patch one
    mask = torch.tensor(flags)
    positions = mrope_position_ids(
        mask,
        torch.ones(2, 6, dtype=torch.long),
        grids,
        torch.tensor([1.0, 1.0]),
        spatial_merge_size=2,
        tokens_per_second=None,
        temporal="frames",
    )
    for row in range(2):
        alone, _ = mrope_positions_1d(
            flags[row],
            grids[row : row + 1],
            torch.tensor([1.0]),
            spatial_merge_size=2,
            tokens_per_second=None,
            temporal="frames",
        )
        assert torch.equal(positions[:, row], alone)
