"""Qwen2.5-VL (the default family): window-attention vision tower, 3-D M-RoPE with time in seconds.

Frames pass the saved processor untouched when both sides are multiples of 28 and the frame's
area lies within [28x28, 448x448]; the budget is per frame, so any number of frames (at least
one; an odd count is padded with its last frame to fill the temporal patch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from families.presets.base import (
    FamilyRecipe,
    Preset,
    VisionGeometry,
    check_mrope_section,
    qwen_text_fields,
    vision_token_ids,
)

if TYPE_CHECKING:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLProcessor


# Qwen2.5-VL's vision geometry, kept as in the real checkpoints: 14x14 patches, 2x2 spatial
# merge, 2 frames per temporal patch. One merged token covers 28x28 pixels of 2 frames.
GEOMETRY = VisionGeometry(patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
PIXEL_FACTOR = GEOMETRY.pixel_factor
# Pixel budgets of the saved processors. ``smart_resize`` keeps any frame whose sides are
# multiples of 28 when its area lies within [MIN_PIXELS, MAX_PIXELS]: 28x28 up to 448x448.
# (The HF video default, 128*28*28, would upscale our 56x56 frames 5.6x.)
MIN_PIXELS = PIXEL_FACTOR * PIXEL_FACTOR
MAX_PIXELS = 448 * 448


def make_config(preset: Preset, token_ids: dict[str, int]) -> Qwen2_5_VLConfig:
    """The Qwen2.5-VL config of ``preset``, with the special-token ids of our tokenizer."""
    from transformers import Qwen2_5_VLConfig

    check_mrope_section(preset.mrope_section, preset.head_dim)
    text_config = {
        **qwen_text_fields(preset, token_ids),
        # "default" rope with an mrope_section is Qwen2.5-VL's 3-D M-RoPE (time, height, width).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": list(preset.mrope_section),
        },
    }
    vision_config = {
        "depth": preset.vision_depth,
        "hidden_size": preset.vision_hidden_size,
        "intermediate_size": preset.vision_intermediate_size,
        "num_heads": preset.vision_heads,
        "out_hidden_size": preset.hidden_size,
        "patch_size": GEOMETRY.patch_size,
        "spatial_merge_size": GEOMETRY.spatial_merge_size,
        "temporal_patch_size": GEOMETRY.temporal_patch_size,
        # Window attention in every block but the last, as the real towers alternate.
        "fullatt_block_indexes": [preset.vision_depth - 1],
        "window_size": 112,
        # Real Qwen2.5-VL checkpoints use 2: M-RoPE time ids advance 2 per second of video.
        "tokens_per_second": 2,
        "initializer_range": preset.init_std,
    }
    return Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        **vision_token_ids(token_ids),
        tie_word_embeddings=False,
        dtype="float32",
    )


def qwen2_vl_image_and_video_processors() -> tuple[Any, Any]:
    """Image and video processors (shared by Qwen2-VL and Qwen2.5-VL) that leave frames of
    28-multiples, up to 448x448, untouched.

    ``do_sample_frames=False``: the caller samples the frames. ``cap_pixels_per_frame=False``:
    no per-video pixel budget shrinks the frames of long videos behind the caller's back (it
    also silences transformers 5.19's warning about that option's future default).
    """
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    geometry = {
        "patch_size": GEOMETRY.patch_size,
        "merge_size": GEOMETRY.spatial_merge_size,
        "temporal_patch_size": GEOMETRY.temporal_patch_size,
    }
    image_processor = Qwen2VLImageProcessor(size=dict(size), **geometry)
    video_processor = Qwen2VLVideoProcessor(
        size=dict(size), do_sample_frames=False, cap_pixels_per_frame=False, **geometry
    )
    return image_processor, video_processor


def make_processor(tokenizer: Any, processor_class: str = "Qwen2_5_VLProcessor") -> Qwen2_5_VLProcessor:
    """Processor whose image/video processors leave frames of 28-multiples (up to 448x448) untouched
    (``processor_class``: Qwen2-VL's takes the same processors)."""
    import transformers

    image_processor, video_processor = qwen2_vl_image_and_video_processors()
    return getattr(transformers, processor_class)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=tokenizer.chat_template,
    )


RECIPE = FamilyRecipe(
    name="qwen2_5_vl",
    description="Qwen2.5-VL: window-attention vision tower, M-RoPE time in seconds (2 ids/s)",
    model_class="Qwen2_5_VLForConditionalGeneration",
    geometry=GEOMETRY,
    default_system_turn=True,
    accepted_frames="sides multiples of 28, area 28x28 to 448x448 per frame",
    make_config=make_config,
    make_processor=make_processor,
)
