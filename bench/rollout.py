"""Rollout benchmarks with a real-width vision tower, measured side by side in one run.

The model (:mod:`bench.real_width`): Qwen2.5-VL-7B's vision widths with ``--vision-depth`` of
its 32 blocks and random weights, feeding the ``tiny`` preset's language model (a 7B language
model over 30k video tokens is out of reach of a 2-core CPU). Frames are ``--side`` pixels
square: 224 gives 16 x 16 patches, merged 2 x 2 to 8 x 8 = 64 tokens per temporal patch of 2
frames, i.e. 32 video tokens a frame.

Per frame count, one video prompt and G sampled completions:

Figures are CPU seconds of the benchmark's process, computing on one thread (see :func:`timed`).

1. RL step with the video encoded once and cached (lvrl: one vision-tower pass, then the G
   rollouts, the reference pass and the policy pass reuse the embeddings; the old-policy
   log-probs are the engine's) vs re-encoded as a naive trainer does, for each of the G rows
   in every pass that reads the video: the rollout engine, the old policy, the reference and
   the policy (4 G vision-tower passes). Measured: one vision-tower pass, the vLLM rollouts
   and the reference + policy passes (prompt shared). Counted: the naive trainer's 4 G passes
   as 4 G times the measured one (the same computation on the same pixels). Both steps run
   the same rollouts and language-model passes, so only the vision work differs.
2. Engine throughput (at ``--engine-frames``): completion tokens per second of the vLLM engine
   vs the transformers engine from the cached embeddings.
3. Reference + policy passes with each prompt forwarded once for its G completions (lvrl's
   default) vs every row whole (at ``--whole-rows-frames``).

Usage: python bench/rollout.py [--frames 64 256 1024] [--generations 8] [--vision-depth 2]
       [--side 224] [--engine-frames 64 256] [--whole-rows-frames 64 256]
       [--out bench/results/rollout/<name>.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

# Run as `python bench/rollout.py`, Python puts bench/ first on sys.path, where this file would
# shadow the `rollout` package it benchmarks.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: `bench.` helpers
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

from bench.real_width import build_real_width_model_dir, describe, tokens_per_frame  # noqa: E402
from bench.synthetic_video import video_inputs  # noqa: E402 (after the sys.path fix)
from core.layout import PromptLayout, ScoringBatch  # noqa: E402 (after the sys.path fix)
from evaluation.provenance import provenance  # noqa: E402
from families import position_rule_of  # noqa: E402
from models.loading import load_model, load_processor  # noqa: E402 (after the sys.path fix)
from models.logprobs import completion_logprobs  # noqa: E402 (after the sys.path fix)
from models.vision import encode_videos  # noqa: E402 (after the sys.path fix)
from rollout.base import PolicyHandle, RolloutRequest, RolloutResult, SamplingConfig  # noqa: E402
from rollout.hf_engine import TransformersEngine  # noqa: E402 (after the sys.path fix)

T = TypeVar("T")
NAIVE_PASSES = ("rollout engine", "old policy", "reference", "policy")
"""The passes of a naive trainer that each encode the video once per completion row."""


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """``(CPU seconds, result)`` of one call (the script warms everything up once at the start).

    CPU seconds of this process on one thread: its compute time, whatever else the (shared)
    machine runs meanwhile; wall-clock time would count the other processes' turns too.
    """
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def scoring_passes(
    model: torch.nn.Module, batch: ScoringBatch, embeds: torch.Tensor, share: bool = True
) -> None:
    """The reference pass (no gradient) and the policy pass (forward + backward) on the G rows."""
    with torch.no_grad():
        completion_logprobs(model, batch, [embeds], share_prompts=share)
    model.zero_grad(set_to_none=True)
    completion_logprobs(model, batch, [embeds], share_prompts=share).sum().backward()
    model.zero_grad(set_to_none=True)


def scoring_batch(request: RolloutRequest, result: RolloutResult, pad_token_id: int) -> ScoringBatch:
    rows = len(result.completions)
    completions = [c.token_ids for c in result.completions]
    return ScoringBatch.from_layouts([request.layout], completions, [0] * rows, pad_token_id=pad_token_id)


def measure(
    model: torch.nn.Module,
    processor: Any,
    engines: tuple[Any, Any],
    frames: int,
    sampling: SamplingConfig,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Every measured figure for one frame count (see the module docstring)."""
    vllm, hf = engines
    _, encoded = video_inputs(processor, frames, args.side)
    pixels, grid = encoded["pixel_values_videos"], encoded["video_grid_thw"]
    with torch.no_grad():
        encode_s, (embeds,) = timed(lambda: encode_videos(model, pixels, grid))
    video_token_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    layout = PromptLayout.from_processor_output(encoded, 0, video_token_id, position_rule_of(model.config))
    request = RolloutRequest(layout, layout.encoded_video(embeds))
    vllm_s, (result,) = timed(lambda: vllm.generate([request], sampling))
    batch = scoring_batch(request, result, processor.tokenizer.pad_token_id)
    passes_s, _ = timed(lambda: scoring_passes(model, batch, embeds))
    out: dict[str, Any] = {
        "frames": frames,
        "video_tokens": int(embeds.shape[0]),
        "prompt_tokens": len(layout),
        "completion_tokens": sum(len(c.token_ids) for c in result.completions),
        "encode": encode_s,
        "vllm": vllm_s,
        "passes": passes_s,
    }
    if frames in args.engine_frames:
        hf_s, (hf_result,) = timed(lambda: hf.generate([request], sampling))
        out["hf_rate"] = sum(len(c.token_ids) for c in hf_result.completions) / hf_s
        out["vllm_rate"] = out["completion_tokens"] / vllm_s
    if frames in args.whole_rows_frames:
        out["whole_rows"], _ = timed(lambda: scoring_passes(model, batch, embeds, share=False))
    return out


def summary(m: dict[str, Any], generations: int) -> dict[str, Any]:
    """One frame count's measured figures with the steps they count up to (see the module docstring)."""
    naive_encodes = len(NAIVE_PASSES) * generations
    once = m["encode"] + m["vllm"] + m["passes"]
    naive = naive_encodes * m["encode"] + m["vllm"] + m["passes"]
    # A naive trainer whose engine encodes once for its G samples (vLLM's n): 3 G + 1 passes.
    engine_once = (naive_encodes - generations + 1) * m["encode"] + m["vllm"] + m["passes"]
    return {
        **m,
        "naive_encodes": naive_encodes,
        "step_encode_once": once,
        "step_re_encoding": naive,
        "ratio": naive / once,
        "ratio_engine_encodes_once": engine_once / once,
    }


def report(s: dict[str, Any], generations: int) -> str:
    """The figures of one frame count, saying which were measured and which counted."""
    lines = [
        f"{s['frames']} frames: {s['video_tokens']} video tokens, a prompt of {s['prompt_tokens']} tokens, "
        f"G={generations} completions ({s['completion_tokens']} tokens)",
        f"  measured: vision-tower pass {s['encode']:.2f} s; vLLM rollouts {s['vllm']:.2f} s; "
        f"reference + policy passes (prompt shared) {s['passes']:.2f} s",
        f"  counted: re-encoding = {s['naive_encodes']} vision-tower passes ({generations} each for: "
        f"{', '.join(NAIVE_PASSES)}), each the measured pass",
        f"  RL step: encode once {s['step_encode_once']:.2f} s vs re-encoding {s['step_re_encoding']:.2f} s "
        f"-> x{s['ratio']:.2f} (x{s['ratio_engine_encodes_once']:.2f} if the naive engine encodes once "
        f"for its {generations} samples)",
    ]
    if "hf_rate" in s:
        lines.append(
            f"  engines: vLLM {s['vllm_rate']:.0f} tok/s vs transformers {s['hf_rate']:.0f} tok/s "
            f"-> x{s['vllm_rate'] / s['hf_rate']:.1f}"
        )
    if "whole_rows" in s:
        lines.append(
            f"  reference + policy passes: prompt shared {s['passes']:.2f} s vs every row whole "
            f"{s['whole_rows']:.2f} s -> x{s['whole_rows'] / s['passes']:.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", nargs="+", type=int, default=[64, 256, 1024])
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--vision-depth", type=int, default=2, help="vision blocks (7B has 32)")
    parser.add_argument("--side", type=int, default=224, help="frame side in pixels (a multiple of 28)")
    parser.add_argument("--engine-frames", nargs="*", type=int, default=[64, 256])
    parser.add_argument("--whole-rows-frames", nargs="*", type=int, default=[64, 256])
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    from rollout.vllm_engine import VLLMEngine

    started = time.perf_counter()
    torch.set_num_threads(1)
    sampling = SamplingConfig(n=args.generations, temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_real_width_model_dir(Path(tmp) / "model", args.vision_depth)
        processor = load_processor(model_dir)
        model = load_model(model_dir)
        print(describe(model))
        print(
            f"frames {args.side}x{args.side}: {tokens_per_frame(args.side):g} video tokens a frame; "
            "one thread, CPU seconds; float32\n",
            flush=True,
        )
        longest = int(max(args.frames) * tokens_per_frame(args.side)) + 1024 + args.new_tokens
        # One prefill chunk and one encoder-cache budget hold the longest video's tokens.
        vllm = VLLMEngine(
            max_model_len=longest, max_num_seqs=args.generations, max_num_batched_tokens=longest
        )
        vllm.start(PolicyHandle(str(model_dir), model, processor.tokenizer))
        hf = TransformersEngine.for_model(model, processor.tokenizer)
        if torch.get_num_threads() != 1:
            raise RuntimeError(f"the engine changed the thread count to {torch.get_num_threads()}")
        warmup = argparse.Namespace(**{**vars(args), "engine_frames": [8], "whole_rows_frames": [8]})
        measure(model, processor, (vllm, hf), 8, sampling, warmup)  # allocators, kernels, engine
        results = []
        for frames in args.frames:
            results.append(
                summary(measure(model, processor, (vllm, hf), frames, sampling, args), args.generations)
            )
            print(report(results[-1], args.generations), flush=True)
    wall = round(time.perf_counter() - started)
    print(f"\nwhole run {wall} s")
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k != "out"}
        out = {
            **provenance(["python", *sys.argv]),
            "settings": settings,
            "frames": results,
            "wall_seconds": wall,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
