"""Qwen2-VL: the temporal M-RoPE index is the temporal patch's index (no notion of seconds)."""

from __future__ import annotations

from typing import ClassVar

from core.positions import TemporalRule
from families.base import ModelFamily


class Qwen2_VL(ModelFamily):
    """Qwen2-VL (``qwen2_vl``): the ``index`` temporal rule. Its ``vision_config`` names the
    tower's own width ``embed_dim`` and the merger's output (the language width) ``hidden_size``."""

    name = "qwen2_vl"
    model_types: ClassVar[tuple[str, ...]] = ("qwen2_vl",)
    temporal: ClassVar[TemporalRule] = "index"
