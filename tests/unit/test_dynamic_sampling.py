"""Dynamic sampling with refill, overlong shaping and truncation masking (of single turns and of
tool-use episodes), computed by hand.

The engine is scripted (each call returns the completions the test wrote for it) so that which
groups carry signal is known in advance; everything else is the real path: prompts collated
from the synthetic shards, :func:`rollout.experience.collect_rollouts` scoring them with the
registered format reward, :func:`rollout.refill.sample_until_informative` deciding the rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from helpers.scoring_helpers import prompt_batch
from helpers.tolerances import assert_identical
from transformers import AutoConfig

from core.tool_use.episode import Episode
from families import family_of
from rewards.combine import RewardSpec
from rollout.advantages import grpo_advantages
from rollout.base import Completion, RolloutRequest, RolloutResult, SamplingConfig
from rollout.episodes import EpisodeRollouts, EpisodeStats
from rollout.experience import (
    ExperienceSettings,
    PromptBatch,
    RolloutBatch,
    collect_rollouts,
    rollout_metrics,
)
from rollout.refill import DynamicSampling, sample_until_informative
from rollout.shaping import OverlongShaping, overlong_penalties

G = 3
GOOD, BAD = "<think>x</think><answer>B</answer>", "no tags"  # format reward 1 and 0
FLAT, MIXED = [BAD] * G, [GOOD, BAD, GOOD]


@pytest.fixture(scope="module")
def prompt_batches(tiny_model_dir: Path, synth_dir: Path) -> list[PromptBatch]:
    """Four batches of 2 prompts from the synthetic shards (8 different samples)."""
    return [
        prompt_batch(tiny_model_dir, synth_dir, count=2, start=i, num_frames=4, split="train")
        for i in range(0, 8, 2)
    ]


class ScriptedEngine:
    """Returns, call after call, the texts written for each request (the i-th completion of a
    group has i + 1 tokens, each with log-prob -0.5), and records the seeds it was given."""

    def __init__(self, script: Sequence[Sequence[Sequence[str]]], finish: str = "stop") -> None:
        self.script = list(script)
        self.seeds: list[int | None] = []
        self.finish = finish

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        self.seeds.append(sampling.seed)
        texts = self.script[len(self.seeds) - 1]
        assert len(texts) == len(requests) and all(len(t) == sampling.n for t in texts)
        return [
            RolloutResult(
                [
                    Completion([7] * (1 + i), [-0.5] * (1 + i), text, self.finish)
                    for i, text in enumerate(group)
                ]
            )
            for group in texts
        ]


def encode(pixels: torch.Tensor, grids: torch.Tensor) -> list[torch.Tensor]:
    # Stands in for the vision tower: the rollouts here only carry the embeddings along.
    return [torch.full((int(g.prod()) // 4, 8), float(i)) for i, g in enumerate(grids)]


def collector(
    engine: ScriptedEngine, settings: ExperienceSettings
) -> Callable[[PromptBatch, int], RolloutBatch]:
    def collect(prompts: PromptBatch, round_index: int) -> RolloutBatch:
        return collect_rollouts(
            prompts, encode, engine.generate, settings, step=3, pad_token_id=0, round_index=round_index
        )

    return collect


def format_settings(**extra) -> ExperienceSettings:
    return ExperienceSettings(
        SamplingConfig(n=G, temperature=1.0, max_new_tokens=8, seed=5), (RewardSpec("format", 1.0),), **extra
    )


def drawing(batches: Sequence[PromptBatch | None]) -> tuple[Callable[[], PromptBatch | None], list[int]]:
    drawn: list[int] = []

    def draw() -> PromptBatch | None:
        drawn.append(len(drawn))
        return batches[len(drawn) - 1]

    return draw, drawn


def keys(prompts: PromptBatch) -> list[str]:
    return [m["key"] for m in prompts.meta]


def test_a_second_round_fills_the_step_with_informative_groups_in_sampling_order(prompt_batches):
    first, second, third = prompt_batches[:3]
    engine = ScriptedEngine([[FLAT, MIXED], [MIXED, FLAT]])
    draw, drawn = drawing([second, third])
    training, rounds, report = sample_until_informative(
        first, collector(engine, format_settings()), draw, DynamicSampling(), pad_token_id=0
    )
    assert len(drawn) == 1 and len(rounds) == 2  # two informative groups after the second round
    assert engine.seeds == [5 + 3000, 5 + 3000 + 100]  # each round its own seed
    assert keys(training.prompts) == [keys(first)[1], keys(second)[0]]
    assert report.metrics() == {
        "sampling/rounds": 2.0,
        "sampling/prompts": 4.0,
        "sampling/informative_groups": 2.0,
        "sampling/kept_groups": 2.0,
        "sampling/short_steps": 0.0,
    }
    # The step's statistics are those of everything sampled: 12 completions, 4 well formed, half flat.
    metrics = rollout_metrics(*rounds)
    assert metrics["reward/format_mean"] == pytest.approx(4 / 12, abs=1e-7)
    assert metrics["rollout/zero_variance_group_fraction"] == 0.5
    assert metrics["rollout/rejected_special_tokens"] == 0.0
    # Each group moves whole, with the rewards, advantages and engine log-probs it was scored with.
    mixed = torch.tensor([1.0, 0.0, 1.0])
    assert training.rewards.total == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert_identical(training.advantages, grpo_advantages(torch.cat([mixed, mixed]), G), reason="advantages")
    assert_identical(training.advantages[:G], rounds[0].advantages[G:], reason="round 0, prompt 1")
    assert_identical(training.advantages[G:], rounds[1].advantages[:G], reason="round 1, prompt 0")
    assert training.row_mask.tolist() == [1.0] * 6 and not training.zero_variance.any()
    assert [len(c.token_ids) for c in training.completions] == [1, 2, 3, 1, 2, 3]
    assert_identical(training.old_logprobs[:, 0], torch.full((6,), -0.5), reason="engine log-probs")
    # The prompts' videos and layouts are the ones sampled in their rounds.
    assert training.prompts.layouts == [first.layouts[1], second.layouts[0]]
    assert_identical(training.videos[1].embeds, rounds[1].videos[0].embeds, reason="round 1 video")
    grids = torch.stack([first.video_grid_thw[1], second.video_grid_thw[0]])
    assert_identical(training.prompts.video_grid_thw, grids, reason="grids")
    tokens = int(first.video_grid_thw[0].prod())
    assert_identical(
        training.prompts.pixel_values_videos[:tokens], first.pixel_values_videos[tokens:], reason="pixels"
    )
    for row in range(6):
        layout = training.prompts.layouts[row // G]
        assert training.scoring.input_ids[row, : len(layout)].tolist() == layout.token_ids.tolist()


def test_rounds_that_run_out_train_on_what_there_is_and_say_so(prompt_batches):
    first, second = prompt_batches[:2]
    engine = ScriptedEngine([[FLAT, MIXED], [FLAT, FLAT]])
    draw, drawn = drawing([second])
    training, rounds, report = sample_until_informative(
        first, collector(engine, format_settings()), draw, DynamicSampling(max_rounds=2), pad_token_id=0
    )
    assert len(drawn) == 1 and len(rounds) == 2
    assert keys(training.prompts) == [keys(first)[1]]
    assert report.metrics()["sampling/kept_groups"] == 1.0 and report.metrics()["sampling/short_steps"] == 1.0
    # The epoch's data running out ends the rounds too; the batch drawn before that counts.
    engine = ScriptedEngine([[FLAT, MIXED]])
    draw, drawn = drawing([None])
    training, rounds, report = sample_until_informative(
        first, collector(engine, format_settings()), draw, DynamicSampling(max_rounds=5), pad_token_id=0
    )
    assert len(drawn) == 1 and len(rounds) == 1 and report.prompts == 2 and len(training.prompts) == 1


def test_no_informative_group_at_all_trains_nothing(prompt_batches):
    first, second = prompt_batches[:2]
    engine = ScriptedEngine([[FLAT, FLAT], [FLAT, FLAT]])
    draw, _ = drawing([second])
    training, _, report = sample_until_informative(
        first, collector(engine, format_settings()), draw, DynamicSampling(max_rounds=2), pad_token_id=0
    )
    assert keys(training.prompts) == keys(first) and training.row_mask.tolist() == [0.0] * 6
    assert report.informative == report.kept == 0 and report.metrics()["sampling/short_steps"] == 1.0


def test_ranks_sample_in_lockstep_until_every_rank_is_full(prompt_batches):
    first, second, third = prompt_batches[:3]
    engine = ScriptedEngine([[MIXED, MIXED], [MIXED, FLAT]])
    draw, drawn = drawing([second, third])
    # Another rank still lacks groups after round 0; then every rank drew a batch, and is full.
    answers = iter([False, True, True])
    asked: list[bool] = []

    def everywhere(flag: bool) -> bool:
        asked.append(flag)
        return flag and next(answers)

    training, rounds, report = sample_until_informative(
        first,
        collector(engine, format_settings()),
        draw,
        DynamicSampling(),
        everywhere=everywhere,
        pad_token_id=0,
    )
    assert asked == [True, True, True] and len(rounds) == 2 and len(drawn) == 1
    assert keys(training.prompts) == keys(first)  # the first groups found, in sampling order
    assert report.informative == 3 and report.kept == 2


def test_dynamic_sampling_settings_are_checked():
    assert DynamicSampling.of({"groups": 4}) == DynamicSampling(groups=4, max_rounds=3)
    assert DynamicSampling.of(None) is None
    with pytest.raises(ValueError, match="unknown settings"):
        DynamicSampling.of({"group": 4})
    with pytest.raises(ValueError, match="max_rounds"):
        DynamicSampling(max_rounds=11)
    with pytest.raises(ValueError, match="groups"):
        DynamicSampling(groups=0)


def test_the_overlong_penalty_ramps_over_the_buffer():
    shaping = OverlongShaping(buffer=4, penalty=0.5)
    # Budget 8, ramp from 4 tokens: -0.5 * (length - 4) / 4.
    assert overlong_penalties([1, 4, 5, 6, 8], 8, shaping) == [0.0, 0.0, -0.125, -0.25, -0.5]
    with pytest.raises(ValueError, match="must be below max_new_tokens"):
        format_settings(overlong=OverlongShaping(buffer=8))
    with pytest.raises(ValueError, match="unknown settings"):
        OverlongShaping.of({"buffer": 2, "factor": 1.0})


def test_overlong_shaping_enters_the_reward_and_truncated_completions_leave_the_loss(prompt_batches):
    first = prompt_batches[0]
    # Completions of 1, 2, 3 tokens (ScriptedEngine), budget 8; here a budget of 3 with a buffer
    # of 2 penalises 2 tokens by 0.5 and 3 tokens by 1.0.
    settings = ExperienceSettings(
        SamplingConfig(n=G, temperature=1.0, max_new_tokens=3, seed=5),
        (RewardSpec("format", 1.0),),
        overlong=OverlongShaping(buffer=2),
        mask_truncated=True,
    )
    engine = ScriptedEngine([[[GOOD] * G, MIXED]], finish="length")
    rollouts = collect_rollouts(first, encode, engine.generate, settings, step=3, pad_token_id=0)
    penalties = [0.0, -0.5, -1.0]
    assert rollouts.rewards.per_function["overlong"] == penalties * 2
    total = torch.tensor(
        [1.0 + p for p in penalties] + [f + p for f, p in zip([1.0, 0.0, 1.0], penalties, strict=True)]
    )
    assert rollouts.rewards.total == total.tolist()
    assert_identical(rollouts.advantages, grpo_advantages(total, G), reason="advantages count truncated rows")
    assert rollouts.row_mask.tolist() == [0.0] * 6  # every completion ran out of budget
    stopped = collect_rollouts(
        first, encode, ScriptedEngine([[MIXED, MIXED]]).generate, settings, step=3, pad_token_id=0
    )
    assert stopped.row_mask.tolist() == [1.0] * 6


def test_a_tool_use_episode_is_charged_for_its_longest_turn(prompt_batches, tiny_model_dir: Path):
    # Budget 4 tokens a turn, ramp over the last 2: a turn of 3 tokens costs 0.5, of 4 tokens 1.0.
    # Per prompt, G episodes with turns of (1, 3), (4,) and (2, 2, 1): 5 tokens in all costs no
    # more than its longest turn, and the second, its one turn cut at the budget, does not train.
    turn_lengths = [(1, 3), (4,), (2, 2, 1)]
    finishes = ["stop", "length", "stop"]
    rule = family_of(AutoConfig.from_pretrained(tiny_model_dir)).position_rule

    def play(requests: list[RolloutRequest], sampling: SamplingConfig, meta) -> EpisodeRollouts:
        groups, completions = [], []
        for request in requests:
            group = []
            for lengths, finish in zip(turn_lengths, finishes, strict=True):
                episode = Episode(request.layout, rule=rule)
                for n in lengths:
                    episode.add_turn([7] * n, [-0.5] * n, finish)
                group.append(episode)
                completions.append(
                    Completion(episode.sampled_ids, episode.logprobs, GOOD, episode.finish_reason)
                )
            groups.append(group)
        return EpisodeRollouts(groups, completions, [len(t) - 1 for t in turn_lengths] * 2, EpisodeStats())

    settings = ExperienceSettings(
        SamplingConfig(n=G, temperature=1.0, max_new_tokens=4, seed=5),
        (RewardSpec("format", 1.0),),
        overlong=OverlongShaping(buffer=2),
        mask_truncated=True,
        tool_use=True,
    )
    rollouts = collect_rollouts(
        prompt_batches[0],
        encode,
        None,
        settings,
        step=3,
        pad_token_id=0,
        episodes=play,  # type: ignore[arg-type]
    )
    assert rollouts.rewards.per_function["overlong"] == [-0.5, -1.0, 0.0] * 2
    assert rollouts.rewards.total == [0.5, 0.0, 1.0] * 2
    assert rollouts.row_mask.tolist() == [1.0, 0.0, 1.0] * 2
