"""Model sizes for the memory planner: from a model directory's ``config.json``, or a published one.

:func:`architecture_from_config` reads a Hugging Face Qwen2.5-VL ``config.json`` in either
layout: the published checkpoints' (text fields at the top level, ``vision_config`` nested)
or transformers 5's (``text_config`` and ``vision_config`` nested), and a Qwen3-VL one, so
``lvrl plan`` works on a downloaded model, an SFT export or a model built by ``lvrl model
build``.

:data:`PUBLISHED_CONFIGS` holds the architecture fields of Qwen2.5-VL-3B-Instruct's and
-7B-Instruct's published ``config.json`` (token ids and training-only fields left out), and
:data:`QWEN3_VL_PUBLISHED` those of Qwen3-VL-2B/4B-Instruct, so a config whose ``model_path``
is not on this machine can still be planned (``lvrl plan --architecture qwen2.5-vl-7b``).
Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

from typing import Any

from parallel.memory_plan import Architecture, TextModel, VisionModel

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

QWEN3_VL_TIMESTAMP_TOKENS = 11
"""Text Qwen3-VL's processor writes around each temporal patch: ``<1234.5 seconds>`` (with Qwen's
tokenizer, which gives each digit its own token: ``<``, four digits, ``.``, one digit, `` seconds``,
``>``) and the vision start and end tokens. A bound for videos under 10,000 s."""


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


class UnknownArchitecture(ValueError):
    """No architecture could be found for a plan; the message says what to pass."""


def published_architecture(name: str) -> Architecture:
    """The :class:`Architecture` of a published model (one of :func:`published_names`)."""
    return architecture_from_config(published_config_json(name), name)


def architecture_from_config(config: dict[str, Any], name: str = "model") -> Architecture:
    """The sizes in a Qwen2.5-VL ``config.json`` (either layout; see the module docstring) or a
    Qwen3-VL one."""
    model_type = config.get("model_type")
    if model_type not in ("qwen2_5_vl", "qwen3_vl", None):
        raise UnknownArchitecture(
            f"the planner knows Qwen2.5-VL and Qwen3-VL (model_type qwen2_5_vl, qwen3_vl); {name} is "
            f"{model_type!r}"
        )
    qwen3 = model_type == "qwen3_vl"
    text_config = config.get("text_config") or config
    vision_config = config.get("vision_config")
    if not vision_config:
        raise UnknownArchitecture(f"{name}: config.json has no vision_config")
    hidden, heads = int(text_config["hidden_size"]), int(text_config["num_attention_heads"])
    # transformers 5 writes tie_word_embeddings at the top level; older files also in the text part.
    tied = config.get("tie_word_embeddings", text_config.get("tie_word_embeddings", False))
    text = TextModel(
        hidden_size=hidden,
        num_layers=int(text_config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(text_config.get("num_key_value_heads") or heads),
        head_dim=int(text_config.get("head_dim") or hidden // heads),
        intermediate_size=int(text_config["intermediate_size"]),
        vocab_size=int(text_config["vocab_size"]),
        tied_embeddings=bool(tied),
        qk_norm=qwen3,
        # Qwen2 decoders bias q/k/v always; Qwen3's attention_bias (off in the released models)
        # biases all four projections.
        qkv_bias=bool(text_config.get("attention_bias", False)) if qwen3 else True,
        o_bias=bool(text_config.get("attention_bias", False)) if qwen3 else False,
    )
    qwen3_tower = {
        "mlp": "gelu",
        "norm": "layer",
        "patch_bias": True,
        "position_embeddings": int(vision_config.get("num_position_embeddings", 0)),
        "deepstack_levels": len(vision_config.get("deepstack_visual_indexes", [])),
        "text_tokens_per_temporal_patch": QWEN3_VL_TIMESTAMP_TOKENS,
    }
    vision = VisionModel(
        depth=int(vision_config["depth"]),
        hidden_size=int(vision_config["hidden_size"]),
        intermediate_size=int(vision_config["intermediate_size"]),
        num_heads=int(vision_config["num_heads"]),
        out_hidden_size=int(vision_config["out_hidden_size"]),
        patch_size=int(vision_config.get("patch_size", 14)),
        temporal_patch_size=int(vision_config.get("temporal_patch_size", 2)),
        spatial_merge_size=int(vision_config.get("spatial_merge_size", 2)),
        in_channels=int(vision_config.get("in_channels", vision_config.get("in_chans", 3))),
        **(qwen3_tower if qwen3 else {}),
    )
    return Architecture(name, text, vision)
