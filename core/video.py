"""A video as the language model sees it: the vision tower's output, encoded once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class VideoEmbedding:
    """One video, encoded: what the language model sees instead of frames."""

    embeds: torch.Tensor
    """``(num_visual_tokens, hidden)`` output of the vision tower's merger."""
    grid_thw: torch.Tensor
    """``(3,)`` grid in patches: temporal patches, height patches, width patches."""
    second_per_grid: float
    """Seconds spanned by one temporal patch (drives the temporal M-RoPE positions)."""
    timestamps: list[float] | None = None
    """Each temporal patch's time in seconds, for a family whose prompt writes it (Qwen3-VL)."""


VideoEncoder = Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]
"""``(pixel_values_videos, video_grid_thw) -> one (visual_tokens, hidden) tensor per video``."""
