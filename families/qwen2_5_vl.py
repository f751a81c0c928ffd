"""Qwen2.5-VL: time in real seconds on the temporal M-RoPE axis (``tokens_per_second``)."""

from __future__ import annotations

from typing import ClassVar

from core.positions import TemporalRule
from families.base import ModelFamily


class Qwen2_5_VL(ModelFamily):
    """Qwen2.5-VL (``qwen2_5_vl``): the ``scaled`` temporal rule; the merger outputs the
    language model's width (``vision_config.out_hidden_size``)."""

    name = "qwen2_5_vl"
    model_types: ClassVar[tuple[str, ...]] = ("qwen2_5_vl",)
    temporal: ClassVar[TemporalRule] = "scaled"

    @property
    def tokens_per_second(self) -> float:
        return float(self.vision.tokens_per_second)
