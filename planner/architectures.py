"""Model sizes for the memory planner: from a model directory's ``config.json``, or a published one.

:func:`architecture_from_config` reads a Hugging Face Qwen2.5-VL ``config.json`` in either
layout: the published checkpoints' (text fields at the top level, ``vision_config`` nested)
or transformers 5's (``text_config`` and ``vision_config`` nested), and a Qwen3-VL one, so
``lvrl plan`` works on a downloaded model, an SFT export or a model built by ``lvrl model
build``.

A published model's numbers (:mod:`families.published`) plan a config whose ``model_path``
is not on this machine (``lvrl plan --architecture qwen2.5-vl-7b``).
Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

from typing import Any

from families.published import UnknownArchitecture, published_config_json
from planner.memory import Architecture, TextModel, VisionModel

QWEN3_VL_TIMESTAMP_TOKENS = 11
"""Text Qwen3-VL's processor writes around each temporal patch: ``<1234.5 seconds>`` (with Qwen's
tokenizer, which gives each digit its own token: ``<``, four digits, ``.``, one digit, `` seconds``,
``>``) and the vision start and end tokens. A bound for videos under 10,000 s."""


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
