"""One M-RoPE position rule for training and rollout.

Qwen2.5-VL gives every token three position indices (time, height, width). Text tokens get
the same index on all three axes; the tokens of a video get ``(t * t_factor, h, w)`` offset
by the position where the video starts, with ``t_factor = second_per_grid_ts *
tokens_per_second`` (truncated to an integer per temporal patch). The text after a video
continues at **one past the largest position used so far**.

That last rule is vLLM 0.32's (and the original Qwen2.5-VL one). transformers 5.19 instead
restarts the text at ``start + max(h, w)``, i.e. inside the video's temporal range, so the
same tokens get different positions in the two engines and trainer and rollout log-probs
disagree. lvrl computes positions here and passes them explicitly to the HF model, so the
policy is trained on exactly the positions vLLM sampled with.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _segments(video_flags: Sequence[bool]) -> list[tuple[bool, int]]:
    """Runs of ``(is_video, length)``."""
    runs: list[tuple[bool, int]] = []
    for is_video in video_flags:
        if runs and runs[-1][0] == is_video:
            runs[-1] = (is_video, runs[-1][1] + 1)
        else:
            runs.append((is_video, 1))
    return runs


def mrope_positions_1d(
    video_flags: Sequence[bool],
    video_grid_thw: torch.Tensor,
    second_per_grid_ts: torch.Tensor,
    *,
    spatial_merge_size: int,
    tokens_per_second: float,
) -> tuple[torch.Tensor, int]:
    """Positions ``(3, len(video_flags))`` of one unpadded sequence, and its rope delta.

    ``video_flags`` marks the video slots (the expanded placeholders of the *prompt*: a
    generated token that happens to carry the placeholder id is text). ``video_grid_thw``
    (``(num_videos, 3)``, in patches) and ``second_per_grid_ts`` list the videos in order. The
    delta (``max position + 1 - length``) continues the positions of generated tokens.
    """
    pieces: list[torch.Tensor] = []
    next_position = 0
    video_index = 0
    for is_video, length in _segments(video_flags):
        if not is_video:
            pieces.append(torch.arange(length).expand(3, -1) + next_position)
            next_position += length
            continue
        if video_index >= len(video_grid_thw):
            raise ValueError("more video placeholder runs than entries in video_grid_thw")
        t, h, w = (int(x) for x in video_grid_thw[video_index])
        h, w = h // spatial_merge_size, w // spatial_merge_size
        if t * h * w != length:
            raise ValueError(
                f"video {video_index} has {length} placeholder tokens but its grid gives {t * h * w}"
            )
        t_factor = float(second_per_grid_ts[video_index]) * tokens_per_second
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        grid = grid.reshape(3, -1)
        grid[0] = (grid[0] * t_factor).long()
        pieces.append(grid + next_position)
        next_position = int(pieces[-1].max()) + 1
        video_index += 1
    if video_index != len(video_grid_thw):
        raise ValueError(f"{len(video_grid_thw)} videos given but {video_index} placeholder runs found")
    positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
    return positions, (int(positions.max()) + 1 - len(video_flags)) if len(video_flags) else 0


def mrope_position_ids(
    video_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    video_grid_thw: torch.Tensor,
    second_per_grid_ts: torch.Tensor,
    *,
    spatial_merge_size: int,
    tokens_per_second: float,
) -> torch.Tensor:
    """Positions ``(3, batch, length)`` of a padded batch (left or right padding; pads get 0).

    ``video_mask`` marks video slots. Videos are matched to rows in order: the video runs of
    row 0 take the first entries of ``video_grid_thw``, then row 1, and so on.
    """
    positions = torch.zeros(3, *video_mask.shape, dtype=torch.long)
    video_offset = 0
    for row in range(video_mask.shape[0]):
        valid = attention_mask[row].bool().cpu()
        flags = video_mask[row].cpu()[valid].tolist()
        count = sum(1 for is_video, _ in _segments(flags) if is_video)
        row_positions, _ = mrope_positions_1d(
            flags,
            video_grid_thw[video_offset : video_offset + count],
            second_per_grid_ts[video_offset : video_offset + count],
            spatial_merge_size=spatial_merge_size,
            tokens_per_second=tokens_per_second,
        )
        positions[:, row, valid] = row_positions
        video_offset += count
    return positions.to(video_mask.device)
