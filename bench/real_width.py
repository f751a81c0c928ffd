"""A benchmark model with Qwen2.5-VL-7B's vision widths: what the vision-cache benchmarks measure.

The ``tiny``/``small`` presets have 64- and 128-wide vision towers that cost milliseconds, so
caching their output saves little. Here the vision tower has the published Qwen2.5-VL-7B
widths (``Qwen/Qwen2.5-VL-7B-Instruct``'s ``vision_config``: hidden 1280, 16 heads, SwiGLU
intermediate 3420, 14-pixel patches, 2 frames per temporal patch, 2x2 spatial merge, window
attention over 112-pixel windows with full attention in every 8th block) but fewer blocks
(random weights, built from transformers' config classes: nothing is downloaded). The
published tower has 32 blocks with full attention in blocks 7, 15, 23 and 31 (the last of each
8); with fewer than 8 blocks that pattern leaves only the last block on full attention.

The language model is one of :data:`models.build.PRESETS` (``tiny`` by default): a 7B
language model's forward over tens of thousands of video tokens is far beyond a 2-core CPU.
The merger's output width must equal the language model's hidden size, so it is that preset's
width rather than 7B's 3584 (:func:`merger_flops_missing` says what that leaves out).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from families.presets.qwen2_5_vl import make_config, make_processor
from models.build import PRESETS, instantiate, save_model_dir

# Qwen2.5-VL-7B-Instruct's published vision_config (config.json on the hub), copied as numbers.
VISION_7B: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 1280,
    "num_heads": 16,
    "intermediate_size": 3420,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "out_hidden_size": 3584,
    "tokens_per_second": 2,
}
FULL_ATTENTION_EVERY = 8
"""Blocks per window-attention group in the published tower: blocks 7, 15, 23, 31 attend fully."""

INIT_STD = 0.02
"""Standard deviation of every random weight (the usual transformers initializer range)."""


def full_attention_blocks(depth: int) -> list[int]:
    """The published pattern (the last block of every 8 attends fully) scaled to ``depth`` blocks.

    >>> full_attention_blocks(32)
    [7, 15, 23, 31]
    >>> full_attention_blocks(4), full_attention_blocks(12)
    ([3], [7, 11])
    """
    blocks = list(range(FULL_ATTENTION_EVERY - 1, depth, FULL_ATTENTION_EVERY))
    if not blocks or blocks[-1] != depth - 1:
        blocks.append(depth - 1)  # the tower's last block always attends fully, as in 7B
    return blocks


def tokens_per_frame(side: int) -> float:
    """Merged visual tokens per frame of ``side`` x ``side`` pixels (a side that is a multiple of 28).

    ``side / 14`` patches a side, merged 2x2, per temporal patch of 2 frames.

    >>> tokens_per_frame(224)  # 16 x 16 patches -> 8 x 8 merged tokens per 2 frames
    32.0
    >>> tokens_per_frame(448)
    128.0
    """
    merged_side = side // (VISION_7B["patch_size"] * VISION_7B["spatial_merge_size"])
    return merged_side**2 / VISION_7B["temporal_patch_size"]


def merger_flops_missing(language_hidden: int) -> int:
    """Multiply-adds per visual token of 7B's last merger layer that a narrower output leaves out."""
    merged_width = VISION_7B["hidden_size"] * VISION_7B["spatial_merge_size"] ** 2
    return merged_width * (VISION_7B["out_hidden_size"] - language_hidden)


def build_real_width_model(vision_depth: int = 2, language: str = "tiny", seed: int = 0) -> tuple[Any, Any]:
    """In memory: ``(model, processor)``, 7B's vision widths with ``vision_depth`` blocks."""

    from models.tokenizer import special_token_ids, train_tokenizer

    if vision_depth < 1:
        raise ValueError(f"vision_depth={vision_depth}: the tower needs at least one block")
    preset = dataclasses.replace(
        PRESETS[language],
        vision_depth=vision_depth,
        vision_hidden_size=VISION_7B["hidden_size"],
        vision_heads=VISION_7B["num_heads"],
        vision_intermediate_size=VISION_7B["intermediate_size"],
        init_std=INIT_STD,
    )
    tokenizer = train_tokenizer(preset.vocab_size, [])
    tokenizer.model_max_length = 128000  # the positions below; a 1,024-frame prompt is ~33k tokens
    config = make_config(preset, special_token_ids(tokenizer))
    vision = config.vision_config
    geometry = ("patch_size", "temporal_patch_size", "spatial_merge_size", "window_size", "tokens_per_second")
    for key in geometry:
        if getattr(vision, key) != VISION_7B[key]:
            raise AssertionError(f"vision {key} is {getattr(vision, key)}, 7B has {VISION_7B[key]}")
    vision.fullatt_block_indexes = full_attention_blocks(vision_depth)
    # 7B's context (128k positions): a 1,024-frame video is ~33k tokens, past the presets' 32k.
    config.text_config.max_position_embeddings = 128000
    return instantiate(config, tokenizer, INIT_STD, seed), make_processor(tokenizer)


def build_real_width_model_dir(out_dir: str | Path, vision_depth: int = 2, language: str = "tiny") -> Path:
    """Write :func:`build_real_width_model`'s model to ``out_dir`` (transformers and vLLM load it)."""
    model, processor = build_real_width_model(vision_depth, language)
    return save_model_dir(model, processor, out_dir)


def describe(model: Any) -> str:
    """One line: the vision tower's shape and parameter count, and the language model it feeds."""
    vision, text = model.config.vision_config, model.config.text_config
    tower = sum(p.numel() for p in model.model.visual.parameters())
    total = sum(p.numel() for p in model.parameters())
    return (
        f"vision tower: Qwen2.5-VL-7B widths (hidden {vision.hidden_size}, {vision.num_heads} heads, "
        f"MLP {vision.intermediate_size}, patch {vision.patch_size}, "
        f"temporal patch {vision.temporal_patch_size}, merge {vision.spatial_merge_size}), "
        f"{vision.depth} of 32 blocks (full attention in {list(vision.fullatt_block_indexes)}), "
        f"merger out {vision.out_hidden_size} (7B: 3584), "
        f"{tower / 1e6:.0f}M parameters, random weights; language model: {text.num_hidden_layers} layers "
        f"of width {text.hidden_size}, {(total - tower) / 1e6:.1f}M parameters"
    )
