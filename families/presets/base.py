"""What a model family contributes to ``lvrl model build``: its config, processor and geometry.

A :class:`FamilyRecipe` turns one :class:`Preset` (sizes shared by all families)
and the special-token ids of lvrl's local tokenizer into the family's own transformers config
and processor. :mod:`models.build` does the rest, alike for every family: train the tokenizer,
set the family's chat template, instantiate the model class, draw seeded weights, save.

Nothing here imports torch or transformers at import time: ``lvrl --help`` lists the families.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

EOS_TOKEN = "<|im_end|>"
"""The Qwen families' end of a turn (``eos_token_id``; lvrl's local tokenizer spells it the same)."""
PAD_TOKEN = "<|endoftext|>"
"""The Qwen families' padding and ``bos_token_id``."""


@dataclass(frozen=True)
class Preset:
    """Sizes of one buildable model, shared by every family (each maps them onto its own
    config: :mod:`families.presets`). ``init_std`` becomes both configs' ``initializer_range``.
    ``mrope_section`` is Qwen2(.5)-VL's split; Qwen3-VL scales its released 24:20:20 instead."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    mrope_section: tuple[int, int, int]
    vision_depth: int
    vision_hidden_size: int
    vision_heads: int
    vision_intermediate_size: int
    init_std: float
    description: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class VisionGeometry:
    """The vision tower's patching, kept as in the family's released checkpoints."""

    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int

    @property
    def pixel_factor(self) -> int:
        """Side, in pixels, of one merged visual token: frame sides must be multiples of it."""
        return self.patch_size * self.spatial_merge_size


@dataclass(frozen=True)
class FamilyRecipe:
    """How to build one model family.

    Attributes:
        name: the family's ``model_type`` (what ``config.json`` says and ``--family`` takes).
        description: one line for ``--help``.
        model_class: the transformers class to instantiate (a name: importing it costs seconds).
        geometry: patch, merge and temporal patch sizes of the vision tower.
        default_system_turn: whether the family's chat template adds the default system turn
            ("You are a helpful assistant.") to a conversation that has none.
        accepted_frames: which frames the saved processor passes through without resizing.
        make_config: ``(preset, special-token ids) -> config``.
        make_processor: ``tokenizer -> processor`` (the tokenizer already holds the template).
    """

    name: str
    description: str
    model_class: str
    geometry: VisionGeometry
    default_system_turn: bool
    accepted_frames: str
    make_config: Callable[[Preset, dict[str, int]], Any]
    make_processor: Callable[[Any], Any]


def check_mrope_section(section: tuple[int, ...] | list[int], head_dim: int) -> None:
    """M-RoPE splits the rotary half of each head between time, height and width."""
    if sum(section) * 2 != head_dim:
        raise ValueError(f"mrope_section {list(section)} must sum to head_dim/2 = {head_dim // 2}")


def qwen_text_fields(preset: Preset, token_ids: dict[str, int]) -> dict[str, Any]:
    """The language-model fields every Qwen VL family's ``text_config`` shares for ``preset``."""
    return {
        "vocab_size": preset.vocab_size,
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_layers,
        "num_attention_heads": preset.num_heads,
        "num_key_value_heads": preset.num_kv_heads,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "initializer_range": preset.init_std,
        "bos_token_id": token_ids[PAD_TOKEN],
        "eos_token_id": token_ids[EOS_TOKEN],
        # No pad_token_id here: it would become the embedding's padding_idx and freeze the
        # <|endoftext|> row. Padding is masked anyway; generate() takes it from generation_config.
        "dtype": "float32",
    }


def vision_token_ids(token_ids: dict[str, int]) -> dict[str, int]:
    """The top-level config's ids of the vision special tokens (same spellings in every family)."""
    return {
        "image_token_id": token_ids["<|image_pad|>"],
        "video_token_id": token_ids["<|video_pad|>"],
        "vision_start_token_id": token_ids["<|vision_start|>"],
        "vision_end_token_id": token_ids["<|vision_end|>"],
    }
