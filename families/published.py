"""The numbers of the released checkpoints' ``config.json``, per family: what the planner plans
without the model on this machine (``lvrl plan --architecture``) and what a real-width random
model is built from (:mod:`models.published`).

:data:`PUBLISHED_CONFIGS` holds the architecture fields of Qwen2.5-VL-3B-Instruct's and
-7B-Instruct's published ``config.json`` (token ids and training-only fields left out), and
:data:`QWEN3_VL_PUBLISHED` those of Qwen3-VL-2B/4B-Instruct. Importing this module imports
neither torch nor transformers.
"""

from __future__ import annotations

from typing import Any


class UnknownArchitecture(ValueError):
    """No architecture could be found for a plan; the message says what to pass."""


_QWEN2_5_VL_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_chans": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2,
}

PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5-vl-3b": {
        "model_type": "qwen2_5_vl",
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": True,
        "vision_config": {**_QWEN2_5_VL_VISION, "out_hidden_size": 2048},
    },
    "qwen2.5-vl-7b": {
        "model_type": "qwen2_5_vl",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 128000,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "tie_word_embeddings": False,
        "vision_config": {**_QWEN2_5_VL_VISION, "out_hidden_size": 3584},
    },
}
"""Published ``config.json`` fields of Qwen/Qwen2.5-VL-3B-Instruct and Qwen/Qwen2.5-VL-7B-Instruct."""

QWEN3_VL_VISION = {
    "depth": 24,
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_heads": 16,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "deepstack_visual_indexes": [5, 11, 17],
    "num_position_embeddings": 2304,
}
QWEN3_VL_ROPE = {
    "rope_type": "default",
    "rope_theta": 5e6,
    "mrope_section": [24, 20, 20],
    "mrope_interleaved": True,
}
QWEN3_VL_MAX_POSITIONS = 262144

QWEN3_VL_PUBLISHED: dict[str, dict[str, Any]] = {
    "qwen3-vl-2b": {
        "text": {
            "vocab_size": 151936,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": QWEN3_VL_MAX_POSITIONS,
            "rope_parameters": QWEN3_VL_ROPE,
        },
        "vision": {**QWEN3_VL_VISION, "out_hidden_size": 2048},
        "tie_word_embeddings": True,
    },
    "qwen3-vl-4b": {
        "text": {
            "vocab_size": 151936,
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": QWEN3_VL_MAX_POSITIONS,
            "rope_parameters": QWEN3_VL_ROPE,
        },
        "vision": {**QWEN3_VL_VISION, "out_hidden_size": 2560},
        "tie_word_embeddings": True,
    },
}
"""The numbers of Qwen/Qwen3-VL-2B-Instruct's and -4B-Instruct's published ``config.json``, in
transformers' nested layout (``text`` / ``vision``); their ``head_dim`` (128) is not hidden /
heads."""


def published_names() -> list[str]:
    """Every published architecture known here."""
    return sorted([*PUBLISHED_CONFIGS, *QWEN3_VL_PUBLISHED])


def published_config_json(name: str) -> dict[str, Any]:
    """``name``'s architecture as a ``config.json`` would hold it (Qwen2.5-VL: the published flat
    layout; Qwen3-VL: transformers' nested one)."""
    if name in QWEN3_VL_PUBLISHED:
        spec = QWEN3_VL_PUBLISHED[name]
        return {
            "model_type": "qwen3_vl",
            "text_config": spec["text"],
            "vision_config": spec["vision"],
            "tie_word_embeddings": spec["tie_word_embeddings"],
        }
    if name not in PUBLISHED_CONFIGS:
        raise UnknownArchitecture(f"unknown architecture {name!r}; built-in: {', '.join(published_names())}")
    return PUBLISHED_CONFIGS[name]
