"""One M-RoPE position rule for training and rollout, for every Qwen-VL family.

The Qwen-VL models give every token three position indices (time, height, width). Text tokens
get the same index on all three axes; the tokens of a video get ``(t', h, w)`` offset by the
position where the video starts. The families differ only in the temporal index ``t'`` of the
``t``-th temporal patch (:class:`TemporalRule`):

- ``scaled`` (Qwen2.5-VL): ``t' = int(t * second_per_grid * tokens_per_second)``, time in
  the video's real seconds;
- ``index`` (Qwen2-VL): ``t' = t``;
- ``frames`` (Qwen3-VL): every temporal patch is a run of placeholders of its own with
  ``t' = 0``, the processor writing its timestamp as text before it (time is read, not
  encoded in the positions).

The text after a video run continues at **one past the largest position used so far**. That
is vLLM 0.32's rule (and the original Qwen2.5-VL one). transformers 5.19 instead restarts the
text after a Qwen2/2.5-VL video at ``start + max(h, w)``, i.e. inside the video's temporal
range, so the same tokens get different positions in the two engines and trainer and rollout
log-probs disagree (for Qwen3-VL's one-patch runs both rules agree). lvrl computes positions
here and passes them explicitly to the HF model, so the policy is trained on exactly the
positions vLLM sampled with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

TemporalRule = Literal["scaled", "index", "frames"]
"""How a family turns a temporal patch's index into a position (see the module docstring)."""


def _segments(video_flags: Sequence[bool]) -> list[tuple[bool, int]]:
    """Runs of ``(is_video, length)``."""
    runs: list[tuple[bool, int]] = []
    for is_video in video_flags:
        if runs and runs[-1][0] == is_video:
            runs[-1] = (is_video, runs[-1][1] + 1)
        else:
            runs.append((is_video, 1))
    return runs


def video_runs(video_grid_thw: torch.Tensor, temporal: TemporalRule) -> list[tuple[int, int, int]]:
    """The placeholder runs of the videos ``video_grid_thw`` lists, in prompt order: ``(video,
    first temporal patch, temporal patches)`` each; one run per video, or (``frames``) one per
    temporal patch.

    >>> video_runs(torch.tensor([[2, 4, 4], [1, 2, 2]]), "frames")
    [(0, 0, 1), (0, 1, 1), (1, 0, 1)]
    """
    runs: list[tuple[int, int, int]] = []
    for video, t in enumerate(video_grid_thw[:, 0].tolist()):
        if temporal == "frames":
            runs.extend((video, step, 1) for step in range(int(t)))
        else:
            runs.append((video, 0, int(t)))
    return runs


def mrope_positions_1d(
    video_flags: Sequence[bool],
    video_grid_thw: torch.Tensor,
    second_per_grid_ts: torch.Tensor,
    *,
    spatial_merge_size: int,
    tokens_per_second: float | None,
    temporal: TemporalRule = "scaled",
) -> tuple[torch.Tensor, int]:
    """Positions ``(3, len(video_flags))`` of one unpadded sequence, and its rope delta.

    ``video_flags`` marks the video slots (the expanded placeholders of the *prompt*: a
    generated token that happens to carry the placeholder id is text). ``video_grid_thw``
    (``(num_videos, 3)``, in patches) and ``second_per_grid_ts`` list the videos in order. The
    delta (``max position + 1 - length``) continues the positions of generated tokens.
    """
    if temporal == "scaled" and tokens_per_second is None:
        raise ValueError("the 'scaled' temporal rule needs tokens_per_second")
    runs = video_runs(video_grid_thw, temporal)
    pieces: list[torch.Tensor] = []
    next_position = 0
    run_index = 0
    for is_video, length in _segments(video_flags):
        if not is_video:
            pieces.append(torch.arange(length).expand(3, -1) + next_position)
            next_position += length
            continue
        if run_index >= len(runs):
            raise ValueError(
                f"more video placeholder runs than the {len(video_grid_thw)} video(s) of video_grid_thw give"
            )
        video, _, t = runs[run_index]
        _, h, w = (int(x) for x in video_grid_thw[video])
        h, w = h // spatial_merge_size, w // spatial_merge_size
        if t * h * w != length:
            what = f"video {video}" if temporal != "frames" else f"frame run {run_index} (video {video})"
            raise ValueError(f"{what} has {length} placeholder tokens but its grid gives {t * h * w}")
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        grid = grid.reshape(3, -1)
        if temporal == "scaled":
            t_factor = float(second_per_grid_ts[video]) * float(tokens_per_second)  # type: ignore[arg-type]
            grid[0] = (grid[0] * t_factor).long()
        pieces.append(grid + next_position)
        next_position = int(pieces[-1].max()) + 1
        run_index += 1
    if run_index != len(runs):
        raise ValueError(
            f"{len(video_grid_thw)} video(s) given ({len(runs)} placeholder runs) but {run_index} runs found"
        )
    positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
    return positions, (int(positions.max()) + 1 - len(video_flags)) if len(video_flags) else 0


def mrope_position_ids(
    video_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    video_grid_thw: torch.Tensor,
    second_per_grid_ts: torch.Tensor,
    *,
    spatial_merge_size: int,
    tokens_per_second: float | None,
    temporal: TemporalRule = "scaled",
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
        if temporal == "frames":  # runs are temporal patches: count the videos they make up
            count = _videos_of_runs(video_grid_thw[video_offset:], count)
        row_positions, _ = mrope_positions_1d(
            flags,
            video_grid_thw[video_offset : video_offset + count],
            second_per_grid_ts[video_offset : video_offset + count],
            spatial_merge_size=spatial_merge_size,
            tokens_per_second=tokens_per_second,
            temporal=temporal,
        )
        positions[:, row, valid] = row_positions
        video_offset += count
    return positions.to(video_mask.device)


def _videos_of_runs(video_grid_thw: torch.Tensor, runs: int) -> int:
    """How many of the videos ``video_grid_thw`` lists (from its first) ``runs`` one-temporal-patch
    runs make up."""
    videos = 0
    for t in video_grid_thw[:, 0].tolist():
        if runs <= 0:
            break
        runs -= int(t)
        videos += 1
    if runs != 0:
        raise ValueError("a row's frame runs do not make up whole videos of video_grid_thw")
    return videos
