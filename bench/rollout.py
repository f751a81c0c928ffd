"""Rollout benchmarks, measured side by side in one run (this machine is noisy: read the ratios).

1. Engine throughput: completion tokens per second of the vLLM engine vs the transformers
   engine on the same video prompt (G completions, cached video embeddings).
2. RL step time with the video encoded once and cached (lvrl's path: one vision-tower pass,
   then G rollouts, the reference pass and the policy pass all reuse the embeddings) vs
   re-encoding it for every rollout and every pass (the vision tower runs G + 2 times).
3. The reference + policy passes with each prompt forwarded once for its G completions (the
   trainer's default) vs every completion row forwarded whole.

Usage: python bench/rollout.py [--presets tiny small] [--frames 64 256] [--generations 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

# Run as `python bench/rollout.py`, Python puts bench/ first on sys.path, where this file would
# shadow the `rollout` package it benchmarks.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: `bench.` helpers
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

from bench.synthetic_video import video_inputs  # noqa: E402 (after the sys.path fix)
from core.layout import PositionRule, PromptLayout, ScoringBatch  # noqa: E402 (after the sys.path fix)
from models.build import build_model_dir  # noqa: E402 (after the sys.path fix)
from models.loading import load_model, load_processor  # noqa: E402 (after the sys.path fix)
from models.logprobs import completion_logprobs  # noqa: E402 (after the sys.path fix)
from models.vision import encode_videos  # noqa: E402 (after the sys.path fix)
from rollout.base import PolicyHandle, RolloutRequest, SamplingConfig  # noqa: E402 (after the sys.path fix)
from rollout.hf_engine import TransformersEngine  # noqa: E402 (after the sys.path fix)


def timed(fn, repeats: int = 2) -> tuple[float, object]:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        result = fn()
    return (time.perf_counter() - start) / repeats, result


def rl_step(
    model, processor, encoded, result, request: RolloutRequest, reencode: bool, share: bool = True
) -> None:
    """Reference + policy passes (forward and backward of the policy) on the G completions.

    ``share``: the prompt (video included) is forwarded once for the G completions (the
    trainer's default) rather than once per completion.
    """
    rows = len(result.completions)
    batch = ScoringBatch.from_layouts(
        [request.layout],
        [c.token_ids for c in result.completions],
        [0] * rows,
        pad_token_id=processor.tokenizer.pad_token_id,
    )

    def embeds() -> list[torch.Tensor]:
        if not reencode:
            return [request.video.embeds]
        # Re-encoding: the vision tower runs again for this pass.
        return encode_videos(model, encoded["pixel_values_videos"], encoded["video_grid_thw"])

    with torch.no_grad():
        completion_logprobs(model, batch, embeds(), share_prompts=share)  # reference pass
    model.zero_grad()
    completion_logprobs(model, batch, embeds(), share_prompts=share).sum().backward()  # policy pass


def measure(model, processor, vllm, hf, frames: int, sampling: SamplingConfig, preset: str) -> str:
    _, encoded = video_inputs(processor, frames)
    with torch.no_grad():
        encode_s, (embeds,) = timed(
            lambda: encode_videos(model, encoded["pixel_values_videos"], encoded["video_grid_thw"])
        )
    video_token_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    layout = PromptLayout.from_processor_output(encoded, 0, video_token_id, PositionRule.of(model.config))
    request = RolloutRequest(layout, layout.encoded_video(embeds))
    vllm_s, (vllm_result,) = timed(lambda: vllm.generate([request], sampling))
    hf_s, (hf_result,) = timed(lambda: hf.generate([request], sampling), repeats=1)
    vllm_rate = sum(len(c.token_ids) for c in vllm_result.completions) / vllm_s
    hf_rate = sum(len(c.token_ids) for c in hf_result.completions) / hf_s
    cached_s, _ = timed(lambda: rl_step(model, processor, encoded, vllm_result, request, False))
    reencode_s, _ = timed(lambda: rl_step(model, processor, encoded, vllm_result, request, True))
    whole_rows_s, _ = timed(
        lambda: rl_step(model, processor, encoded, vllm_result, request, False, share=False)
    )
    # Rollouts: cached = one encoding, then G samples; re-encoded = G encodings + G samples.
    cached_step = encode_s + vllm_s + cached_s
    reencode_step = sampling.n * encode_s + vllm_s + reencode_s
    return (
        f"{preset:5s} {frames:4d} frames ({int(embeds.shape[0])} video tokens), G={sampling.n}: "
        f"vLLM {vllm_rate:7.0f} tok/s vs transformers {hf_rate:6.0f} tok/s -> x{vllm_rate / hf_rate:.1f}; "
        f"RL step cached {cached_step:.2f} s vs re-encoding {reencode_step:.2f} s "
        f"-> x{reencode_step / cached_step:.2f} (vision tower {encode_s * 1000:.0f} ms per pass); "
        f"reference + policy passes with the prompt shared {cached_s:.2f} s vs every row whole "
        f"{whole_rows_s:.2f} s -> x{whole_rows_s / cached_s:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--frames", nargs="+", type=int, default=[64, 256])
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    from rollout.vllm_engine import VLLMEngine

    sampling = SamplingConfig(n=args.generations, temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            model_dir = build_model_dir(preset, Path(tmp) / preset)
            processor = load_processor(model_dir)
            model = load_model(model_dir)
            max_len = max(args.frames) * 4 + 512
            vllm = VLLMEngine(max_model_len=max_len, max_num_seqs=args.generations)
            vllm.start(PolicyHandle(str(model_dir), model, processor.tokenizer))
            hf = TransformersEngine.for_model(model, processor.tokenizer)
            for frames in args.frames:
                print(measure(model, processor, vllm, hf, frames, sampling, preset), flush=True)


if __name__ == "__main__":
    main()
