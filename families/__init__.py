"""Model families: one file per family, chosen from the model's own config (``model_type``).

>>> from transformers import Qwen2VLConfig
>>> family_of(Qwen2VLConfig()).name
'qwen2_vl'

Adding a family means adding its file here (a :class:`~families.base.ModelFamily`
subclass) and its presets in :mod:`models.build`.
"""

from __future__ import annotations

from typing import Any

from core.layout import PositionRule
from families.base import ModelFamily, VisualFeatures
from families.qwen2_5_vl import Qwen2_5_VL
from families.qwen2_vl import Qwen2_VL
from families.qwen3_vl import Qwen3_VL

FAMILIES: dict[str, type[ModelFamily]] = {family.name: family for family in (Qwen2_VL, Qwen2_5_VL, Qwen3_VL)}
"""Every family lvrl runs, by name."""

_BY_MODEL_TYPE = {model_type: family for family in FAMILIES.values() for model_type in family.model_types}


class UnsupportedModel(ValueError):
    """A model directory whose ``model_type`` no family serves."""


def family_of(config: Any) -> ModelFamily:
    """The family of a HF model config (``config.model_type``), bound to that config."""
    model_type = getattr(config, "model_type", None)
    family = _BY_MODEL_TYPE.get(model_type)
    if family is None:
        known = ", ".join(sorted(_BY_MODEL_TYPE))
        raise UnsupportedModel(f"lvrl has no model family for model_type {model_type!r} (it runs: {known})")
    return family(config)


def position_rule_of(config: Any) -> PositionRule:
    """The M-RoPE position rule of a HF model config."""
    return family_of(config).position_rule


__all__ = ["FAMILIES", "ModelFamily", "UnsupportedModel", "VisualFeatures", "family_of", "position_rule_of"]
