"""The memory planner against measured peak memory: scaled-down GRPO steps in 1, 2 and 4 CPU processes.

Each configuration runs real gloo processes: a ~70M-parameter Qwen2.5-VL built from a config
here (random weights; text 512 wide x 12 layers, 32k vocabulary, a small vision tower), its
language model sharded with torch FSDP2 (``fully_shard`` per decoder block, the embedding,
the output head and the root; the frozen vision tower replicated), fp32 master weights,
AdamW. A step encodes one video with the frozen tower (split over the sequence-parallel
ranks, MR-SP stage 1), scores G completions in micro-batches with lvrl's own scoring
(:func:`models.logprobs.completion_logprobs`, or
:func:`parallel.prefill.sequence_parallel_completion_logprobs` when the sequence is split),
takes the GRPO loss, backward, and an optimizer step. The planner
(:func:`planner.memory.plan_memory` for a "cpu" device: no vLLM, no CUDA overhead)
predicts the peak of the same settings.

Measured: the peak resident memory of each process above its resident memory just before the
model is built, from the kernel's high-water mark (``VmHWM`` in ``/proc/self/status``), reset
(``/proc/self/clear_refs``) once the model is sharded, so the transient full copy that every
rank builds before sharding is not counted (the lead's strategy builds on the meta device).
Why RSS: on CPU a tensor is a malloc'd block, and with glibc's mmap threshold pinned at
128 KiB (``MALLOC_MMAP_THRESHOLD_``, set for the workers) every tensor above it is its own
mapping, returned to the kernel when freed, so resident memory follows live tensors; the
high-water mark misses no short peak, where a sampling thread could. The slowest rank's (the
largest) figure is reported, as a GPU run is bounded by its fullest device.

The sharding is lvrl's own, :func:`parallel.sharding.shard_model` with the layout a module with a
frozen vision tower gives the strategy (:meth:`models.vlm_module.VLMModule.sharding_layout`),
not a copy.

``PLAN_CHECK_TRACE=1`` also prints each rank's peak per part of each step (encoding, each
micro-batch's forward and backward, the optimizer update).

Usage: python bench/plan_check.py [--layouts 1x1 2x1 2x2 4x1 4x4] [--steps 2] [--frames 8]
       [--generations 4] [--micro-batch-rows 2] [--completion 32] [--no-checkpointing]
       [--param-dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# Run as `python bench/plan_check.py`, Python puts bench/ first on sys.path; keep the repo's packages.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from core.layout import PositionRule, PromptLayout, ScoringBatch  # noqa: E402
from evaluation.provenance import provenance  # noqa: E402
from planner.architectures import architecture_from_config  # noqa: E402
from planner.memory import Device, RunSettings, ValidationSettings, plan_memory  # noqa: E402

VIDEO_TOKEN, VISION_START, VISION_END = 7, 4, 5
MODEL_CONFIG: dict[str, Any] = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    "video_token_id": VIDEO_TOKEN,
    "image_token_id": 6,
    "vision_start_token_id": VISION_START,
    "vision_end_token_id": VISION_END,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "vision_config": {
        "depth": 2,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_heads": 4,
        "out_hidden_size": 512,
        "fullatt_block_indexes": [1],
    },
}
"""The scaled-down model: Qwen2.5-VL's shapes (GQA, M-RoPE, 2x2 merge) at ~70M parameters."""
FRAME_SIDE = 224
"""Frames of 224 x 224 pixels: 64 merged tokens per temporal patch (two frames)."""
TEXT_BEFORE, TEXT_AFTER = 24, 16
CPU = torch.device("cpu")
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def resident_bytes() -> int:
    return _status_kib("VmRSS") * 1024


def peak_resident_bytes() -> int:
    return _status_kib("VmHWM") * 1024


def reset_peak() -> None:
    """Set the high-water mark to the current resident size (Linux: ``5`` > clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def prompt_layout(frames: int, vocab_size: int = MODEL_CONFIG["vocab_size"]) -> PromptLayout:
    """A prompt of text, one video of ``frames`` frames of FRAME_SIDE^2 pixels, text."""
    patch = 14
    grid = torch.tensor([frames // 2, FRAME_SIDE // patch, FRAME_SIDE // patch])
    video_tokens = int(grid.prod()) // 4
    generator = torch.Generator().manual_seed(frames)
    ids = torch.randint(20, vocab_size, (TEXT_BEFORE + TEXT_AFTER,), generator=generator)
    token_ids = [*ids[:TEXT_BEFORE].tolist(), VISION_START, *[VIDEO_TOKEN] * video_tokens, VISION_END]
    token_ids += ids[TEXT_BEFORE:].tolist()
    return PromptLayout.build(token_ids, VIDEO_TOKEN, PositionRule(2, 2.0), grid, 1.0)


def run_settings(world: int, sp: int, args: argparse.Namespace) -> RunSettings:
    """What the planner is told: the same settings the workers run."""
    return RunSettings(
        kind="grpo",
        world_size=world,
        devices_per_node=world,
        num_frames=args.frames,
        max_pixels_per_frame=FRAME_SIDE * FRAME_SIDE,
        text_tokens=TEXT_BEFORE + TEXT_AFTER + 2,
        completion_tokens=args.completion,
        sequence_parallel_size=sp,
        sequence_parallel_attention=args.attention,
        sharding="full",
        master_dtype="float32",
        param_dtype=args.param_dtype,
        freeze_vision=True,
        gradient_checkpointing=args.checkpointing,
        reference="none",
        micro_batch_rows=args.micro_batch_rows,
        batch_size=1,
        num_generations=args.generations,
        shared_prompt_pass=False,
        validation=ValidationSettings(
            batch_size=1,
            num_frames=args.frames,
            samples=args.val_samples,
            max_new_tokens=args.val_new_tokens,
            target_tokens=args.completion,
        ),
    )


class _BenchTokenizer:
    """What the transformers engine asks of a tokenizer, for the bench's tokenizer-less model: the
    vision token ids (never sampled) and stop tokens that no id matches, so that every answer runs
    to ``max_new_tokens``."""

    def get_vocab(self) -> dict[str, int]:
        vision = {"<|video_pad|>": VIDEO_TOKEN, "<|image_pad|>": 6, "<|vision_start|>": VISION_START}
        return {**vision, "<|vision_end|>": VISION_END}

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.get_vocab().get(token, -1)

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return ""

    def __len__(self) -> int:  # every id of the bench's vocabulary is a token: no padding rows
        return int(MODEL_CONFIG["vocab_size"])


def validation_pass(
    model: torch.nn.Module,
    layout: PromptLayout,
    pixels: torch.Tensor,
    args: argparse.Namespace,
    shard: Any,
    scope: Any,
) -> dict[str, int]:
    """A validation as :class:`models.vlm_module.VLMModule` runs one: the policy gathered whole, the
    video encoded over the sequence-parallel group, the greedy answer and ``--val-samples`` sampled
    ones decoded by the transformers engine, then the model's own teacher-forced forward (pixel
    values in) over the prompt and a ``--completion``-token target, with the targets' logits.
    Returns the peak resident bytes of each part."""
    from parallel.sharding import gathered
    from rollout.base import RolloutRequest, SamplingConfig
    from rollout.hf_engine import TransformersEngine

    trace: dict[str, int] = {}

    def mark(name: str) -> None:
        trace[name] = peak_resident_bytes()
        reset_peak()

    grid = layout.video_grid_thw.reshape(1, 3)
    reset_peak()
    with gathered(scope) as full:
        mark("gather")
        (video,) = encode(full, pixels, grid, shard)
        mark("encode")
        engine = TransformersEngine.for_model(full, _BenchTokenizer())
        request = RolloutRequest(layout, layout.encoded_video(video))
        for n, temperature in ((1, 0.0), (args.val_samples, 1.0)):
            if n:
                engine.generate(
                    [request],
                    SamplingConfig(n=n, temperature=temperature, max_new_tokens=args.val_new_tokens, seed=0),
                )
                mark(f"decode x{n}")
        generator = torch.Generator().manual_seed(7)
        target = torch.randint(20, MODEL_CONFIG["vocab_size"], (args.completion,), generator=generator)
        ids = torch.cat([layout.token_ids, target])
        whole = PromptLayout.build(ids, VIDEO_TOKEN, PositionRule(2, 2.0), grid.reshape(3), 1.0)
        with torch.no_grad():
            out = full(
                input_ids=ids[None],
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                position_ids=whole.positions.unsqueeze(1),
                pixel_values_videos=pixels,
                video_grid_thw=grid,
                use_cache=False,
                logits_to_keep=args.completion + 1,
            )
            logits = out.logits[:, :-1].float()
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        mark("loss forward")
    return trace


def encode(
    model: torch.nn.Module,
    pixels: torch.Tensor,
    grid: torch.Tensor,
    shard: Any,
    device: torch.device = CPU,
) -> list[torch.Tensor]:
    """The video's embeddings, encoded over the sequence-parallel group when there is one."""
    from models.vision import encode_videos
    from parallel.encoding import encode_videos_sequence_parallel

    with torch.no_grad():
        if shard is None:
            return encode_videos(model, pixels, grid)
        return encode_videos_sequence_parallel(
            functools.partial(encode_videos, model),
            pixels,
            grid,
            shard.group,
            spatial_merge_size=2,
            hidden_size=model.config.vision_config.out_hidden_size,
            device=device,
        )


def shard_model(model: torch.nn.Module, param_dtype: torch.dtype, device_type: str = "cpu") -> Any:
    """lvrl's sharding (:func:`parallel.sharding.shard_model`, as the strategy applies it): a unit
    per decoder block, a root unit for the embeddings and head, the frozen vision tower whole in
    the compute dtype. Returns the root scope every forward runs in."""
    from torch.distributed.device_mesh import init_device_mesh

    from models.vision import decoder_blocks, vision_tower
    from parallel.sharding import ShardingLayout, ShardingSettings
    from parallel.sharding import shard_model as lvrl_shard_model

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    dtype = str(param_dtype).removeprefix("torch.")
    tower = vision_tower(model)
    tower.to(param_dtype)
    layout = ShardingLayout(model, decoder_blocks(model), kept_whole=(tower,))
    return lvrl_shard_model(layout, mesh, ShardingSettings(param_dtype=dtype))


def grpo_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    layout: PromptLayout,
    pixels: torch.Tensor,
    args: argparse.Namespace,
    shard: Any,
    step: int,
    scope: Any,
    meter: Any = None,
    device: torch.device = CPU,
) -> dict[str, int]:
    """Encode, score G completions in micro-batches with gradients, the GRPO loss, an update;
    returns the peak memory of each part (encoding, each forward and backward, the update): the
    resident bytes, or what ``meter`` (``bench/gpu_check.py``'s, on a GPU) reads."""
    from models.logprobs import completion_logprobs, input_embeddings
    from models.rl.losses import policy_loss
    from parallel.prefill import sequence_parallel_completion_logprobs
    from parallel.sharding import run_sharded

    trace: dict[str, int] = {}

    peak, reset = (meter.peak, meter.reset) if meter is not None else (peak_resident_bytes, reset_peak)

    def mark(name: str) -> None:
        trace[name] = peak()
        reset()

    grid = layout.video_grid_thw.reshape(1, 3)
    reset()
    video = encode(model, pixels, grid, shard, device)
    mark("encode")
    generator = torch.Generator().manual_seed(100 + step)
    vocab_size = model.config.text_config.vocab_size
    completions = [
        torch.randint(20, vocab_size, (args.completion,), generator=generator).tolist()
        for _ in range(args.generations)
    ]
    batch = ScoringBatch.from_layouts(
        [layout],
        completions,
        [0] * args.generations,
        pad_token_id=0,
        length_multiple=shard.size if shard is not None else 1,
    )
    advantages = torch.randn(args.generations, generator=generator).to(device)
    old = torch.full(batch.completion_mask.shape, -10.0, device=device)
    tokens = float(batch.completion_mask.sum())
    total = 0.0
    for start in range(0, args.generations, args.micro_batch_rows):
        rows = list(range(start, min(start + args.micro_batch_rows, args.generations)))
        chunk = batch.select(rows)

        def score(chunk: ScoringBatch = chunk) -> torch.Tensor:
            if shard is None:
                return completion_logprobs(model, chunk, video, share_prompts=False)
            embeddings = input_embeddings(model, chunk, video, device)
            return sequence_parallel_completion_logprobs(model, chunk, embeddings, shard)

        logprobs = run_sharded(scope, score)
        loss, _ = policy_loss(
            logprobs,
            old[rows],
            advantages[rows],
            chunk.completion_mask.to(device),
            token_count_normalizer=tokens,
        )
        mark(f"forward {start}")
        loss.backward()
        mark(f"backward {start}")
        total += float(loss.detach())
    optimizer.step()
    mark("optimizer")
    optimizer.zero_grad(set_to_none=True)
    return trace


def worker(rank: int, world: int, sp: int, args: argparse.Namespace, store: str, out: str) -> None:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from parallel.attention import register_sequence_parallel_attention
    from parallel.mesh import build_device_mesh, mesh_shape
    from parallel.shard import SequenceShard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    shard = None
    if sp > 1:
        mesh = build_device_mesh("cpu", mesh_shape(world, sp))
        shard = SequenceShard(mesh.get_group("sequence"), args.attention)
    layout = prompt_layout(args.frames)
    patches = int(layout.video_grid_thw.prod())
    pixels = torch.randn(patches, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(1))
    config = Qwen2_5_VLConfig(**{k: v for k, v in MODEL_CONFIG.items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    baseline = resident_bytes()
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).train()
    model.model.visual.requires_grad_(False)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if sp > 1:
        model.set_attn_implementation(register_sequence_parallel_attention())
    scope = shard_model(model, getattr(torch, args.param_dtype))
    gc.collect()  # the full tensors sharding replaced
    resident_after_sharding = resident_bytes() - baseline
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    steps = []
    for step in range(args.steps):
        started = time.perf_counter()
        trace = grpo_step(model, optimizer, layout, pixels, args, shard, step, scope)
        peaks = {name: value - baseline for name, value in trace.items()}
        steps.append({"peak": max(peaks.values()), "trace": peaks, "seconds": time.perf_counter() - started})
    trace = validation_pass(model, layout, pixels, args, shard, scope)
    validation = {name: value - baseline for name, value in trace.items()}
    result = {
        "rank": rank,
        "resident_after_sharding": resident_after_sharding,
        "steps": steps,
        "validation": {"peak": max(validation.values()), "trace": validation},
    }
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def measure(world: int, sp: int, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    out = tmp / f"w{world}sp{sp}.json"
    os.environ.update(MALLOC_ENV)  # read by glibc when each spawned worker starts
    mp.start_processes(
        worker,
        args=(world, sp, args, str(tmp / f"store{world}-{sp}"), str(out)),
        nprocs=world,
        start_method="spawn",
    )
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--layouts",
        nargs="+",
        default=["1x1", "2x1", "2x2", "4x1", "4x4"],
        help="WORLDxSP: processes and sequence-parallel size",
    )
    parser.add_argument(
        "--steps", type=int, default=2, help="steps per run (the first has no optimizer states)"
    )
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--micro-batch-rows", type=int, default=2)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--attention", choices=["ulysses", "ring"], default="ulysses")
    parser.add_argument("--param-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    parser.add_argument("--val-samples", type=int, default=2, help="sampled validation answers")
    parser.add_argument("--val-new-tokens", type=int, default=16, help="tokens of a validation answer")
    parser.add_argument(
        "--json", type=Path, help="also write the results here (with command, commit, machine)"
    )
    args = parser.parse_args()
    arch = architecture_from_config(MODEL_CONFIG, "plan-check")
    print(
        f"model: {arch.parameters() / 1e6:.1f}M parameters; {args.frames} frames, G={args.generations}, "
        f"{args.micro_batch_rows} rows per micro-batch, {args.completion}-token completions, compute "
        f"{args.param_dtype}, checkpointing {'on' if args.checkpointing else 'off'}, {args.attention}",
        flush=True,
    )
    rows = []
    traces: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.layouts:
            world, sp = (int(x) for x in spec.split("x"))
            started = time.perf_counter()
            results = measure(world, sp, args, Path(tmp))
            traces.append(
                {
                    "layout": spec,
                    "ranks": [
                        [{k: round(v / 2**20, 1) for k, v in s["trace"].items()} for s in r["steps"]]
                        for r in results
                    ],
                }
            )
            plan = plan_memory(arch, run_settings(world, sp, args), Device("cpu", 2**40))
            step_plan = max(total for phase, total in plan.phase_totals.items() if phase != "validation")
            measured = max(step["peak"] for r in results for step in r["steps"])
            validation = max(r["validation"]["peak"] for r in results)
            resident = max(r["resident_after_sharding"] for r in results)
            predicted_resident = sum(
                line.bytes for line in plan.lines if line.name.startswith(("parameters", "vision tower"))
            )
            rows.append(
                {
                    "world": world,
                    "sp": sp,
                    "predicted": step_plan,
                    "measured": measured,
                    "error": step_plan / measured - 1,
                    "predicted_validation": plan.phase_totals["validation"],
                    "measured_validation": validation,
                    "validation_error": plan.phase_totals["validation"] / validation - 1,
                    "predicted_resident": predicted_resident,
                    "resident": resident,
                    "seconds": time.perf_counter() - started,
                }
            )
            row = rows[-1]
            print(
                f"{world} process(es), sequence-parallel {sp}: step {step_plan / 2**20:7.1f} MiB predicted, "
                f"{measured / 2**20:7.1f} measured ({row['error']:+.1%}); validation "
                f"{row['predicted_validation'] / 2**20:7.1f} / {validation / 2**20:7.1f} MiB "
                f"({row['validation_error']:+.1%}); resident after sharding "
                f"{predicted_resident / 2**20:6.1f} / {resident / 2**20:6.1f} MiB [{row['seconds']:.0f} s]",
                flush=True,
            )
    print(
        "\n| processes | sequence-parallel | step: predicted | measured | error "
        "| validation: predicted | measured | error |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['world']} | {row['sp']} | {row['predicted'] / 2**20:.1f} MiB | "
            f"{row['measured'] / 2**20:.1f} MiB | {row['error']:+.1%} | "
            f"{row['predicted_validation'] / 2**20:.1f} MiB | {row['measured_validation'] / 2**20:.1f} MiB | "
            f"{row['validation_error']:+.1%} |"
        )
    if args.json:
        summary = {
            **provenance(["python", "bench/plan_check.py", *sys.argv[1:]]),
            "settings": {k: v for k, v in vars(args).items() if k != "json"},
            "rows": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if os.environ.get("PLAN_CHECK_TRACE"):
        print(json.dumps(traces, indent=1))


if __name__ == "__main__":
    main()
