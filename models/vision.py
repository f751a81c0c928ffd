"""Encoding videos once: the vision tower's output, cached for rollouts and every training pass."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.families import family_of


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision encoder of a HF VLM (``model.model.visual`` for the Qwen-VL families)."""
    inner = getattr(model, "model", model)
    tower = getattr(inner, "visual", None)
    if tower is None:
        raise AttributeError(f"cannot find the vision tower of {type(model).__name__}")
    return tower


def encode_videos(
    model: torch.nn.Module, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor
) -> list[torch.Tensor]:
    """Run the vision tower (and merger) once; one ``(num_visual_tokens, visual_width)`` tensor per
    video, as the model's family caches it (:mod:`models.families`)."""
    vision_tower(model)  # a clear error for a model without one (e.g. the reference)
    return family_of(model.config).encode_videos(model, pixel_values_videos, video_grid_thw)


def encode_row_segments(
    model: torch.nn.Module, segments: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]]
) -> list[list[torch.Tensor]]:
    """Per row, its tool segments (``(pixel_values_videos, grid_thw)`` each) encoded by one call
    of the vision tower, with grad when the tower is trainable; a segment several rows share
    (the same pixel tensor) is encoded once."""
    distinct: dict[int, int] = {}
    pixels, grids = [], []
    for row in segments:
        for values, grid in row:
            if id(values) not in distinct:
                distinct[id(values)] = len(pixels)
                pixels.append(values)
                grids.append(grid.reshape(1, 3))
    if not pixels:
        return [[] for _ in segments]
    encoded = encode_videos(model, torch.cat(pixels), torch.cat(grids))
    return [[encoded[distinct[id(values)]] for values, _ in row] for row in segments]


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The language model's decoder layers (``model.model.language_model.layers`` for Qwen-VL)."""
    inner = getattr(model, "model", model)
    language = getattr(inner, "language_model", inner)
    layers = getattr(language, "layers", None)
    if layers is None:
        raise AttributeError(f"cannot find the decoder layers of {type(model).__name__}")
    return list(layers)


def drop_vision_tower(model: torch.nn.Module) -> None:
    """Remove the vision tower of a model that only ever sees cached video embeddings (the
    frozen reference): its weights would take memory for nothing."""
    inner = getattr(model, "model", model)
    vision_tower(model)  # raises if there is none
    inner.visual = None
