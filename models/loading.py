"""Loading a model directory (``save_pretrained`` layout) into transformers, offline.

The model class comes from the directory's own ``config.json`` (``model_type``, through the
transformers Auto classes), never from the path's name: a directory called ``qwen-7b`` holding
a tiny Qwen2.5-VL loads as what it is. Nothing is ever fetched from a hub.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    PretrainedConfig,
    PreTrainedModel,
    ProcessorMixin,
)

CONFIG_NAME = "config.json"
_BUILD_HINT = "build one with `lvrl model build --preset tiny --out DIR`"


def model_directory(path: str | Path) -> Path:
    """``path`` as a checked model directory: it exists and holds a ``config.json`` with a ``model_type``."""
    directory = Path(path).expanduser()
    if not directory.exists():
        raise FileNotFoundError(f"model directory {directory} does not exist; {_BUILD_HINT}")
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory} is a file, not a model directory; {_BUILD_HINT}")
    config_file = directory / CONFIG_NAME
    if not config_file.is_file():
        raise FileNotFoundError(f"{directory} is not a model directory (no {CONFIG_NAME}); {_BUILD_HINT}")
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (json.JSONDecodeError, AttributeError) as error:
        raise ValueError(f"{config_file} is not a valid model config: {error}") from error
    # transformers would fall back to guessing the type from the path; we refuse instead.
    if not model_type:
        raise ValueError(f"{config_file} has no 'model_type'; cannot tell which model it describes")
    return directory


def load_config(path: str | Path) -> PretrainedConfig:
    return AutoConfig.from_pretrained(model_directory(path), local_files_only=True)


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None
) -> PreTrainedModel:
    """The model of directory ``path``: an image/video-text-to-text class when the config has one
    (Qwen2.5-VL and the other VLMs), else a causal LM. Returned in eval mode on the CPU."""
    directory = model_directory(path)
    config = load_config(directory)
    kwargs: dict[str, object] = {"dtype": dtype, "local_files_only": True}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    for auto_class in (AutoModelForImageTextToText, AutoModelForCausalLM):
        if type(config) in auto_class._model_mapping:
            return auto_class.from_pretrained(directory, config=config, **kwargs).eval()
    raise ValueError(
        f"model_type {config.model_type!r} of {directory} is neither an image-text-to-text model "
        "nor a causal LM"
    )


def model_skeleton(
    path: str | Path, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None
) -> PreTrainedModel:
    """The model of directory ``path`` as :func:`load_model` gives it, but empty: its tensors on
    the meta device (no memory, no values), to be filled by another rank
    (:func:`parallel.sharding.fill_from_rank0`)."""
    directory = model_directory(path)
    config = load_config(directory)
    kwargs: dict[str, object] = {"dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    for auto_class in (AutoModelForImageTextToText, AutoModelForCausalLM):
        if type(config) in auto_class._model_mapping:
            with torch.device("meta"):
                return auto_class.from_config(config, **kwargs).eval()
    raise ValueError(
        f"model_type {config.model_type!r} of {directory} is neither an image-text-to-text model "
        "nor a causal LM"
    )


def load_processor(path: str | Path) -> ProcessorMixin:
    """The processor (tokenizer + image/video processors + chat template) saved in directory ``path``."""
    return AutoProcessor.from_pretrained(model_directory(path), local_files_only=True)
