"""The M-RoPE position rule shared by trainer and rollout (hand-computed values)."""

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
