"""Turn a Lightning checkpoint of an lvrl module back into a Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from models.loading import load_model, load_processor


def checkpoint_model_path(checkpoint: dict[str, Any]) -> str:
    """The model directory a checkpoint's module was built from (recorded at save time)."""
    recorded = checkpoint.get("lvrl", {}).get("model_path") or checkpoint.get("hyper_parameters", {}).get(
        "model_path"
    )
    if not recorded:
        raise ValueError("the checkpoint records no model_path: was it written by an lvrl module?")
    return str(recorded)


def export_checkpoint(
    ckpt_path: str | Path, out_dir: str | Path, model_path: str | Path | None = None
) -> Path:
    """Write the checkpoint's weights with ``save_pretrained`` plus the processor files.

    The architecture, tokenizer and processor come from ``model_path`` (default: the directory
    the checkpoint records); every weight must match it exactly.
    """
    # Lightning checkpoints hold optimizer state and hyper-parameters, not just tensors; only
    # load checkpoints you trust.
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    source = str(model_path) if model_path else checkpoint_model_path(checkpoint)
    model = load_model(source)
    state = {
        k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")
    }
    model.load_state_dict(state, strict=True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    load_processor(source).save_pretrained(out)
    return out
