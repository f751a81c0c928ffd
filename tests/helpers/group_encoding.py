"""The vision tower run by a process group together (MR-SP's shared encoding), for tests."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist

from families import family_of
from models.vision import encode_videos
from parallel.encoding import encode_videos_sequence_parallel


def group_encoder(
    model: torch.nn.Module, group: dist.ProcessGroup
) -> Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]:
    """``(pixel_values_videos, video_grid_thw) -> encodings``, the work split over ``group``
    (every rank passes the same videos and gets every encoding back)."""
    family = family_of(model.config)

    def encode(pixels: torch.Tensor, grid: torch.Tensor) -> list[torch.Tensor]:
        return encode_videos_sequence_parallel(
            functools.partial(encode_videos, model),
            pixels,
            grid,
            group,
            spatial_merge_size=family.spatial_merge_size,
            hidden_size=family.visual_width,
            device=torch.device("cpu"),
        )

    return encode
