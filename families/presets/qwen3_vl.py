"""Qwen3-VL (dense): DeepStack vision features, interleaved M-RoPE, timestamps written between frames.

Kept as in the released checkpoints (``Qwen/Qwen3-VL-*-Instruct``): 16-pixel patches, 2x2
spatial merge (one merged token covers 32x32 pixels of 2 frames), a learned 48x48 grid of
vision position embeddings (2304, interpolated to each frame's grid), GELU(tanh) vision MLP,
Qwen3 language model (q/k RMS norms, explicit ``head_dim``), rope_theta 5e6 and
``rope_parameters = {"rope_type": "default", "mrope_section": [...], "mrope_interleaved": true}``
with the released proportions 24:20:20 of the rotary half (scaled to the preset's head_dim).
DeepStack: the outputs of vision blocks ``deepstack_visual_indexes`` go through their own
mergers and are added to the hidden states of the first decoder layers at the visual tokens.
The presets' towers have 2 blocks, so both feed DeepStack ([0, 1]); the language models have
at least 2 layers, so every level is injected.

Prompt layout
-------------
The chat template writes ``<|vision_start|><|video_pad|><|vision_end|>`` for a video (as the
released template does), and ``Qwen3VLProcessor`` (transformers >= 5.10) replaces the bare
``<|video_pad|>`` by, for each temporal patch (2 frames), ``<{t:.1f} seconds>`` as plain text,
then ``<|vision_start|>``, the patch's tokens, ``<|vision_end|>``; the template's outer
``<|vision_start|>``/``<|vision_end|>`` stay. ``t`` is the mean time of the patch's first and
last frame, ``frames_indices[i] / fps``. vLLM 0.32 writes the same layout (it checks that the
processor expands only the video token).

Video metadata (required)
-------------------------
Pass, per video, ``{"fps": <source fps>, "frames_indices": [...], "total_num_frames": ...}``
(``duration`` too for vLLM): the timestamps need ``frames_indices`` and ``fps`` (without
``fps`` the processor assumes 24 with a warning; without ``frames_indices`` it fails).
``do_sample_frames`` is False in the saved video processor: the frames given are the frames
seen, and ``fps`` only dates them. Nothing else reads the frame rate: Qwen3-VL's M-RoPE time
of a frame is its text position after the timestamp, not a rate-scaled index.

Frames kept untouched
---------------------
Qwen3-VL's video ``smart_resize`` budgets the whole video, not each frame: frames pass
untouched when both sides are multiples of 32 and (frames, rounded up to even) x height x width
lies within [VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS] = [2 x 32 x 32, 768 x 32 x 32 x 32] =
[2,048, 25,165,824] pixels (the maximum is the released processor's). That is up to 124 frames
of 448x448, 6,144 frames of 64x64 or 24,576 of 32x32. Sides that are not multiples of 32 are
rounded to the nearest multiple: the demo's 56x56 frames would become 64x64, so give Qwen3-VL
64x64 frames. A video needs at least 2 frames (the resize refuses less than one temporal
patch). Images: sides multiples of 32, area 32x32 to 448x448. (vLLM 0.32 on CPU starts with
this budget at ``max_model_len`` 1024: measured.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from families.presets.base import FamilyRecipe, Preset, VisionGeometry, qwen_text_fields, vision_token_ids

if TYPE_CHECKING:
    from transformers import Qwen3VLConfig, Qwen3VLProcessor


GEOMETRY = VisionGeometry(patch_size=16, spatial_merge_size=2, temporal_patch_size=2)
PIXEL_FACTOR = GEOMETRY.pixel_factor
IMAGE_MIN_PIXELS = PIXEL_FACTOR * PIXEL_FACTOR
IMAGE_MAX_PIXELS = 448 * 448
VIDEO_MIN_PIXELS = GEOMETRY.temporal_patch_size * PIXEL_FACTOR * PIXEL_FACTOR
VIDEO_MAX_PIXELS = 768 * PIXEL_FACTOR * PIXEL_FACTOR * PIXEL_FACTOR
# The released checkpoints normalise with mean = std = 0.5 (not CLIP's statistics).
IMAGE_MEAN = IMAGE_STD = (0.5, 0.5, 0.5)
# The released 24:20:20 split of the rotary half between time, height and width.
RELEASED_MROPE_SECTION = (24, 20, 20)
DEEPSTACK_LEVELS = 3  # as released


def mrope_section(head_dim: int) -> list[int]:
    """The released 24:20:20 M-RoPE split scaled to ``head_dim`` (24:20:20 of 64 = head_dim 128).

    >>> mrope_section(128), mrope_section(64), mrope_section(32)
    ([24, 20, 20], [12, 10, 10], [6, 5, 5])
    """
    released_half = sum(RELEASED_MROPE_SECTION)
    if (head_dim // 2 * RELEASED_MROPE_SECTION[1]) % released_half:
        raise ValueError(f"head_dim {head_dim} does not split 24:20:20; use a multiple of 32")
    spatial = head_dim // 2 * RELEASED_MROPE_SECTION[1] // released_half
    return [head_dim // 2 - 2 * spatial, spatial, spatial]


def deepstack_indexes(vision_depth: int, decoder_layers: int) -> list[int]:
    """Vision blocks feeding DeepStack: the first min(3, depth, decoder layers) blocks.

    The released towers take 3 blocks spread over 24-27; the presets' towers have 2 blocks,
    so both are used ([0, 1]) and DeepStack is exercised at every level a test can check.
    """
    return list(range(min(DEEPSTACK_LEVELS, vision_depth, decoder_layers)))


def text_config(preset: Preset, token_ids: dict[str, int]) -> dict[str, Any]:
    """The Qwen3 language model of ``preset`` (shared with Qwen3-VL-MoE)."""
    return {
        **qwen_text_fields(preset, token_ids),
        "head_dim": preset.head_dim,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5e6,
            "mrope_section": mrope_section(preset.head_dim),
            "mrope_interleaved": True,
        },
    }


def vision_config(preset: Preset) -> dict[str, Any]:
    """The Qwen3-VL vision tower of ``preset`` (shared with Qwen3-VL-MoE)."""
    return {
        "depth": preset.vision_depth,
        "hidden_size": preset.vision_hidden_size,
        "intermediate_size": preset.vision_intermediate_size,
        "num_heads": preset.vision_heads,
        "out_hidden_size": preset.hidden_size,
        "patch_size": GEOMETRY.patch_size,
        "spatial_merge_size": GEOMETRY.spatial_merge_size,
        "temporal_patch_size": GEOMETRY.temporal_patch_size,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": deepstack_indexes(preset.vision_depth, preset.num_layers),
        "initializer_range": preset.init_std,
    }


def make_config(preset: Preset, token_ids: dict[str, int]) -> Qwen3VLConfig:
    """The Qwen3-VL config of ``preset``, with the special-token ids of our tokenizer."""
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config=text_config(preset, token_ids),
        vision_config=vision_config(preset),
        **vision_token_ids(token_ids),
        tie_word_embeddings=False,
        dtype="float32",
    )


def make_processor(tokenizer: Any) -> Qwen3VLProcessor:
    """Processor that leaves 32-multiple frames within the pixel budgets untouched and never
    samples frames (see the module docstring)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    geometry = {
        "patch_size": GEOMETRY.patch_size,
        "merge_size": GEOMETRY.spatial_merge_size,
        "temporal_patch_size": GEOMETRY.temporal_patch_size,
    }
    normalisation = {"image_mean": list(IMAGE_MEAN), "image_std": list(IMAGE_STD)}
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": IMAGE_MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS},
        **geometry,
        **normalisation,
    )
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": VIDEO_MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS},
        do_sample_frames=False,
        cap_pixels_per_frame=False,
        **geometry,
        **normalisation,
    )
    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=tokenizer.chat_template,
    )


RECIPE = FamilyRecipe(
    name="qwen3_vl",
    description="Qwen3-VL: DeepStack, interleaved M-RoPE, '<t seconds>' text between frames",
    model_class="Qwen3VLForConditionalGeneration",
    geometry=GEOMETRY,
    default_system_turn=False,
    accepted_frames="sides multiples of 32, (frames rounded up to even) x area 2,048 to 25,165,824 "
    "pixels per video (e.g. 64x64 up to 6,144 frames)",
    make_config=make_config,
    make_processor=make_processor,
)
