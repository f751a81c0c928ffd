"""Guardrails: a model that would emit the video placeholder never does through either engine,
the log-probs the engines report stay the model's own, and a completion holding a special
token the template forbids is rejected, counted and kept out of the loss and of video slots."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.biased_models import save_biased_model
from helpers.scoring_helpers import prompt_batch
from helpers.tolerances import FORWARD_ULPS, assert_float32_close
from transformers import AutoProcessor

from families import family_of
from models.loading import load_model
from models.logprobs import completion_logprobs
from models.vision import encode_videos
from rewards.combine import RewardSpec
from rollout.base import Completion, PolicyHandle, RolloutRequest, RolloutResult, SamplingConfig
from rollout.experience import ExperienceSettings, collect_rollouts, rollout_metrics
from rollout.guardrails import banned_token_ids, forbidden_completion_ids
from rollout.hf_engine import TransformersEngine
from rollout.vllm_engine import VLLMEngine

SETTINGS = ExperienceSettings(
    SamplingConfig(n=4, temperature=1.0, max_new_tokens=6, seed=3), (RewardSpec("format", 1.0),)
)


@pytest.fixture(scope="module")
def biased_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny model edited to put almost all next-token mass on ``<|video_pad|>``."""
    return save_biased_model(tiny_model_dir, tmp_path_factory.mktemp("biased") / "model", "<|video_pad|>")


def test_the_biased_model_would_emit_the_placeholder(biased_model_dir: Path, synth_dir: Path) -> None:
    model = load_model(biased_model_dir).eval()
    tokenizer = AutoProcessor.from_pretrained(biased_model_dir).tokenizer
    prompts = prompt_batch(biased_model_dir, synth_dir, num_frames=4)
    video_pad = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert video_pad in banned_token_ids(model.config, tokenizer)
    with torch.no_grad():
        videos = encode_videos(model, prompts.pixel_values_videos, prompts.video_grid_thw)
        engine = TransformersEngine.for_model(model, tokenizer)
        engine.banned = None  # guardrail off: what the model does on its own
        requests = [
            RolloutRequest(layout, layout.encoded_video(v))
            for layout, v in zip(prompts.layouts, videos, strict=True)
        ]
        unguarded = engine.generate(requests, SETTINGS.sampling)
    sampled = [t for r in unguarded for c in r.completions for t in c.token_ids]
    assert sum(t == video_pad for t in sampled) / len(sampled) > 0.9


@pytest.mark.parametrize("engine_name", ["transformers", "vllm"])
def test_no_engine_samples_a_vision_token_and_the_log_probs_stay_raw(
    biased_model_dir: Path, synth_dir: Path, engine_name: str
) -> None:
    model = load_model(biased_model_dir).eval()
    tokenizer = AutoProcessor.from_pretrained(biased_model_dir).tokenizer
    prompts = prompt_batch(biased_model_dir, synth_dir, num_frames=4)
    banned = set(banned_token_ids(model.config, tokenizer))
    engine = TransformersEngine() if engine_name == "transformers" else VLLMEngine(max_model_len=1024)
    engine.start(PolicyHandle(str(biased_model_dir), model, tokenizer))
    try:

        def encode(pixels: torch.Tensor, grids: torch.Tensor) -> list[torch.Tensor]:
            return encode_videos(model, pixels, grids)

        rollouts = collect_rollouts(
            prompts,
            encode,
            engine.generate,
            SETTINGS,
            step=0,
            pad_token_id=tokenizer.pad_token_id,
            forbidden_token_ids=forbidden_completion_ids(tokenizer),
        )
    finally:
        if engine_name == "vllm":
            engine.shutdown()
    sampled = [t for c in rollouts.completions for t in c.token_ids]
    assert len(sampled) >= 8 and not banned & set(sampled)
    # The reported log-probs are the model's own (placeholder included in the normaliser): the
    # sampled tokens have almost no mass, far below what a banned-then-renormalised distribution
    # would give them.
    with torch.no_grad():
        scored = completion_logprobs(model, rollouts.scoring, rollouts.video_embeds())
    valid = rollouts.scoring.completion_mask.bool()
    assert float(rollouts.old_logprobs[valid].max()) < -20.0
    scale = float(rollouts.old_logprobs[valid].abs().max())
    assert_float32_close(
        rollouts.old_logprobs[valid],
        scored[valid],
        ulps=FORWARD_ULPS,
        scale=scale,
        reason=f"{engine_name} log-probs of a guarded sample vs the trainer's",
    )


class SpecialTokenEngine:
    """Returns completions holding chosen tokens (a model gone wrong, as scripted as it needs to be)."""

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows

    def generate(self, requests, sampling):
        return [
            RolloutResult([Completion(ids, [-1.0] * len(ids), "text", "stop") for ids in self.rows])
            for _ in requests
        ]


def test_a_completion_with_a_forbidden_special_token_is_rejected_and_counted(
    tiny_model_dir: Path, synth_dir: Path
) -> None:
    model = load_model(tiny_model_dir).eval()
    tokenizer = AutoProcessor.from_pretrained(tiny_model_dir).tokenizer
    prompts = prompt_batch(tiny_model_dir, synth_dir, num_frames=4)
    ids = tokenizer.convert_tokens_to_ids
    im_start, im_end, video_pad = ids("<|im_start|>"), ids("<|im_end|>"), ids("<|video_pad|>")
    forbidden = forbidden_completion_ids(tokenizer)
    assert {im_start, video_pad} <= forbidden and im_end not in forbidden
    words = [40, 41, 42]
    engine = SpecialTokenEngine([[*words, im_end], [*words, im_start, 43], [*words, video_pad], words])
    rollouts = collect_rollouts(
        prompts,
        lambda pixels, grids: encode_videos(model, pixels, grids),
        engine.generate,
        SETTINGS,
        step=0,
        pad_token_id=tokenizer.pad_token_id,
        forbidden_token_ids=forbidden,
    )
    assert rollouts.rejected.tolist() == [False, True, True, False] * 2
    assert rollouts.row_mask.tolist() == [1.0, 0.0, 0.0, 1.0] * 2
    assert rollout_metrics(rollouts)["rollout/rejected_special_tokens"] == 4.0
    # The placeholder in a completion is text to the trainer, never a video slot.
    for row in range(len(rollouts)):
        prompt_length = rollouts.scoring.prompt_lengths[row]
        assert not rollouts.scoring.video_mask[row, prompt_length:].any()
        assert int(rollouts.scoring.video_mask[row].sum()) == int(prompts.layouts[row // 4].video_slots.sum())


def test_padding_rows_of_the_embedding_are_never_sampled(tiny_model_dir: Path) -> None:
    # The tiny model's embedding has 1,024 rows for a tokenizer of fewer tokens: the rows past the
    # tokenizer decode to nothing, so a completion holding one would be scored on text the model
    # did not write. Both engines get them banned with the placeholders.
    model = load_model(tiny_model_dir).eval()
    tokenizer = AutoProcessor.from_pretrained(tiny_model_dir).tokenizer
    padding = set(range(len(tokenizer), model.config.text_config.vocab_size))
    assert len(padding) > 100 and padding <= set(banned_token_ids(model.config, tokenizer))
    assert all(tokenizer.decode([i]) == "" for i in sorted(padding)[:5])
    vision = set(family_of(model.config).vision_token_ids(tokenizer))
    assert set(banned_token_ids(model.config, tokenizer)) == vision | padding  # nothing else
