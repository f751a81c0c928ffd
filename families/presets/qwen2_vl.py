"""Qwen2-VL: full-attention vision tower (QuickGELU MLP), 3-D M-RoPE with time = temporal patch index.

Its vision config names widths otherwise than Qwen2.5-VL's: ``embed_dim`` is the tower's own
width, ``hidden_size`` the merger's output (the language model's width), and the MLP width is
``embed_dim * mlp_ratio``. There is no ``tokens_per_second``: M-RoPE time ids advance one per
temporal patch whatever the frame rate, so video metadata does not change the positions.
Same geometry, processors and accepted frames as Qwen2.5-VL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from families.presets import qwen2_5_vl
from families.presets.base import (
    FamilyRecipe,
    Preset,
    check_mrope_section,
    qwen_text_fields,
    vision_token_ids,
)
from families.presets.qwen2_5_vl import GEOMETRY

if TYPE_CHECKING:
    from transformers import Qwen2VLConfig, Qwen2VLProcessor


def make_config(preset: Preset, token_ids: dict[str, int]) -> Qwen2VLConfig:
    """The Qwen2-VL config of ``preset``, with the special-token ids of our tokenizer."""
    from transformers import Qwen2VLConfig

    check_mrope_section(preset.mrope_section, preset.head_dim)
    mlp_ratio, remainder = divmod(preset.vision_intermediate_size, preset.vision_hidden_size)
    if remainder:
        raise ValueError(
            f"Qwen2-VL's vision MLP is embed_dim * mlp_ratio (an integer): {preset.vision_intermediate_size} "
            f"is not a multiple of {preset.vision_hidden_size}"
        )
    text_config = {
        **qwen_text_fields(preset, token_ids),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": list(preset.mrope_section),
        },
    }
    vision_config = {
        "depth": preset.vision_depth,
        "embed_dim": preset.vision_hidden_size,
        "hidden_size": preset.hidden_size,  # the merger's output: the language model's width
        "mlp_ratio": mlp_ratio,
        "num_heads": preset.vision_heads,
        "patch_size": GEOMETRY.patch_size,
        "spatial_merge_size": GEOMETRY.spatial_merge_size,
        "temporal_patch_size": GEOMETRY.temporal_patch_size,
        "initializer_range": preset.init_std,
    }
    return Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        **vision_token_ids(token_ids),
        tie_word_embeddings=False,
        dtype="float32",
    )


def make_processor(tokenizer: Any) -> Qwen2VLProcessor:
    """Qwen2.5-VL's processors (frames of 28-multiples kept as given) under Qwen2-VL's processor class."""
    return qwen2_5_vl.make_processor(tokenizer, processor_class="Qwen2VLProcessor")


RECIPE = FamilyRecipe(
    name="qwen2_vl",
    description="Qwen2-VL: full-attention vision tower, M-RoPE time = temporal patch index",
    model_class="Qwen2VLForConditionalGeneration",
    geometry=GEOMETRY,
    default_system_turn=True,
    accepted_frames="sides multiples of 28, area 28x28 to 448x448 per frame",
    make_config=make_config,
    make_processor=make_processor,
)
