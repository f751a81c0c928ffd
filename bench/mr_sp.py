"""MR-SP benchmarks, measured side by side in one run (this machine is noisy: read the ratios).

Every figure comes from real gloo (CPU) or nccl (GPU) processes running lvrl's own code paths.

1. Prefill memory per rank: one long row (text tokens; a video's tokens cost the same in the
   language model) scored with :func:`parallel.prefill.sequence_parallel_completion_logprobs`,
   forward + backward, at sequence-parallel size 1, 2 and 4. Activation memory is the bytes
   autograd saves for backward (unique storages, parameters excluded; counted with
   ``torch.autograd.graph.saved_tensors_hooks``, so it is exact and noise-free); the growth of
   the process's peak RSS is printed beside it. Target: size 4 <= 0.35x size 1.
2. The longest sequence whose saved activations fit a fixed per-rank budget, at each size
   (doubling, then bisection to 1/16 of the answer).
3. RL step time at 64/256/1,024 frames with full MR-SP (frames encoded in parallel across the
   group, the embeddings cached for G rollouts + reference + policy passes) vs no cache and no
   parallel encoding (every rank encodes the whole video for each of the G rollouts and both
   passes). Both run the same sequence-parallel reference and policy passes on G completions;
   token generation itself is left out (it is the same in both).

Usage: python bench/mr_sp.py [--preset tiny] [--sizes 1 2 4] [--tokens 16384]
       [--budget-mib 256] [--frames 64 256 1024] [--attention ulysses]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Run as `python bench/mr_sp.py`, Python puts bench/ first on sys.path; keep the repo's packages.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from bench.synthetic_video import video_inputs  # noqa: E402
from core.layout import PositionRule, PromptLayout, ScoringBatch  # noqa: E402
from models.build import build_model_dir  # noqa: E402
from models.loading import load_model, load_processor  # noqa: E402
from models.logprobs import input_embeddings  # noqa: E402
from models.vision import encode_videos  # noqa: E402
from parallel.encoding import encode_videos_sequence_parallel  # noqa: E402
from parallel.prefill import sequence_parallel_completion_logprobs, sum_gradients_over  # noqa: E402
from parallel.shard import SequenceShard  # noqa: E402

COMPLETION_TOKENS = 64


def text_row(length: int, vocab: int, group_size: int) -> ScoringBatch:
    """One row of ``length`` tokens: a long prompt and a 64-token completion (1-D positions)."""
    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(20, vocab, (length,), generator=generator).tolist()
    prompt = PromptLayout.build(ids[:-COMPLETION_TOKENS], -1, PositionRule(2, 2.0))
    return ScoringBatch.from_layouts(
        [prompt], [ids[-COMPLETION_TOKENS:]], [0], pad_token_id=0, length_multiple=group_size
    )


def scored(model: torch.nn.Module, batch: ScoringBatch, videos: list, shard: SequenceShard) -> torch.Tensor:
    """Sequence-parallel completion log-probs (the input embeddings built inside the measured pass)."""
    embeddings = input_embeddings(model, batch, videos, next(model.parameters()).device)
    return sequence_parallel_completion_logprobs(model, batch, embeddings, shard)


def saved_bytes_of_backward_pass(model: torch.nn.Module, run: Callable[[], torch.Tensor]) -> tuple[int, int]:
    """``(bytes saved for backward, peak-RSS growth in bytes)`` of ``run()`` + backward."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = run()
    loss.backward()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    model.zero_grad(set_to_none=True)
    return sum(saved.values()), rss_after - rss_before


def prefill_activation_bytes(model: torch.nn.Module, shard: SequenceShard, length: int) -> tuple[int, int]:
    row = text_row(length, int(model.config.text_config.vocab_size), shard.size)
    return saved_bytes_of_backward_pass(model, lambda: scored(model, row, [None], shard).sum())


def longest_within(model: torch.nn.Module, shard: SequenceShard, budget: int, start: int) -> int:
    """Longest length (multiple of ``start``) whose saved activations fit ``budget`` on every rank."""

    def fits(length: int) -> bool:
        used = torch.tensor([prefill_activation_bytes(model, shard, length)[0]], dtype=torch.float64)
        dist.all_reduce(used, op=dist.ReduceOp.MAX, group=shard.group)
        return used.item() <= budget

    if not fits(start):
        return 0
    low = start
    while fits(low * 2):
        low *= 2
    high, step = low * 2, max(start, low // 16)
    while high - low > step:
        middle = (low + high) // 2 // start * start
        if middle in (low, high):
            break
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def rl_step_seconds(
    model: torch.nn.Module, processor: Any, shard: SequenceShard, frames: int, generations: int, cached: bool
) -> float:
    """Encoding(s) + reference pass + policy forward/backward + gradient sum, one rank's wall time."""
    _, inputs = video_inputs(processor, frames)
    pixels, grid = inputs["pixel_values_videos"], inputs["video_grid_thw"]
    tokenizer = processor.tokenizer
    video_token = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    layout = PromptLayout.from_processor_output(inputs, 0, video_token, PositionRule.of(model.config))
    vision = model.config.vision_config
    generator = torch.Generator().manual_seed(0)
    completions = [torch.randint(20, 500, (48,), generator=generator).tolist() for _ in range(generations)]
    dist.barrier(group=shard.group)
    started = time.perf_counter()

    def encode() -> torch.Tensor:
        with torch.no_grad():
            if cached:  # MR-SP stage 1: the group shares the frames
                return encode_videos_sequence_parallel(
                    functools.partial(encode_videos, model),
                    pixels,
                    grid,
                    shard.group,
                    spatial_merge_size=int(vision.spatial_merge_size),
                    hidden_size=int(vision.out_hidden_size),
                    device=next(model.parameters()).device,
                )[0]
            return encode_videos(model, pixels, grid)[0]

    embeds = encode()
    if not cached:
        for _ in range(generations):  # each rollout would encode the video again
            encode()
    batch = ScoringBatch.from_layouts(
        [layout],
        completions,
        [0] * generations,
        pad_token_id=tokenizer.pad_token_id,
        length_multiple=shard.size,
    )
    with torch.no_grad():  # reference pass
        scored(model, batch, [embeds if cached else encode()], shard)
    scored(model, batch, [embeds if cached else encode()], shard).sum().backward()
    sum_gradients_over(list(model.parameters()), shard.group)
    model.zero_grad(set_to_none=True)
    elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=shard.group)
    return elapsed.item()


def worker(rank: int, size: int, model_dir: str, args: argparse.Namespace, store: str, out: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, size), rank=rank, world_size=size)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    model = load_model(model_dir).train()
    shard = SequenceShard(dist.group.WORLD, args.attention)
    result: dict[str, Any] = {}
    saved, rss = prefill_activation_bytes(model, shard, args.tokens)
    result["saved"] = saved
    result["rss"] = rss
    result["longest"] = longest_within(model, shard, args.budget_mib * 2**20, start=512)
    processor = load_processor(model_dir)
    result["steps"] = {}
    for frames in args.frames:
        rl_step_seconds(model, processor, shard, frames, args.generations, cached=True)  # warm-up
        result["steps"][frames] = {
            mode: rl_step_seconds(model, processor, shard, frames, args.generations, cached=mode == "mrsp")
            for mode in ("mrsp", "baseline")
        }
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--tokens", type=int, default=16384, help="row length for the memory comparison")
    parser.add_argument("--budget-mib", type=int, default=256, help="per-rank saved-activation budget")
    parser.add_argument("--frames", nargs="+", type=int, default=[64, 256, 1024])
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--attention", default="ulysses", choices=["ulysses", "ring"])
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_model_dir(args.preset, Path(tmp) / args.preset))
        for size in args.sizes:
            out = Path(tmp) / f"size{size}.json"
            started = time.perf_counter()
            mp.start_processes(
                worker,
                args=(size, model_dir, args, str(Path(tmp) / f"store{size}"), str(out)),
                nprocs=size,
                start_method="spawn",
            )
            results[size] = json.loads(out.read_text())
            print(f"size {size}: measured in {time.perf_counter() - started:.0f} s", flush=True)
    base = results[args.sizes[0]]
    print(
        f"\n{args.preset} model, {args.attention} attention, "
        f"one row of {args.tokens} tokens, forward + backward:"
    )
    for size, result in results.items():
        print(
            f"  size {size}: saved activations {result['saved'] / 2**20:8.1f} MiB per rank "
            f"(x{result['saved'] / base['saved']:.2f} of size {args.sizes[0]}), peak RSS growth "
            f"{result['rss'] / 2**20:7.1f} MiB; "
            f"longest row within {args.budget_mib} MiB: {result['longest']} tokens"
        )
    print(f"\nRL step (encode + reference + policy fwd/bwd, G={args.generations}), slowest rank:")
    for size, result in results.items():
        for frames, step in result["steps"].items():
            print(
                f"  size {size}, {int(frames):5d} frames: MR-SP {step['mrsp']:6.2f} s vs "
                f"no cache / no parallel encoding {step['baseline']:6.2f} s "
                f"-> x{step['baseline'] / step['mrsp']:.2f}"
            )


if __name__ == "__main__":
    main()
