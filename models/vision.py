"""Encoding videos once: the vision tower's output, cached for rollouts and every training pass."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from families import family_of


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
    video, as the model's family caches it (:mod:`families`)."""
    vision_tower(model)  # a clear error for a model without one (e.g. the reference)
    return family_of(model.config).encode_videos(model, pixel_values_videos, video_grid_thw)


def encode_videos_in_passes(
    model: torch.nn.Module, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor, max_patches: int
) -> list[torch.Tensor]:
    """:func:`encode_videos` in passes of at most ``max_patches`` patches (whole temporal patches;
    one of them alone may exceed it), concatenated per video: the same embeddings, since the
    Qwen-VL towers attend within a temporal patch (``parallel.encoding`` splits the frames over
    ranks on the same ground), with the tower's working set bounded by one pass."""
    offsets = [0, *torch.cumsum(video_grid_thw.prod(dim=-1), 0).tolist()]
    passes: list[list[tuple[int, int, int]]] = [[]]
    used = 0
    for video, (t, h, w) in enumerate(video_grid_thw.tolist()):
        for first in range(t):
            if passes[-1] and used + h * w > max_patches:
                passes.append([])
                used = 0
            pieces = passes[-1]
            if pieces and pieces[-1][0] == video:
                pieces[-1] = (video, pieces[-1][1], pieces[-1][2] + 1)
            else:
                pieces.append((video, first, 1))
            used += h * w
    encoded: list[list[torch.Tensor]] = [[] for _ in range(len(video_grid_thw))]
    for pieces in passes:
        steps = [int(video_grid_thw[v, 1] * video_grid_thw[v, 2]) for v, _, _ in pieces]
        pixels = torch.cat(
            [
                pixel_values_videos[offsets[v] + t * step : offsets[v] + (t + n) * step]
                for (v, t, n), step in zip(pieces, steps, strict=True)
            ]
        )
        grids = torch.tensor([[n, *video_grid_thw[v, 1:].tolist()] for v, _, n in pieces])
        for (v, _, _), embeds in zip(pieces, encode_videos(model, pixels, grids), strict=True):
            encoded[v].append(embeds)
    return [torch.cat(parts) for parts in encoded]


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
