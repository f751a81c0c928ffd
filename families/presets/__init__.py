"""Build recipes of the model families ``lvrl model build --family`` offers, one module each.

Adding a family: a module here with a :class:`~families.presets.base.FamilyRecipe` named
``RECIPE``, listed in :data:`FAMILIES`. Sizes come from :data:`models.build.PRESETS`, shared by
all families. (Runtime behaviour of a family — positions, layout, encoding — lives in
``families/``; this package only builds directories.)
"""

from __future__ import annotations

from families.presets import qwen2_5_vl, qwen2_vl, qwen3_vl, qwen3_vl_moe
from families.presets.base import FamilyRecipe, VisionGeometry

DEFAULT_FAMILY = "qwen2_5_vl"
"""What ``lvrl model build`` builds without ``--family``: the directories it always built."""

FAMILIES: dict[str, FamilyRecipe] = {
    recipe.name: recipe
    for recipe in (qwen2_vl.RECIPE, qwen2_5_vl.RECIPE, qwen3_vl.RECIPE, qwen3_vl_moe.RECIPE)
}


def family_recipe(name: str) -> FamilyRecipe:
    """The recipe of family ``name`` (a ``model_type``), failing with the choices."""
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; choose one of {sorted(FAMILIES)}")
    return FAMILIES[name]


__all__ = ["DEFAULT_FAMILY", "FAMILIES", "FamilyRecipe", "VisionGeometry", "family_recipe"]
