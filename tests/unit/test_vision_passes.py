"""Encoding a step's videos in several passes of the vision tower gives the embeddings of one pass.

The Qwen-VL towers attend within a temporal patch, so any cut between temporal patches (within
a video or between two) changes only the order of the reductions: the embeddings agree within
FORWARD_ULPS (the bar for a row encoded alone vs in a batch), while a frame dropped or dealt to
the wrong video would move them by orders of magnitude more.
"""

from __future__ import annotations

import pytest
import torch
from helpers.tolerances import FORWARD_ULPS, assert_float32_close

from models.loading import load_model
from models.vision import encode_videos, encode_videos_in_passes


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_passes_of_the_tower_give_one_pass_embeddings(family: str, family_model_dir) -> None:
    model = load_model(family_model_dir(family)).eval()
    patch = model.config.vision_config.patch_size
    temporal = model.config.vision_config.temporal_patch_size
    values = 3 * temporal * patch * patch
    grids = torch.tensor([[3, 4, 4], [2, 4, 6]])  # 3 and 2 temporal patches of 16 and 24 patches
    pixels = torch.randn(int(grids.prod(dim=-1).sum()), values, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = encode_videos(model, pixels, grids)
        # 20 patches a pass: one temporal patch of the first video, the second video's cut in two.
        passes = encode_videos_in_passes(model, pixels, grids, max_patches=20)
    assert [p.shape for p in passes] == [w.shape for w in whole]
    for index, (got, want) in enumerate(zip(passes, whole, strict=True)):
        assert_float32_close(got, want, ulps=FORWARD_ULPS, reason=f"video {index} in passes vs at once")
