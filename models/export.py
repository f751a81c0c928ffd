"""Hugging Face model directories out of a trained policy: live (sharded or not), or from a
Lightning checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from families import family_of
from models.loading import load_model, load_processor
from models.lora import ADAPTER_DIR, LoraSettings, apply_lora, lora_layers, merged_state_dict, save_adapter

SHARDED_METADATA = "meta.pt"
"""A sharded checkpoint folder's file of everything but the shards (step, loops, hyper-parameters)."""


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether any parameter is a DTensor shard (FSDP2): then only all ranks together hold it."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def _writes_here() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def save_hf_model(model: Any, processor: Any, out_dir: str | Path) -> Path:
    """``save_pretrained`` of ``model`` (a live HF model) and ``processor`` into ``out_dir``.

    Call it on every rank: a sharded model (DTensor parameters) is gathered into a full state
    dict first, a collective all ranks join, parameter by parameter (each rank holds one full
    parameter at a time on its device; rank 0 collects the CPU copies it writes). Rank 0 alone
    writes, in either case. Returns ``out_dir``.

    A model with LoRA adapters (:mod:`models.lora`) is written merged (``W + scaling * B @ A``
    under the base names: a plain model directory, for transformers and vLLM alike), with the
    adapter alone beside it in PEFT's format in ``out_dir/adapter``; the live model is not
    changed.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    out = Path(out_dir)
    state = None
    if is_sharded(model):
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    adapted = bool(lora_layers(model))
    if adapted and state is None:
        state = {key: value.detach() for key, value in model.state_dict().items()}
    if _writes_here():
        out.mkdir(parents=True, exist_ok=True)
        if adapted:
            assert state is not None
            save_adapter(model, state, out / ADAPTER_DIR)
            state = merged_state_dict(model, state)
        write_weights(model, out, state)
        processor.save_pretrained(out)
    return out


def write_weights(model: Any, out: Path, state: dict[str, torch.Tensor] | None = None) -> None:
    """``model.save_pretrained(out)`` of ``state`` (default: the model's own), in the layout the
    released checkpoints of its family use (:meth:`families.ModelFamily.released_state_dict`)."""
    released = family_of(model.config).released_state_dict(state if state is not None else model.state_dict())
    if released is None:
        model.save_pretrained(out, state_dict=state)
    else:  # our conversion replaces transformers' own (which would undo it)
        model.save_pretrained(out, state_dict=released, save_original_format=False)


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

    ``ckpt_path`` is a checkpoint file, or the folder of a sharded (distributed) checkpoint,
    read here in one process whatever the world size that wrote it. The architecture,
    tokenizer and processor come from ``model_path`` (default: the directory the checkpoint
    records); every weight must match it exactly. A checkpoint of a LoRA run (its
    hyper-parameters hold ``lora``) is written merged, with the adapter in ``out_dir/adapter``.
    """
    path = Path(ckpt_path)
    # Lightning checkpoints hold optimizer state and hyper-parameters, not just tensors; only
    # load checkpoints you trust.
    checkpoint = torch.load(
        path / SHARDED_METADATA if path.is_dir() else path, map_location="cpu", weights_only=False
    )
    source = str(model_path) if model_path else checkpoint_model_path(checkpoint)
    model = load_model(source)
    lora = LoraSettings.of(checkpoint.get("hyper_parameters", {}).get("lora"))
    if lora is not None:
        apply_lora(model, lora)  # the checkpoint's names: base layers and adapters
    if path.is_dir():
        # Read straight into the model's tensors (the optimizer's shards are not read).
        target = {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}
        dcp.load(target, checkpoint_id=path, no_dist=True)
    else:
        state = {
            k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")
        }
        model.load_state_dict(state, strict=True)
    return save_hf_model(model, load_processor(source), out_dir)
