"""Parallel video encoding (MR-SP stage 1): each rank of the sequence-parallel group encodes a
share of the frames, and the embeddings are all-gathered once into the cache that rollout,
reference and policy passes reuse.

The unit of work is one *temporal patch* of one video (``temporal_patch_size`` frames, one step
of ``grid_thw``'s T): Qwen2.5-VL's vision tower attends within a temporal patch only (its
attention segments are ``H x W`` patches, repeated T times), so encoding the patches of a video
in pieces gives exactly the embeddings of encoding it whole. All temporal patches of the batch
are dealt out as contiguous runs of near-equal length (a video whose patch count does not
divide by the group size simply ends mid-run), each rank encodes its run, and an all-gather
(padded to the longest run) puts the pieces back in order on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from core.video import VideoEncoder


def temporal_patch_runs(grid_thw: torch.Tensor, parts: int) -> list[list[tuple[int, int, int]]]:
    """Deal the batch's temporal patches to ``parts`` ranks in order.

    Returns, per rank, a list of ``(video, first_patch, patch_count)`` pieces.

    >>> temporal_patch_runs(torch.tensor([[3, 2, 2], [2, 2, 2]]), 2)
    [[(0, 0, 3)], [(1, 0, 2)]]
    >>> temporal_patch_runs(torch.tensor([[5, 2, 2]]), 4)
    [[(0, 0, 2)], [(0, 2, 1)], [(0, 3, 1)], [(0, 4, 1)]]
    """
    units = [(video, t) for video, count in enumerate(grid_thw[:, 0].tolist()) for t in range(count)]
    base, extra = divmod(len(units), parts)
    runs, start = [], 0
    for part in range(parts):
        stop = start + base + (part < extra)
        pieces: list[tuple[int, int, int]] = []
        for video, t in units[start:stop]:
            if pieces and pieces[-1][0] == video:
                pieces[-1] = (video, pieces[-1][1], pieces[-1][2] + 1)
            else:
                pieces.append((video, t, 1))
        runs.append(pieces)
        start = stop
    return runs


def encode_videos_sequence_parallel(
    encode: VideoEncoder,
    pixel_values_videos: torch.Tensor,
    video_grid_thw: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    spatial_merge_size: int,
    hidden_size: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> list[torch.Tensor]:
    """``encode`` (the model's vision tower, e.g. :func:`models.vision.encode_videos`) with the work
    split over ``group`` (no gradient).

    Every rank passes the same batch and gets every video's embeddings back. The model side
    says what this needs to know of the tower: its spatial merge, its output width (the cached
    encoding's, DeepStack features included), its device and dtype (what a rank with nothing to
    encode contributes to the all-gather must match the others' tensors).
    """
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    merge = spatial_merge_size**2
    patches_per_step = (video_grid_thw[:, 1] * video_grid_thw[:, 2]).tolist()
    offsets = [0, *torch.cumsum(video_grid_thw.prod(dim=-1), 0).tolist()]
    runs = temporal_patch_runs(video_grid_thw, size)
    with torch.no_grad():
        mine = runs[rank]
        if mine:
            pixels = torch.cat(
                [
                    pixel_values_videos[
                        offsets[v] + t * patches_per_step[v] : offsets[v] + (t + n) * patches_per_step[v]
                    ]
                    for v, t, n in mine
                ]
            )
            grids = torch.tensor([[n, *video_grid_thw[v, 1:].tolist()] for v, t, n in mine])
            local = torch.cat(encode(pixels, grids))
        else:  # more ranks than temporal patches
            local = torch.zeros(0, hidden_size, device=device, dtype=dtype)
        tokens = [sum(n * patches_per_step[v] // merge for v, _, n in run) for run in runs]
        padded = torch.zeros(max(tokens), local.shape[1], dtype=local.dtype, device=local.device)
        padded[: local.shape[0]] = local
        gathered = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(gathered, padded, group=group)
    pieces: list[list[torch.Tensor]] = [[] for _ in range(video_grid_thw.shape[0])]
    for run, count, block in zip(runs, tokens, gathered, strict=True):
        start = 0
        for v, _, n in run:
            length = n * patches_per_step[v] // merge
            pieces[v].append(block[start : start + length])
            start += length
        assert start == count
    return [torch.cat(p) for p in pieces]
