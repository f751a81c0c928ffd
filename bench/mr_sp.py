"""MR-SP benchmarks, measured side by side in one run (this machine is shared: read the ratios).

Every figure comes from real gloo processes running lvrl's own code paths. ``--parts`` picks:

memory: prefill memory per rank. One long row (text tokens; a video's tokens cost the same in
   the language model) scored with :func:`parallel.prefill.sequence_parallel_completion_logprobs`,
   forward + backward, at sequence-parallel sizes ``--sizes``, on the ``--preset`` model.
   Activation memory is the bytes autograd saves for backward (unique storages, parameters
   excluded; counted with ``torch.autograd.graph.saved_tensors_hooks``, so it is exact and
   noise-free); the growth of the process's peak RSS is printed beside it. Target: size 4 <=
   0.35x size 1. Then the longest sequence whose saved activations fit ``--budget-mib`` per rank
   (doubling, then bisection to 1/16 of the answer).
step: the RL step at ``--frames`` frames of ``--side`` pixels (224: 32 video tokens a frame), G
   completions, sequence-parallel sizes ``--step-sizes``, with a real-width vision tower
   (:mod:`bench.real_width`: Qwen2.5-VL-7B's vision widths, ``--vision-depth`` of its 32
   blocks, random weights, the ``tiny`` language model). Full MR-SP: the frames encoded in
   parallel across the group and all-gathered once, the embeddings cached for the rollouts, the
   reference pass and the policy pass, which forward each prompt once with its G completions
   packed after it (``share_prompts``). Against re-encoding as a naive trainer does: every rank
   encodes the whole video for each of the G rows in every pass that reads it (rollout engine,
   old policy, reference, policy: 4 G passes), nothing shared. Both run the same
   sequence-parallel reference pass and policy forward + backward; token generation (the same
   in both) is left out. Measured, per rank: CPU seconds of its share of the encoding, of the
   all-gather, and of the passes (one thread per rank, so a rank's CPU time is what it would
   take on a device of its own, whatever else runs on the machine). Counted: one whole-video
   encoding as the sum of the ranks' measured shares (the tower attends within a temporal
   patch: the shares are the whole encoding's work, split), and the naive step as 4 G of them
   plus the rank's measured passes. A step takes as long as its slowest rank. At
   ``--whole-rows-frames`` the passes are also measured with every row forwarded whole (G
   copies of the prompt), as a naive trainer forwards them too.
ring: ring attention in contiguous slices vs the balanced zigzag layout, at ``--ring-sizes``:
   forward + backward of one ``--ring-tokens``-token text row on the ``--preset`` model. Per rank:
   CPU seconds (one thread each; the best of ``--ring-repeats`` runs, the layouts taking turns)
   and the query x key scores its attention computes; the slowest
   rank sets the step time on real devices. The wall time is printed too: with more processes
   than cores it follows the total work, not the slowest rank.

Usage: python bench/mr_sp.py [--parts memory step ring] [--preset tiny] [--sizes 1 2 4]
       [--tokens 16384] [--budget-mib 256] [--frames 64 256 1024] [--step-sizes 4]
       [--attention ulysses] [--ring-sizes 2 4] [--ring-tokens 8192]
       [--out bench/results/mr_sp/<name>.json]
"""

from __future__ import annotations

import argparse
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

from bench.real_width import build_real_width_model_dir, describe, tokens_per_frame  # noqa: E402
from bench.synthetic_video import video_inputs  # noqa: E402
from core.layout import PositionRule, PromptLayout, ScoringBatch  # noqa: E402
from evaluation.provenance import provenance  # noqa: E402
from families import position_rule_of  # noqa: E402
from models.build import build_model_dir  # noqa: E402
from models.loading import load_model, load_processor  # noqa: E402
from models.logprobs import input_embeddings  # noqa: E402
from models.vision import encode_videos  # noqa: E402
from parallel.encoding import encode_videos_sequence_parallel  # noqa: E402
from parallel.prefill import sequence_parallel_completion_logprobs, sum_gradients_over  # noqa: E402
from parallel.ring import ring_schedule  # noqa: E402
from parallel.shard import LAYOUTS, SequenceShard  # noqa: E402

NAIVE_PASSES = ("rollout engine", "old policy", "reference", "policy")
"""The passes of a naive trainer that each encode the video once per completion row."""

COMPLETION_TOKENS = 64


def text_row(length: int, vocab: int, group_size: int) -> ScoringBatch:
    """One row of ``length`` tokens: a long prompt and a 64-token completion (1-D positions)."""
    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(20, vocab, (length,), generator=generator).tolist()
    prompt = PromptLayout.build(ids[:-COMPLETION_TOKENS], -1, PositionRule(2, 2.0))
    return ScoringBatch.from_layouts(
        [prompt], [ids[-COMPLETION_TOKENS:]], [0], pad_token_id=0, length_multiple=group_size
    )


def scored(
    model: torch.nn.Module, batch: ScoringBatch, videos: list, shard: SequenceShard, share: bool = False
) -> torch.Tensor:
    """Sequence-parallel completion log-probs (the input embeddings built inside the measured pass)."""
    embeddings = input_embeddings(model, batch, videos, next(model.parameters()).device)
    return sequence_parallel_completion_logprobs(model, batch, embeddings, shard, share_prompts=share)


def scoring_passes(
    model: torch.nn.Module, batch: ScoringBatch, videos: list, shard: SequenceShard, share: bool
) -> tuple[float, float]:
    """``(wall, CPU)`` seconds of the reference pass, the policy forward + backward and the gradient sum."""
    clock = Clock()
    with torch.no_grad():  # reference pass
        scored(model, batch, videos, shard, share)
    scored(model, batch, videos, shard, share).sum().backward()  # policy pass
    sum_gradients_over(list(model.parameters()), shard.group)
    model.zero_grad(set_to_none=True)
    return clock.lap()


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


class Clock:
    """Wall and CPU seconds (this process, all its threads) since the last lap."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        elapsed = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return elapsed


def rl_step_figures(
    model: torch.nn.Module, processor: Any, shard: SequenceShard, frames: int, args: argparse.Namespace
) -> dict[str, float]:
    """One rank's CPU and wall seconds of a full MR-SP step: parallel encoding, then the passes."""
    _, inputs = video_inputs(processor, frames, args.side)
    pixels, grid = inputs["pixel_values_videos"], inputs["video_grid_thw"]
    tokenizer = processor.tokenizer
    video_token = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    layout = PromptLayout.from_processor_output(inputs, 0, video_token, position_rule_of(model.config))
    vision = model.config.vision_config
    generator = torch.Generator().manual_seed(0)
    completions = [
        torch.randint(20, 500, (48,), generator=generator).tolist() for _ in range(args.generations)
    ]
    batch = ScoringBatch.from_layouts(
        [layout],
        completions,
        [0] * args.generations,
        pad_token_id=tokenizer.pad_token_id,
        length_multiple=shard.length_multiple,
    )
    share = {"cpu": 0.0}

    def encode_share(pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        started = time.process_time()
        encoded = encode_videos(model, pixel_values, grid_thw)
        share["cpu"] += time.process_time() - started
        return encoded

    dist.barrier(group=shard.group)
    clock = Clock()
    embeds = encode_videos_sequence_parallel(
        encode_share,
        pixels,
        grid,
        shard.group,
        spatial_merge_size=int(vision.spatial_merge_size),
        hidden_size=int(vision.out_hidden_size),
        device=next(model.parameters()).device,
    )[0]
    encode_wall, encode_cpu = clock.lap()
    passes_wall, passes_cpu = scoring_passes(model, batch, [embeds], shard, share=True)
    figures = {
        "video_tokens": int(embeds.shape[0]),
        "share": share["cpu"],
        "gather": encode_cpu - share["cpu"],
        "passes": passes_cpu,
        "wall": encode_wall + passes_wall,
    }
    if frames in args.whole_rows_frames:
        figures["passes_whole"] = scoring_passes(model, batch, [embeds], shard, share=False)[1]
    return figures


def ring_figures(model: torch.nn.Module, tokens: int, repeats: int) -> dict[str, dict[str, float]]:
    """One rank's CPU and wall seconds (the best of ``repeats``, the layouts taking turns) and
    attention scores of one row, forward + backward, per layout."""
    figures: dict[str, dict[str, float]] = {}
    for _ in range(repeats):
        for layout in LAYOUTS:
            shard = SequenceShard(dist.group.WORLD, "ring", ring_layout=layout)
            row = text_row(tokens, int(model.config.text_config.vocab_size), shard.length_multiple)
            width = row.input_ids.shape[1] // shard.size
            schedule = ring_schedule(shard.rank, shard.size, width, layout)
            dist.barrier()
            clock = Clock()
            scored(model, row, [None], shard).sum().backward()
            sum_gradients_over(list(model.parameters()), shard.group)
            wall, cpu = clock.lap()
            model.zero_grad(set_to_none=True)
            best = figures.setdefault(layout, {"cpu": cpu, "wall": wall})
            best["cpu"], best["wall"] = min(best["cpu"], cpu), min(best["wall"], wall)
            best["scores"] = sum(block.score_entries for step in schedule for block in step)
    return figures


def worker(
    rank: int, size: int, dirs: dict[str, str], args: argparse.Namespace, store: str, out: str
) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, size), rank=rank, world_size=size)
    result: dict[str, Any] = {}
    if "memory" in args.parts and size in args.sizes:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
        model = load_model(dirs["preset"]).train()
        shard = SequenceShard(dist.group.WORLD, args.attention)
        result["saved"], result["rss"] = prefill_activation_bytes(model, shard, args.tokens)
        result["longest"] = longest_within(model, shard, args.budget_mib * 2**20, start=512)
    # One thread per rank from here: a rank's CPU seconds are then its compute time.
    torch.set_num_threads(1)
    if "ring" in args.parts and size in args.ring_sizes:
        model = load_model(dirs["preset"]).train()
        ring_figures(model, 1024, repeats=1)  # warm-up
        result["ring"] = ring_figures(model, args.ring_tokens, args.ring_repeats)
    if "step" in args.parts and size in args.step_sizes:
        model = load_model(dirs["real"]).train()
        processor = load_processor(dirs["real"])
        shard = SequenceShard(dist.group.WORLD, args.attention)
        warmup = argparse.Namespace(**{**vars(args), "whole_rows_frames": [8]})
        rl_step_figures(model, processor, shard, 8, warmup)
        result["step"] = {
            frames: rl_step_figures(model, processor, shard, frames, args) for frames in args.frames
        }
    everyone: list[Any] = [None] * size
    dist.all_gather_object(everyone, result)
    if rank == 0:
        Path(out).write_text(json.dumps(everyone))
    dist.destroy_process_group()


def memory_rows(results: dict[int, list[dict]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per sequence-parallel size: rank 0's saved activations, peak RSS growth and longest row."""
    sizes = [s for s in sorted(results) if s in args.sizes]
    base = results[sizes[0]][0]["saved"]
    return [
        {
            "size": size,
            "saved_mib": results[size][0]["saved"] / 2**20,
            "saved_over_first": results[size][0]["saved"] / base,
            "peak_rss_growth_mib": results[size][0]["rss"] / 2**20,
            "longest_tokens_within_budget": results[size][0]["longest"],
        }
        for size in sizes
    ]


def step_rows(results: dict[int, list[dict]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per size and frame count: the ranks' measured seconds and the counted naive step."""
    naive = len(NAIVE_PASSES) * args.generations
    rows = []
    for size in sorted(s for s in results if s in args.step_sizes):
        for frames in args.frames:
            ranks = [r["step"][str(frames)] for r in results[size]]
            whole = sum(r["share"] for r in ranks)
            row: dict[str, Any] = {
                "size": size,
                "frames": frames,
                "video_tokens": ranks[0]["video_tokens"],
                "share_s": [r["share"] for r in ranks],
                "gather_s": max(r["gather"] for r in ranks),
                "whole_video_encoding_s": whole,
                "passes_s": max(r["passes"] for r in ranks),
                "mr_sp_step_s": max(r["share"] + r["gather"] + r["passes"] for r in ranks),
                "re_encoding_step_s": max(naive * whole + r["passes"] for r in ranks),
                "mr_sp_wall_s": max(r["wall"] for r in ranks),
            }
            row["ratio"] = row["re_encoding_step_s"] / row["mr_sp_step_s"]
            if "passes_whole" in ranks[0]:
                row["passes_rows_whole_s"] = max(r["passes_whole"] for r in ranks)
            rows.append(row)
    return rows


def ring_rows(results: dict[int, list[dict]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per size and layout: each rank's CPU seconds and attention scores (x rank 0's), the wall."""
    rows = []
    for size in sorted(s for s in results if s in args.ring_sizes):
        ranks = [r["ring"] for r in results[size]]
        for layout in LAYOUTS:
            scores = [r[layout]["scores"] for r in ranks]
            rows.append(
                {
                    "size": size,
                    "layout": layout,
                    "cpu_s": [r[layout]["cpu"] for r in ranks],
                    "scores_over_rank0": [score / scores[0] for score in scores],
                    "wall_s": max(r[layout]["wall"] for r in ranks),
                }
            )
    return rows


def print_memory(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n== memory: {args.preset} model, {args.attention} attention, one row of {args.tokens} tokens")
    for row in rows:
        print(
            f"  size {row['size']}: saved activations {row['saved_mib']:8.1f} MiB per rank "
            f"(x{row['saved_over_first']:.2f} of size {rows[0]['size']}), peak RSS growth "
            f"{row['peak_rss_growth_mib']:7.1f} MiB; "
            f"longest row within {args.budget_mib} MiB: {row['longest_tokens_within_budget']} tokens"
        )


def print_steps(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    naive = len(NAIVE_PASSES) * args.generations
    print(
        f"\n== RL step, G={args.generations}, {args.attention} attention, frames {args.side}x{args.side} "
        f"({tokens_per_frame(args.side):g} video tokens a frame); per-rank CPU seconds, one thread a rank"
    )
    print(
        "  measured per rank: its share of the parallel encoding, the all-gather, the reference pass + "
        "policy forward/backward + gradient sum"
    )
    print(
        f"  counted: a whole-video encoding = the sum of the ranks' shares; re-encoding = {naive} of them "
        f"({args.generations} each for: {', '.join(NAIVE_PASSES)}) + the rank's passes"
    )
    for row in rows:
        print(
            f"  size {row['size']}, {row['frames']:5d} frames ({row['video_tokens']} video tokens): encode "
            f"share {min(row['share_s']):.1f}-{max(row['share_s']):.1f} s + all-gather "
            f"{row['gather_s']:.2f} s "
            f"(whole video {row['whole_video_encoding_s']:.1f} s), passes (prompt shared) "
            f"{row['passes_s']:.2f} s -> MR-SP {row['mr_sp_step_s']:.1f} s vs re-encoding "
            f"{row['re_encoding_step_s']:.0f} s: x{row['ratio']:.1f} (MR-SP wall {row['mr_sp_wall_s']:.1f} s)"
        )
        if "passes_rows_whole_s" in row:
            print(
                f"      passes with every row whole {row['passes_rows_whole_s']:.2f} s: "
                f"x{row['passes_rows_whole_s'] / row['passes_s']:.1f} the shared-prompt passes"
            )


def print_ring(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\n== ring attention layouts: {args.preset} model, one row of {args.ring_tokens} tokens, "
        "forward + backward; per-rank CPU seconds, one thread a rank"
    )
    for row in rows:
        print(
            f"  size {row['size']}, {row['layout']:10s}: CPU per rank "
            f"{' '.join(f'{c:5.2f}' for c in row['cpu_s'])} s (slowest {max(row['cpu_s']):.2f} s), attention "
            f"scores per rank {' '.join(f'{s:.2f}' for s in row['scores_over_rank0'])} x rank 0's, "
            f"wall {row['wall_s']:.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--parts", nargs="+", default=["memory", "step", "ring"], choices=["memory", "step", "ring"]
    )
    parser.add_argument("--preset", default="tiny", help="model of the memory and ring parts")
    parser.add_argument("--sizes", nargs="+", type=int, default=[1, 2, 4], help="sizes of the memory part")
    parser.add_argument("--tokens", type=int, default=16384, help="row length for the memory comparison")
    parser.add_argument("--budget-mib", type=int, default=256, help="per-rank saved-activation budget")
    parser.add_argument("--frames", nargs="+", type=int, default=[64, 256, 1024])
    parser.add_argument("--step-sizes", nargs="+", type=int, default=[4], help="sizes of the RL-step part")
    parser.add_argument("--whole-rows-frames", nargs="*", type=int, default=[64, 256])
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--vision-depth", type=int, default=2, help="vision blocks (7B has 32)")
    parser.add_argument("--side", type=int, default=224, help="frame side in pixels (a multiple of 28)")
    parser.add_argument("--attention", default="ulysses", choices=["ulysses", "ring"])
    parser.add_argument("--ring-sizes", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--ring-tokens", type=int, default=8192, help="row length for the ring layouts")
    parser.add_argument("--ring-repeats", type=int, default=2, help="runs per layout (the best counts)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    started = time.perf_counter()
    sizes = sorted(
        set(args.sizes if "memory" in args.parts else [])
        | set(args.step_sizes if "step" in args.parts else [])
        | set(args.ring_sizes if "ring" in args.parts else [])
    )
    results: dict[int, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {"preset": str(build_model_dir(args.preset, Path(tmp) / args.preset))}
        if "step" in args.parts:
            dirs["real"] = str(build_real_width_model_dir(Path(tmp) / "real", args.vision_depth))
            print(describe(load_model(dirs["real"])), flush=True)
        for size in sizes:
            out = Path(tmp) / f"size{size}.json"
            begun = time.perf_counter()
            mp.start_processes(
                worker,
                args=(size, dirs, args, str(Path(tmp) / f"store{size}"), str(out)),
                nprocs=size,
                start_method="spawn",
            )
            results[size] = json.loads(out.read_text())
            print(f"size {size}: measured in {time.perf_counter() - begun:.0f} s", flush=True)
    report: dict[str, Any] = {
        **provenance(["python", *sys.argv]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
    }
    if "memory" in args.parts:
        report["memory"] = memory_rows(results, args)
        print_memory(report["memory"], args)
    if "step" in args.parts:
        report["step"] = step_rows(results, args)
        print_steps(report["step"], args)
    if "ring" in args.parts:
        report["ring"] = ring_rows(results, args)
        print_ring(report["ring"], args)
    report["wall_seconds"] = round(time.perf_counter() - started)
    print(f"\nwhole run {report['wall_seconds']} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
