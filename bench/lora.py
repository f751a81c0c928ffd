"""LoRA vs full fine-tuning on one model: what trains, what it costs in memory, how long a step takes.

Per mode (full fine-tuning, then LoRA with the given rank on the language model's projections):

- trainable parameters, and their bytes as gradients and as AdamW state (measured: the
  ``.grad`` tensors after a backward pass and the optimizer's state tensors after a step);
- the GRPO reference with a KL term: the parameter bytes of the second model a full
  fine-tuning run loads (its language model: the reference never encodes video), against
  none with LoRA (the policy with its adapters disabled);
- step time: forward + backward + AdamW step of the SFT loss on one batch of synthetic video QA
  samples (median of ``--steps`` after one warm-up step), in CPU seconds of this process
  (``time.process_time``: steadier than wall time on a shared machine), computing on
  ``--threads`` threads (1 by default, so CPU seconds are compute seconds).

Usage: python bench/lora.py [--model DIR] [--rank 16] [--alpha 32] [--batch 4] [--frames 8]
       [--steps 5] [--threads 1] [--out bench/results/lora/<name>.json]
Without ``--model`` the ``small`` preset is built into a temporary directory (as
``lvrl model build --preset small`` does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root

from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from datatools.shard_writer import write_shards
from datatools.synthetic import SynthConfig, encoded_samples
from families import family_of
from models.build import build_model_dir
from models.grpo import GRPOModule
from models.lora import parameter_bytes
from models.sft import SFTModule

MIB = 2**20


def synthetic_batch(model_dir: Path, folder: Path, size: int, frames: int) -> dict[str, Any]:
    """One collated SFT batch of ``size`` synthetic video QA samples."""
    config = SynthConfig(num_frames=20, fps=2.0, size=56, seed=7)
    write_shards(
        encoded_samples(config, "train", size), folder, "train", max_samples_per_shard=size, progress=False
    )
    stream = VideoQAStream(resolve_shards(str(folder / "train-*.tar")), num_frames=frames, max_pixels=56 * 56)
    samples = [sample for _, sample in zip(range(size), stream, strict=False)]
    module = SFTModule(str(model_dir))
    from transformers import AutoConfig

    family = family_of(AutoConfig.from_pretrained(model_dir))
    return VideoQACollator(module.processor, family=family)(samples)


def measure(model_dir: Path, batch: dict[str, Any], settings: dict[str, Any], steps: int) -> dict[str, Any]:
    """Trainable parameters, gradient and AdamW bytes, and step seconds of one mode (``settings``:
    the module's arguments)."""
    module = SFTModule(str(model_dir), learning_rate=1e-4, **settings)
    module.configure_model()
    optimizer = module.configure_optimizers()["optimizer"]
    trainable = [p for p in module.parameters() if p.requires_grad]
    seconds = []
    for step in range(steps + 1):
        optimizer.zero_grad(set_to_none=True)
        start = time.process_time()
        module.token_mean_loss(batch).backward()
        grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None)
        optimizer.step()
        if step:  # the first step allocates the optimizer's state
            seconds.append(time.process_time() - start)
    state_bytes = sum(
        t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values() if t.dim()
    )
    return {
        "parameters": sum(p.numel() for p in module.parameters()),
        "trainable": sum(p.numel() for p in trainable),
        "grad_bytes": grad_bytes,
        "adam_bytes": state_bytes,
        "step_s": statistics.median(seconds),
    }


def reference_copy_bytes(model_dir: Path, settings: dict[str, Any]) -> int:
    """Parameter bytes of the GRPO reference model a KL term loads (0: none is loaded)."""
    module = GRPOModule(str(model_dir), kl_coef=0.05, lora=settings.get("lora"))
    module.configure_model()
    return 0 if module.reference is None else parameter_bytes(list(module.reference.parameters()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: build `small`)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or build_model_dir("small", Path(tmp) / "small", seed=0)
        batch = synthetic_batch(model_dir, Path(tmp) / "data", args.batch, args.frames)
        modes: dict[str, dict[str, Any]] = {
            "full": {},
            "full, vision frozen": {"freeze_vision": True},
            f"LoRA r={args.rank}": {"lora": {"r": args.rank, "alpha": args.alpha}},
        }
        rows = {name: measure(model_dir, batch, settings, args.steps) for name, settings in modes.items()}
        references = {name: reference_copy_bytes(model_dir, settings) for name, settings in modes.items()}
    print(
        f"model {model_dir if args.model else 'small preset'}; SFT step on {args.batch} samples x "
        f"{args.frames} frames; {args.threads} threads; median of {args.steps} steps"
    )
    header = (
        "| | trainable parameters | gradient bytes | AdamW state bytes | GRPO reference copy | step (CPU s) |"
    )
    print(header)
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        share = row["trainable"] / row["parameters"]
        print(
            f"| {name} | {row['trainable']:,} ({share:.1%}) | {row['grad_bytes'] / MIB:.2f} MiB | "
            f"{row['adam_bytes'] / MIB:.2f} MiB | {references[name] / MIB:.2f} MiB | {row['step_s']:.3f} |"
        )
    if args.out:
        from evaluation.provenance import provenance

        settings = {k: v for k, v in vars(args).items() if k not in ("out", "model")}
        report = {
            **provenance([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "model": str(args.model) if args.model else "small preset",
            "settings": settings,
            "modes": [
                {"mode": name, **row, "reference_bytes": references[name]} for name, row in rows.items()
            ],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
