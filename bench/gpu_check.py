"""The memory planner against a real GPU, in one short run (prepared for a lent H100 or H200).

1. **Ring attention at the 4,096-frame config's size**: one rank's slice of a 267,264-token row
   split over 8 ranks (33,408 positions), Qwen2.5-VL-7B's 28 query heads of 128, bf16, forward
   and backward on one GPU as a ring of one (the block passes are left out: one block, the
   rank's own, is what the chunk loop computes against). ``torch.cuda.max_memory_allocated``
   above the inputs beside :func:`planner.memory.ring_transient_bytes`.
2. **A GRPO step at 7B widths**: a Qwen2.5-VL with the 7B text widths and vocabulary and
   ``--layers`` decoder layers (random weights; the 7B vision tower's widths, 2 blocks), sharded by
   lvrl's FSDP2 layout over one rank, fp32 master weights, bf16 compute, checkpointing; one
   512-frame video, G=8 completions of 1,024 tokens scored one row at a time, the GRPO loss,
   backward and an AdamW update (``bench/plan_check.py``'s step, on the GPU). The peak beside the
   planner's step peak for the same settings, its allowances (CUDA context, NCCL, fragmentation)
   left out: they are not tensors ``max_memory_allocated`` counts.

Each prints, and writes to ``--out`` (JSON with command, commit, machine, date), the predicted
and measured bytes. ``--cpu-dry-run`` runs the same code on the CPU at toy sizes (the test suite
does, so the script cannot rot while no GPU is lent).

Usage: python bench/gpu_check.py [--layers 2] [--frames 512] [--out DIR] [--cpu-dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import plan_check  # noqa: E402
from evaluation.provenance import provenance  # noqa: E402
from planner.memory import RunSettings, TextModel, ring_transient_bytes  # noqa: E402

QWEN2_5_VL_7B_TEXT = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
}
QWEN2_5_VL_7B_VISION = {
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
}
TOY_TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
}
TOY_VISION = {"hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "out_hidden_size": 128}


class CudaMeter:
    """The CUDA caching allocator's peak of allocated bytes, reset between parts."""

    def reset(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())

    def now(self) -> int:
        return int(torch.cuda.memory_allocated())


class ResidentMeter:
    """Resident memory on the CPU (the dry run): its high-water mark, as ``plan_check`` reads it."""

    def reset(self) -> None:
        plan_check.reset_peak()

    def peak(self) -> int:
        return plan_check.peak_resident_bytes()

    def now(self) -> int:
        return plan_check.resident_bytes()


def ring_check(args: argparse.Namespace, device: torch.device, meter: Any) -> dict[str, Any]:
    """One rank's ring attention at the config's size, forward and backward, peak above the inputs,
    at the query chunk lvrl uses and at twice it: the difference is the score chunks alive at the
    peak, the rest the slice-sized float32 copies (the two unknowns the planner counts)."""
    import torch.distributed as dist

    import parallel.ring as ring
    from parallel.shard import SequenceShard

    heads, head_dim, slice_tokens = (28, 128, 33_408) if not args.cpu_dry_run else (4, 32, 4_096)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shard = SequenceShard(group=dist.group.WORLD, attention="ring")
    passes, schedule, query_chunk = ring._pass_on, ring.ring_schedule, ring.QUERY_CHUNK
    ring._pass_on = lambda tensors, shard: tensors  # a ring of one: no block travels
    # The planner's figure is the largest product any ring step computes: a rank's second chunk
    # against a whole later block (zigzag). A ring of one only scores its own block, whose
    # products are half as wide, so the check runs that one step instead.
    half, everything = slice(slice_tokens // 2, slice_tokens), slice(0, slice_tokens)
    ring.ring_schedule = lambda *_: [[ring.Block(half, everything, causal=False)]]
    generator = torch.Generator(device=device).manual_seed(0)

    def tensor(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)

    query, key, value = (tensor(1, heads, slice_tokens, head_dim).requires_grad_() for _ in range(3))
    grad_out = tensor(1, slice_tokens, heads, head_dim)
    peaks: dict[int, dict[str, int]] = {}
    try:
        for chunk in (query_chunk, 2 * query_chunk):
            ring.QUERY_CHUNK = chunk
            meter.reset()
            start = meter.now()
            out = ring.ring_attention(query, key, value, shard, head_dim**-0.5)
            forward = meter.peak() - start
            meter.reset()
            out.backward(grad_out)
            peaks[chunk] = {"forward": forward, "backward": meter.peak() - start}
            query.grad = key.grad = value.grad = None
            del out
    finally:
        ring._pass_on, ring.ring_schedule, ring.QUERY_CHUNK = passes, schedule, query_chunk
    measured = max(peaks[query_chunk].values())
    chunk_bytes = 4 * heads * query_chunk * slice_tokens  # float32 scores, one query chunk x the block
    copy_bytes = 4 * heads * head_dim * slice_tokens  # one float32 tensor the slice's size
    doubled = max(peaks[2 * query_chunk].values())
    chunks_alive = (doubled - measured) / chunk_bytes
    text = TextModel(heads * head_dim, 1, heads, heads, head_dim, 1, 1, False)
    settings = RunSettings(
        kind="grpo",
        world_size=8,
        devices_per_node=8,
        num_frames=1,
        max_pixels_per_frame=1,
        text_tokens=0,
        completion_tokens=0,
        sequence_parallel_size=8,
        sequence_parallel_attention="ring",
    )
    predicted = ring_transient_bytes(text, settings, rows=1, layer_tokens=slice_tokens)
    return {
        "slice_tokens": slice_tokens,
        "heads": heads,
        "head_dim": head_dim,
        "dtype": str(dtype),
        "query_chunk": query_chunk,
        "peaks": {str(chunk): peak for chunk, peak in peaks.items()},
        "score_chunks_alive": round(chunks_alive, 3),
        "slice_copies_alive": round((measured - chunks_alive * chunk_bytes) / copy_bytes, 3),
        "predicted": predicted,
        "measured": measured,
        "error": predicted / measured - 1,
    }


def grpo_check(args: argparse.Namespace, device: torch.device, meter: Any) -> dict[str, Any]:
    """One GRPO step of the 7B-width model (``plan_check``'s step) and the planner's peak for it."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from planner.architectures import architecture_from_config
    from planner.memory import Device, plan_memory

    text, vision = (TOY_TEXT, TOY_VISION) if args.cpu_dry_run else (QWEN2_5_VL_7B_TEXT, QWEN2_5_VL_7B_VISION)
    config_dict = {
        **plan_check.MODEL_CONFIG,
        **text,
        "num_hidden_layers": args.layers,
        "vision_config": {**plan_check.MODEL_CONFIG["vision_config"], **vision},
    }
    frames, generations, completion = (args.frames, 8, 1024) if not args.cpu_dry_run else (8, 4, 16)
    step_args = argparse.Namespace(
        frames=frames,
        generations=generations,
        micro_batch_rows=1,
        completion=completion,
        attention="ulysses",
        param_dtype="bfloat16",
        checkpointing=True,
        val_samples=0,
        val_new_tokens=1,
    )
    config = Qwen2_5_VLConfig(**{k: v for k, v in config_dict.items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    layout = plan_check.prompt_layout(frames, config_dict["vocab_size"])
    patches = int(layout.video_grid_thw.prod())
    pixels = torch.randn(patches, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(1))
    baseline = meter.now()
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration(config).train()
    model.model.visual.requires_grad_(False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    scope = plan_check.shard_model(model, torch.bfloat16, device.type)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    peaks = []
    for step in range(2):  # the second step has the optimizer's moments
        trace = plan_check.grpo_step(
            model, optimizer, layout, pixels, step_args, None, step, scope, meter, device
        )
        peaks.append(max(trace.values()) - baseline)
    arch = architecture_from_config(config_dict, "gpu-check")
    settings = plan_check.run_settings(1, 1, step_args)
    plan = plan_memory(arch, settings, Device("cpu", 2**40))  # tensors only: no CUDA allowances
    predicted = max(total for phase, total in plan.phase_totals.items() if phase != "validation")
    return {
        "layers": args.layers,
        "frames": frames,
        "predicted": predicted,
        "measured": max(peaks),
        "error": predicted / max(peaks) - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the 7B-width model")
    parser.add_argument("--frames", type=int, default=512)
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu_check.json")
    parser.add_argument("--cpu-dry-run", action="store_true", help="the same code on the CPU at toy sizes")
    args = parser.parse_args()
    import torch.distributed as dist

    device = torch.device("cpu" if args.cpu_dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA GPU here (--cpu-dry-run runs the code on the CPU)")
    meter = ResidentMeter() if args.cpu_dry_run else CudaMeter()
    store = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpu_check_store_{os.getpid()}"
    dist.init_process_group(
        "gloo" if args.cpu_dry_run else "nccl", store=dist.FileStore(str(store), 1), rank=0, world_size=1
    )
    started = time.perf_counter()
    try:
        ring = ring_check(args, device, meter)
        print(
            f"ring attention, one rank at {ring['slice_tokens']:,} positions: predicted "
            f"{ring['predicted'] / 2**30:.2f} GiB, measured {ring['measured'] / 2**30:.2f} GiB "
            f"({ring['error']:+.1%}); at the peak {ring['score_chunks_alive']:.2f} score chunks and "
            f"{ring['slice_copies_alive']:.2f} float32 copies of the slice",
            flush=True,
        )
        grpo = grpo_check(args, device, meter)
        print(
            f"GRPO step, {grpo['layers']} layers at {'toy' if args.cpu_dry_run else '7B'} widths, "
            f"{grpo['frames']} frames: predicted "
            f"{grpo['predicted'] / 2**30:.2f} GiB, measured {grpo['measured'] / 2**30:.2f} GiB "
            f"({grpo['error']:+.1%})",
            flush=True,
        )
    finally:
        dist.destroy_process_group()
        store.unlink(missing_ok=True)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else None
    summary = {
        **provenance(["python", "bench/gpu_check.py", *sys.argv[1:]], gpu),
        "seconds": round(time.perf_counter() - started, 1),
        "ring": ring,
        "grpo_step": grpo,
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
