"""Plan a run's memory before launching it: a per-GPU table and a verdict (fits or not, what to change).

``lvrl plan --config configs/qwen2_5_vl/grpo_7b.yaml --architecture qwen2.5-vl-7b --gpus 8
--gpu-memory 80GB`` prints what each GPU holds in the two phases of a step (rollout, training)
and exits 0 when the peak fits, 1 when it does not. Pure arithmetic (:mod:`planner.memory`):
no GPU, model weights or data needed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evaluation.tables import RULE, Column, Table, render_table

if TYPE_CHECKING:
    from planner.advice import Suggestion
    from planner.memory import MemoryPlan

INPUTS = """\
Read from the config (a key left out takes its class's default):
  trainer: devices x num_nodes (the world; --gpus/--nodes override), precision (bf16-true makes
    the master weights bfloat16), strategy: parallel.strategy.SequenceParallelStrategy init_args
    sequence_parallel_size, sequence_parallel_attention (ulysses|ring), sharding (full: FSDP2
    over the whole world; hybrid: within a node), param_dtype (compute), reduce_dtype, cpu_offload
    (parameters, gradients and optimizer states on the host); any other strategy (ddp) holds a
    full copy per GPU.
  model.init_args: class (GRPOModule or SFTModule), model_path (its config.json gives the sizes,
    else --architecture), dtype (master weights, float32), freeze_vision (a frozen tower is
    replicated, not sharded), gradient_checkpointing, micro_batch_rows, kl_coef (> 0: a reference
    model), reference_placement (sharded|cpu), share_prompt_prefix.
  data.init_args: num_frames, max_pixels_per_frame (tokens per frame pair = pixels / (28 x 28)),
    batch_size (per data-parallel rank), max_prompt_tokens (the prompt's text bound; --text-tokens
    overrides), max_target_tokens (SFT: the target's bound).
  trainer.callbacks RolloutCallback (GRPO): num_generations (G), max_new_tokens (the completion
    length; of each turn with tool_use), tool_use (frames on request: planned at its budgets,
    max_calls + 1 turns and frames_per_episode served frames in every row), engine
    rollout.vllm_engine.VLLMEngine init_args dtype, gpu_memory_utilization (the
    share vLLM reserves), max_model_len, max_num_seqs, enable_sleep_mode (vLLM releases its
    memory while the trainer trains); or rollout.hf_engine.TransformersEngine (sampling with the
    policy: under FSDP2 the whole model gathered in the compute dtype, and one prompt's KV cache).
The plan, per GPU and per phase of a step (rollout: vLLM awake, the video encoded; weight sync:
one full parameter streamed to vLLM; training at the output head: logits and their gradients;
training through the blocks: one block's recomputed working set): sharded master parameters,
gradients and AdamW states; the reference; FSDP2's gathered units and unsharded gradients;
activations of one micro-batch (checkpointed: one hidden state per layer per token; the
sequence split divides tokens); the frozen vision tower, its encoding working set and the
cached video embeddings; vLLM's reserved share (checked to hold its weights, activations and
the KV cache of G x (prompt + completion, with tool use the replies too), the prompt stored
once by prefix caching); and a
framework overhead allowance (CUDA context, NCCL, fragmentation). Exit status 0: fits; 1: not."""


def register(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``lvrl plan``."""
    from families.published import published_names

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = INPUTS
    parser.add_argument("--config", type=Path, required=True, help="an `lvrl fit` config (YAML)")
    parser.add_argument(
        "--architecture",
        choices=published_names(),
        help="plan a published model's sizes (for a config whose model_path is not on this machine)",
    )
    parser.add_argument("--gpus", type=int, help="GPUs per node (default: trainer.devices)")
    parser.add_argument("--nodes", type=int, help="nodes (default: trainer.num_nodes, or 1)")
    parser.add_argument(
        "--gpu-memory",
        default="80GB",
        help="memory of one GPU: 80GB, 79.2GiB, 81920MiB (GB = GiB, as GPUs are sold; default 80GB)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="plan GPUs, or CPU processes (no vLLM, no CUDA overhead; for checking the planner)",
    )
    parser.add_argument(
        "--text-tokens", type=int, help="prompt text tokens (default: data.max_prompt_tokens)"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(run=run_plan)


def run_plan(args: argparse.Namespace) -> None:
    """Handler of ``lvrl plan``: print the table and verdict; exit 1 when the plan does not fit."""

    from app.lightning_cli import parsed_fit_config
    from families.published import UnknownArchitecture
    from planner.advice import combined_changes, suggestions
    from planner.memory import Device, plan_memory
    from planner.run_config import (
        PlanInputError,
        architecture_for,
        parse_memory,
        run_settings,
        with_engine_limits,
    )

    if not args.config.is_file():
        raise SystemExit(f"lvrl plan: error: config {args.config} does not exist")
    # Read as `lvrl fit` reads it: every class's defaults filled in from its own signature.
    config = parsed_fit_config(args.config)
    try:
        memory = parse_memory(args.gpu_memory)
        arch = architecture_for(config, args.architecture)
        settings = run_settings(config, args.gpus, args.nodes, args.text_tokens)
    except (PlanInputError, UnknownArchitecture, ValueError) as error:
        raise SystemExit(f"lvrl plan: error: {error}") from error
    settings = with_engine_limits(arch, settings)
    plan = plan_memory(arch, settings, Device(args.device, memory))
    ideas = [] if plan.fits else suggestions(plan)
    combined = [] if plan.fits else combined_changes(plan)
    if args.json:
        print(json.dumps(plan_json(plan, ideas, combined), indent=2))
    else:
        print(plan_text(plan, str(args.config), ideas, combined))
    if not plan.fits:
        raise SystemExit(1)


def _gib(value: float) -> str:
    return f"{value / 2**30:.2f}"


def _header(plan: MemoryPlan, config_name: str) -> list[str]:
    from planner.memory import format_count, format_gib

    run, tokens = plan.settings, plan.tokens
    units = "GPUs" if plan.device.kind == "cuda" else "CPU processes"
    target = "completion" if run.kind == "grpo" else "target"
    layout = f"sequence-parallel {run.sequence_parallel_size}"
    if run.sequence_parallel_size > 1:
        layout += f", {run.sequence_parallel_attention}"
    layout += f"; sharding {run.sharding}; " + (
        "checkpointed" if run.gradient_checkpointing else "not checkpointed"
    )
    per_patch = plan.architecture.vision.text_tokens_per_temporal_patch
    written = run.num_frames // plan.architecture.vision.temporal_patch_size * per_patch
    timestamps = f"; {written:,} more in the prompt for their times" if written else ""
    if run.tool_calls:
        target = f"{run.tool_calls + 1} turns x {run.completion_tokens:,} = {tokens.completion:,}"
        target += (
            f", replies {tokens.replies:,} ({run.tool_calls} request(s), {run.tool_frames} frames "
            f"= {tokens.served_video:,} video tokens, their times and text)"
        )
    else:
        target += f" {tokens.completion:,}"
    return [
        f"lvrl plan: {config_name} on {run.world_size} x {format_gib(plan.device.memory)} ({units}); "
        f"{plan.architecture.name}, {format_count(plan.architecture.parameters())} parameters",
        f"tokens: video {tokens.video:,} ({run.num_frames:,} frames{timestamps}), prompt {tokens.prompt:,}, "
        f"{target}; {tokens.rows} row(s) per micro-batch, "
        f"{tokens.layer_tokens:,} tokens per rank through the layers ({layout})",
        "",
    ]


def _titles(plan: MemoryPlan) -> dict[str, str]:
    first = "rollout" if plan.settings.kind == "grpo" else "encoding"
    return {
        "rollout": first,
        "sync": "weight sync",
        "head": "train: head",
        "layers": "train: blocks",
        "end": "train: end",
        "validation": "validation",
    }


def _table(plan: MemoryPlan) -> list[str]:
    phases, titles = list(plan.phase_totals), _titles(plan)
    units = "GPU" if plan.device.kind == "cuda" else "CPU process"
    rows: list[tuple[str, ...]] = []
    for line in plan.lines:
        cells = [_gib(line.bytes) if line.held_in(phase) else "-" for phase in phases]
        rows.append((line.name, *cells, line.note))
    rows += [RULE, (f"total per {units} (GiB)", *(_gib(plan.phase_totals[phase]) for phase in phases))]
    table = Table([Column("", "left"), *(Column(titles[p]) for p in phases), Column("how", "left")], rows)
    return [row.rstrip() for row in render_table(table, "text").splitlines()]


def _engine_lines(plan: MemoryPlan) -> list[str]:
    from planner.memory import format_gib

    engine, settings = plan.engine, plan.settings.engine
    if engine is None or settings is None:
        return []
    out = [
        f"vLLM: reserves {format_gib(engine.reserved)}; weights {format_gib(engine.weights)}, activations "
        f"{format_gib(engine.activations)}, encoder cache {format_gib(engine.encoder_cache)} leave "
        f"{format_gib(engine.kv_available)} for the KV cache, which needs {format_gib(engine.kv_needed)} "
        f"({engine.kv_tokens:,} tokens): {'fits' if engine.fits else 'DOES NOT FIT'}"
    ]
    parts = "prompt + replies + turns" if plan.tokens.replies else "prompt + completion"
    if settings.max_model_len < engine.max_model_len_needed:
        out.append(
            f"note: max_model_len {settings.max_model_len:,} is below the longest row "
            f"{engine.max_model_len_needed:,} ({parts}): vLLM will refuse the longest prompts"
        )
    return out


def plan_text(plan: MemoryPlan, config_name: str, ideas: list[Suggestion], combined: list[Suggestion]) -> str:
    """The table, the engine check and the verdict, as ``lvrl plan`` prints them."""
    from planner.memory import format_gib

    out = [*_header(plan, config_name), *_table(plan), "", *_engine_lines(plan)]
    phase = _titles(plan)[plan.peak_phase]
    verdict = "fits" if plan.fits else "does not fit"
    out.append(
        f"{verdict}: peak {format_gib(plan.peak)} ({phase} phase) of {format_gib(plan.device.memory)}, "
        f"headroom {format_gib(plan.headroom)}"
    )
    if ideas:
        out.append("what to change (each alone, memory saved at the peak):")
        out += [f"  {s.change}: {saving_text(s.saving)}" for s in ideas]
    if combined:
        done = combined[-1].plan
        steps = " + ".join(s.change.split(" (")[0] for s in combined)
        state = "fits" if done.fits else "still does not fit"
        out.append(f"applied in order until it fits: {steps} -> peak {format_gib(done.peak)}, {state}")
    return "\n".join(out)


def saving_text(saving: float) -> str:
    """``saves 2.03 GiB``, or ``costs ...`` for a change that makes room elsewhere (the vLLM share)."""
    from planner.memory import format_gib

    return f"saves {format_gib(saving)}" if saving >= 0 else f"costs {format_gib(-saving)} at the peak"


def plan_json(plan: MemoryPlan, ideas: list[Suggestion], combined: list[Suggestion]) -> dict[str, Any]:
    """The plan as plain data (bytes everywhere)."""
    engine = plan.engine
    return {
        "architecture": plan.architecture.name,
        "parameters": plan.architecture.parameters(),
        "device": {"kind": plan.device.kind, "memory": plan.device.memory, "count": plan.settings.world_size},
        "tokens": vars(plan.tokens),
        "lines": [
            {"name": line.name, "bytes": int(line.bytes), "phase": line.phase, "note": line.note}
            for line in plan.lines
        ],
        "phase_totals": {phase: int(total) for phase, total in plan.phase_totals.items()},
        "peak": int(plan.peak),
        "peak_phase": plan.peak_phase,
        "headroom": int(plan.headroom),
        "engine": None
        if engine is None
        else {
            "reserved": int(engine.reserved),
            "weights": int(engine.weights),
            "activations": int(engine.activations),
            "encoder_cache": int(engine.encoder_cache),
            "kv_needed": int(engine.kv_needed),
            "kv_available": int(engine.kv_available),
            "kv_tokens": engine.kv_tokens,
            "fits": engine.fits,
        },
        "fits": plan.fits,
        "suggestions": [{"change": s.change, "saving": int(s.saving), "fits": s.plan.fits} for s in ideas],
        "combined": [s.change for s in combined],
    }
