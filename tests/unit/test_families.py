"""The model-family adapters' own rules, without a model: choice by config, the per-visual-token
feature bookkeeping, and the timing the processors would compute."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig, Qwen3VLMoeConfig

from families import FAMILIES, UnsupportedModel, VisualFeatures, family_of


@pytest.mark.parametrize(
    ("config", "name", "temporal"),
    [
        (Qwen2VLConfig(), "qwen2_vl", "index"),
        (Qwen2_5_VLConfig(), "qwen2_5_vl", "scaled"),
        (Qwen3VLConfig(), "qwen3_vl", "frames"),
        (Qwen3VLMoeConfig(), "qwen3_vl", "frames"),
    ],
)
def test_the_family_comes_from_the_config(config: object, name: str, temporal: str) -> None:
    family = family_of(config)
    assert family.name == name
    assert family.position_rule.temporal == temporal
    assert family.position_rule.spatial_merge_size == 2


def test_an_unknown_model_type_is_refused_by_name() -> None:
    class Config:
        model_type = "llava"

    with pytest.raises(UnsupportedModel, match=r"'llava'.*qwen2_5_vl"):
        family_of(Config())


def test_widths_of_a_cached_encoding() -> None:
    qwen2 = family_of(Qwen2VLConfig(text_config={"hidden_size": 96}, vision_config={"hidden_size": 96}))
    assert qwen2.visual_width == qwen2.language_width == 96
    qwen3 = family_of(
        Qwen3VLConfig(
            text_config={"hidden_size": 64},
            vision_config={"out_hidden_size": 64, "deepstack_visual_indexes": [0, 2, 4]},
        )
    )
    assert (qwen3.language_width, qwen3.visual_width) == (64, 64 * 4)
    cached = torch.arange(2 * 256.0).reshape(2, 256)
    placeholders, extra = qwen3.split_encoding(cached)
    assert torch.equal(placeholders, cached[:, :64]) and torch.equal(extra, cached[:, 64:])
    assert qwen2.split_encoding(cached[:, :96])[1] is None


def test_visual_features_follow_rows_and_columns() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 0, 0, 1, 0]], dtype=torch.bool)
    extra = torch.arange(5.0).unsqueeze(1) * 10  # visual tokens in row-major order: 0..4
    features = VisualFeatures(mask, extra)
    assert features.select(rows=[1]).extra.squeeze(1).tolist() == [30.0, 40.0]
    assert features.select(columns=slice(2, 5)).extra.squeeze(1).tolist() == [10.0, 20.0, 40.0]
    picked = features.select(rows=[1, 0], columns=torch.tensor([0, 4]))
    assert picked.mask.tolist() == [[True, False], [False, True]]
    assert picked.extra.squeeze(1).tolist() == [30.0, 20.0]  # row 1's column 0, then row 0's column 4


def test_qwen3_timestamps_are_the_processors() -> None:
    from transformers import Qwen3VLProcessor

    family = FAMILIES["qwen3_vl"](Qwen3VLConfig())
    for indices, fps in (([0, 15, 30, 45, 60, 75], 30.0), ([3, 9, 14], 7.5), (list(range(8)), 2.0)):
        expected = Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, merge_size=2)
        assert (
            family.patch_timestamps({"fps": fps, "frames_indices": indices, "total_num_frames": 90})
            == expected
        )


def test_seconds_per_patch_from_metadata_match_qwen2_5s_processor(tiny_model_dir) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    family = family_of(Qwen2VLConfig())  # takes them from the metadata: its processor gives none
    frames = torch.zeros(6, 56, 56, 3, dtype=torch.uint8)
    for metadata in (
        {"fps": 30.0, "total_num_frames": 900, "frames_indices": [0, 150, 300, 450, 600, 750]},
        {"fps": 2.0, "total_num_frames": 6, "frames_indices": list(range(6))},
    ):
        encoded = processor(
            text=["<|video_pad|>"], videos=[frames], video_metadata=[metadata], return_tensors="pt"
        )
        # The processor returns its value as float32 (a relative rounding of 6e-8); ours is a double.
        assert family.second_per_grid({}, [metadata]) == pytest.approx(
            [float(t) for t in encoded["second_per_grid_ts"]], rel=1e-6
        )


class _TowerOnAnotherDevice(torch.nn.Module):
    """A model whose vision tower lives on the ``meta`` device (standing in for an accelerator, which
    a CPU run lacks) and whose ``get_video_features`` records the devices it is handed."""

    def __init__(self, width: int, levels: int) -> None:
        super().__init__()
        self.visual = torch.nn.Linear(2, 2, device="meta")
        self.width, self.levels = width, levels
        self.seen: list[tuple[torch.device, torch.device]] = []

    def get_video_features(self, pixels: torch.Tensor, grid: torch.Tensor, return_dict: bool) -> object:
        self.seen.append((pixels.device, grid.device))
        merged = [torch.zeros(3, self.width)]
        return SimpleNamespace(pooler_output=merged, deepstack_features=[merged] * self.levels)


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl"])
def test_a_videos_grid_goes_to_the_towers_device_with_its_pixels(name: str) -> None:
    """A tool reply's pixels and grid come from the processor on the CPU; Qwen3-VL's tower builds
    position indices on the grid's device, so a grid left behind fails on CUDA ("index is on cpu")."""
    config = {
        "qwen2_5_vl": Qwen2_5_VLConfig(text_config={"hidden_size": 8}, vision_config={"out_hidden_size": 8}),
        "qwen3_vl": Qwen3VLConfig(
            text_config={"hidden_size": 8},
            vision_config={"out_hidden_size": 8, "deepstack_visual_indexes": [0]},
        ),
    }[name]
    family = family_of(config)
    tower_model = _TowerOnAnotherDevice(width=8, levels=1 if name == "qwen3_vl" else 0)
    family.encode_videos(tower_model, torch.zeros(12, 6), torch.tensor([[1, 2, 6]]))
    assert tower_model.seen == [(torch.device("meta"), torch.device("meta"))]


class _TowerOfTwoVideos(torch.nn.Module):
    """Two videos of 3 and 5 merged tokens, their DeepStack level in either layout transformers
    returns: split per video (5.18 on) or one tensor of every video's tokens (5.16, 5.17)."""

    def __init__(self, split: bool) -> None:
        super().__init__()
        self.visual = torch.nn.Linear(2, 2)
        self.split = split

    def get_video_features(self, pixels: torch.Tensor, grid: torch.Tensor, return_dict: bool) -> object:
        merged = torch.arange(8 * 4.0).reshape(8, 4)
        level = -merged
        split = (level.split([3, 5]),) if self.split else (level,)
        return SimpleNamespace(pooler_output=merged.split([3, 5]), deepstack_features=split)


def test_qwen3_deepstack_features_in_either_transformers_layout() -> None:
    config = Qwen3VLConfig(
        text_config={"hidden_size": 4}, vision_config={"out_hidden_size": 4, "deepstack_visual_indexes": [0]}
    )
    family = family_of(config)
    grids = torch.tensor([[1, 2, 6], [1, 2, 10]])
    per_video = family.encode_videos(_TowerOfTwoVideos(split=True), torch.zeros(32, 6), grids)
    together = family.encode_videos(_TowerOfTwoVideos(split=False), torch.zeros(32, 6), grids)
    assert [tuple(v.shape) for v in per_video] == [(3, 8), (5, 8)]
    merged = torch.arange(8 * 4.0).reshape(8, 4)
    expected = torch.cat([merged, -merged], dim=-1).split([3, 5])
    for a, b, e in zip(per_video, together, expected, strict=True):
        assert torch.equal(a, e) and torch.equal(b, e)
