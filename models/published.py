"""Random-weight models at the published widths of real checkpoints, built offline.

Nothing can be downloaded on our machines, yet memory and speed at real width are what a GPU
run needs to know before it starts. :func:`build_published` makes a model with exactly the
architecture of Qwen2.5-VL-3B/7B-Instruct or Qwen3-VL-2B/4B-Instruct (their ``config.json``
numbers: ``PUBLISHED_CONFIGS`` and ``QWEN3_VL_PUBLISHED`` in :mod:`planner.architectures`), with
lvrl's local tokenizer and the family's processor, directly on a device and in a dtype: the
presets' path (float32 on the CPU, every weight redrawn) would need ~18 GB of host memory for a
4B model. ``lvrl model build --published NAME`` writes one as a model directory
(``--config-only``: config and processor alone, for ``lvrl plan``).

The widths are the published ones; the vocabulary *rows* are too (151,936), though our
tokenizer uses only its first few thousand ids, so the embedding and LM head cost what they
cost in the real model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from families.presets import family_recipe
from families.presets.base import qwen_text_fields, vision_token_ids
from families.published import QWEN3_VL_PUBLISHED, published_config_json
from models.build import PRESETS, default_dtype

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

INIT_STD = 0.02
"""Standard deviation of the random weights (transformers' own init, as the real configs set it)."""


def published_spec(name: str) -> tuple[str, dict[str, Any]]:
    """``(family, spec)`` of ``name``, the spec nested as ``QWEN3_VL_PUBLISHED``'s: Qwen2.5-VL's
    flat published layout is regrouped (its ``rope_scaling`` and ``rope_theta`` become
    ``rope_parameters``).

    >>> family, spec = published_spec("qwen2.5-vl-7b")
    >>> family, spec["text"]["hidden_size"], spec["text"]["rope_parameters"]["mrope_section"]
    ('qwen2_5_vl', 3584, [16, 24, 24])
    >>> published_spec("qwen9-vl")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    families.published.UnknownArchitecture: unknown architecture 'qwen9-vl'; built-in: ...
    """
    config = published_config_json(name)  # the one place a published name is checked
    if config["model_type"] == "qwen3_vl":
        return "qwen3_vl", QWEN3_VL_PUBLISHED[name]
    grouped = {"model_type", "vision_config", "tie_word_embeddings", "rope_scaling", "rope_theta"}
    text = {key: value for key, value in config.items() if key not in grouped}
    section = config["rope_scaling"]["mrope_section"]
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": config["rope_theta"],
        "mrope_section": section,
    }
    spec = {
        "text": text,
        "vision": config["vision_config"],
        "tie_word_embeddings": config["tie_word_embeddings"],
    }
    return config["model_type"], spec


def published_config(name: str, token_ids: dict[str, int], dtype: torch.dtype) -> PretrainedConfig:
    """The transformers config of ``name``'s published widths with our tokenizer's special-token
    ids; checked field by field against the published numbers (a field the config class renamed
    or derived would otherwise be silently dropped)."""
    import transformers

    family, spec = published_spec(name)
    config_class = getattr(transformers, family_recipe(family).model_class).config_class
    # The small preset supplies what the widths leave open: token ids, norm epsilon.
    text = {
        **qwen_text_fields(PRESETS["small"], token_ids),
        **spec["text"],
        "initializer_range": INIT_STD,
        "dtype": str(dtype).removeprefix("torch."),
    }
    config = config_class(
        text_config=text,
        vision_config={**spec["vision"], "initializer_range": INIT_STD},
        **vision_token_ids(token_ids),
        tie_word_embeddings=spec["tie_word_embeddings"],
    )
    for part, values in (("text_config", spec["text"]), ("vision_config", spec["vision"])):
        for key, value in values.items():
            if key == "in_chans":  # the published spelling of the class's in_channels
                key = "in_channels"
            if getattr(getattr(config, part), key, None) != value:
                raise AssertionError(
                    f"{name}: {part}.{key} is {getattr(getattr(config, part), key, None)}, published {value}"
                )
    return config


def build_published(
    name: str,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int = 0,
    corpus_files: Sequence[str | Path] = (),
    tokenizer: str = "local",
) -> tuple[Any, Any]:
    """``(model, processor)``: a random-weight model of ``name``'s published widths, made
    directly on ``device`` in ``dtype`` by transformers' own init (seeded by ``seed``; on the
    ``meta`` device nothing is allocated), generating until the end of the assistant turn, with
    the ``tokenizer`` of :data:`models.build.TOKENIZERS` (the local one trained on
    ``corpus_files`` too, as a preset's) and the family's processor."""
    import torch
    import transformers

    from models.build import family_tokenizer, generation_config
    from models.tokenizer import special_token_ids

    family, _ = published_spec(name)
    recipe = family_recipe(family)
    # The embedding keeps the published rows whichever the tokenizer (the config's vocab_size).
    text_tokenizer, _ = family_tokenizer(tokenizer, family, PRESETS["small"].vocab_size, corpus_files)
    config = published_config(name, special_token_ids(text_tokenizer), dtype)
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype):
        model = getattr(transformers, recipe.model_class)(config)
    model.generation_config = generation_config(config, text_tokenizer)
    return model, recipe.make_processor(text_tokenizer)
