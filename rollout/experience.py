"""Producing experience: one batch of prompts in, scored rollouts for the policy update out.

:func:`collect_rollouts` is the whole of it, as a plain function (no Trainer): encode each
video **once**, ask the engine for G completions per prompt, score them with the configured
rewards, compute group advantages (and the zero-variance filter), and lay the rows out for
the policy pass from the prompts' own :class:`~core.layout.PromptLayout`. The result, a
:class:`RolloutBatch`, is what :class:`~callbacks.rl_rollout.RolloutCallback` hands to the
module (:class:`RolloutConsumer`). :func:`rollout_metrics` summarises it for the logs.

The settings here are those of *how experience is produced* (:class:`ExperienceSettings`:
sampling, rewards, advantage, filtering); how it is learned from (clipping, KL, aggregation,
iterations) belongs to the module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from core.layout import PromptLayout, ScoringBatch, pad_rows
from core.tool_use.episode import Episode, episode_scoring_batch
from core.video import VideoEmbedding, VideoEncoder
from parallel.shard import SequenceShard
from rewards.combine import RewardBreakdown, RewardSpec, compute_rewards, default_reward_specs
from rewards.parsing import follows_format, response_choice
from rewards.registry import SAMPLE_FIELDS
from rollout.advantages import ADVANTAGE_ESTIMATORS, zero_variance_rows
from rollout.base import Completion, RolloutRequest, RolloutResult, SamplingConfig
from rollout.episodes import EpisodeRollouts, EpisodeStats, merged_tool_stats
from rollout.guardrails import rejected_rows
from rollout.shaping import OverlongShaping, overlong_penalties

if TYPE_CHECKING:  # the consumer protocol's annotations only
    pass

Generator = Callable[[list[RolloutRequest], SamplingConfig], list[RolloutResult]]
"""The engine's ``generate`` (possibly supervised, or shared out over sequence-parallel peers)."""
EpisodeRunner = Callable[[list[RolloutRequest], SamplingConfig, list[dict[str, Any]]], EpisodeRollouts]
"""Tool-use episodes of the requests (given the prompts' ``meta``, where their videos are):
:func:`rollout.episodes.episode_rollouts` with the engine, the sources and the tool bound."""


@dataclass(frozen=True)
class ExperienceSettings:
    """How experience is produced (the rollout callback's settings)."""

    sampling: SamplingConfig
    """G (``n``), temperature, top-p, budget and the base seed."""
    rewards: tuple[RewardSpec, ...] = field(default_factory=lambda: tuple(default_reward_specs()))
    advantage: str = "grpo"
    """``grpo`` (mean/std per group), ``dr_grpo`` (mean only) or ``rloo``."""
    filter_zero_variance: bool = False
    """Drop groups whose rewards are all equal (DAPO's dynamic sampling)."""
    overlong: OverlongShaping | None = None
    """DAPO's soft overlong penalty, added to the reward (:mod:`rollout.shaping`); None: none. A
    tool-use episode gets its longest turn's (each turn has the budget ``max_new_tokens``)."""
    mask_truncated: bool = False
    """Leave completions that ran out of budget out of the loss (DAPO's overlong filtering); a
    tool-use episode whose last turn ran out (a turn that runs out ends its episode)."""
    tool_use: bool = False
    """Rollouts are tool-use episodes (:mod:`rollout.episodes`): the module scores their replies' segments."""

    def __post_init__(self) -> None:
        problem = settings_problem(self.advantage, self.sampling.n)
        if problem:
            raise ValueError(problem)
        if self.overlong is not None:
            self.overlong.check_budget(self.sampling.max_new_tokens)

    @property
    def group_size(self) -> int:
        return self.sampling.n

    def sampling_at(self, step: int, round_index: int = 0) -> SamplingConfig:
        """The sampling of one training step (and sampling round of that step, when dynamic
        sampling draws more prompts): a seed of both (the same after a resume)."""
        if not 0 <= round_index < MAX_SAMPLING_ROUNDS:
            raise ValueError(f"sampling round {round_index} is outside [0, {MAX_SAMPLING_ROUNDS})")
        seed = None if self.sampling.seed is None else self.sampling.seed + 1000 * step + 100 * round_index
        return dataclasses.replace(self.sampling, seed=seed)


MAX_SAMPLING_ROUNDS = 10
"""Sampling rounds one step may take (the seeds of a step's rounds are 100 apart, of steps 1000)."""


def settings_problem(advantage: str, group_size: int) -> str | None:
    """Why an advantage estimator and a group size cannot work together (None: they can).

    >>> settings_problem("grpo", 1).split(":")[0]
    'num_generations=1'
    >>> settings_problem("rloo", 2) is None
    True
    """
    if advantage not in ADVANTAGE_ESTIMATORS:
        return f"advantage must be one of {sorted(ADVANTAGE_ESTIMATORS)}, got {advantage!r}"
    if group_size < 2:  # every estimator here is group-relative
        return (
            f"num_generations={group_size}: group-relative advantages need at least 2 completions "
            "per prompt (with 1 every advantage is 0)"
        )
    return None


@dataclass
class PromptBatch:
    """What rollouts need of a training batch: the prompts' layouts, videos and metadata."""

    layouts: list[PromptLayout]
    meta: list[dict[str, Any]]
    """One dict per prompt (the collator's ``meta``: key, answer, options, ...)."""
    pixel_values_videos: torch.Tensor
    video_grid_thw: torch.Tensor
    """``(prompts, 3)``, one video per prompt."""

    @classmethod
    def of(cls, batch: dict[str, Any]) -> PromptBatch:
        """The prompt half of a :class:`~datamodules.collate.VideoQACollator` batch."""
        if "prompts" not in batch:
            # The collator lays the prompts out only when it knows the model's family (their positions).
            raise KeyError("the batch has no 'prompts' layouts: build the VideoQACollator with family=")
        return cls(batch["prompts"], batch["meta"], batch["pixel_values_videos"], batch["video_grid_thw"])

    def __len__(self) -> int:
        return len(self.layouts)


@dataclass
class RolloutBatch:
    """Scored rollouts of one batch of prompts: what the policy update consumes.

    Rows are completions, G per prompt, prompt-major: rows ``[k*G, (k+1)*G)`` answer prompt k
    (``scoring.prompt_of_row`` says so explicitly).
    """

    prompts: PromptBatch
    videos: list[VideoEmbedding]
    """Each prompt's video, encoded once (the rows of a prompt share it)."""
    completions: list[Completion]
    scoring: ScoringBatch
    old_logprobs: torch.Tensor
    """``(rows, max_completion_len)`` engine (behaviour-policy) log-probs of the sampled tokens."""
    rewards: RewardBreakdown
    advantages: torch.Tensor
    """``(rows,)`` group-relative advantages."""
    zero_variance: torch.Tensor
    """``(rows,)`` bool: the row's group scored all alike."""
    row_mask: torch.Tensor
    """``(rows,)`` 1.0 for rows that train (0 for groups removed by zero-variance filtering,
    for completions rejected by the guardrails and, with ``mask_truncated``, for completions that
    ran out of budget)."""
    group_size: int
    rejected: torch.Tensor | None = None
    """``(rows,)`` bool: the completion holds a special token the template forbids
    (:mod:`rollout.guardrails`); None where nothing was checked."""
    episodes: list[Episode] | None = None
    """Tool-use rollouts: each row's episode (its turns and the tool's replies, which the scoring
    rows hold; ``completions`` hold what the model wrote); None for single-turn rollouts."""
    tool_stats: EpisodeStats | None = None
    """What the frames tool did for these rollouts (tool-use rollouts only)."""

    def __len__(self) -> int:
        return len(self.completions)

    def segment_embeds(self, rows: Sequence[int]) -> list[list[torch.Tensor]] | None:
        """The video segments the tool put into each of ``rows`` (their cached encodings, in
        order); None for single-turn rollouts."""
        if self.episodes is None:
            return None
        return [[segment.embeds for segment in self.episodes[row].segments] for row in rows]

    def segment_inputs(self, rows: Sequence[int]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """The pixel values and grid of each segment of each of ``rows`` (what a trainable vision
        tower encodes again with grad), in order; episodes of one step that were served the same
        frames share the same pixel tensor."""
        if self.episodes is None:
            return [[] for _ in rows]
        return [self.episodes[row].segment_inputs() for row in rows]

    def video_embeds(self) -> list[torch.Tensor]:
        """Each prompt's cached encoding, indexed like ``scoring.prompt_of_row``."""
        return [v.embeds for v in self.videos]


@runtime_checkable
class RolloutConsumer(Protocol):
    """What :class:`~callbacks.rl_rollout.RolloutCallback` needs of the module it feeds (checked at setup)."""

    sequence_shard: SequenceShard | None
    """The sequence-parallel group the module scores with (None: sequences are not split)."""
    EXPERIENCE: str
    """The training batch's key under which the module's step reads its rollouts."""

    model_path: str
    """The HF directory the policy was loaded from (an engine with its own copy loads it)."""
    model: torch.nn.Module | None
    """The live policy (None before it is built)."""

    @property
    def processor(self) -> Any:
        """The policy's processor (its tokenizer: special token ids, decoding)."""
        ...

    @property
    def trains_vision(self) -> bool:
        """Whether the policy pass encodes videos again with grad (a trainable vision tower): tool
        replies then keep their frames' pixel values for it."""
        ...

    def gathered_model(self) -> AbstractContextManager[torch.nn.Module]:
        """The whole policy model for a block of work whose length differs across ranks (an
        engine that samples with the live policy); itself when the model is not sharded."""
        ...

    def encode_videos(
        self, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor
    ) -> list[torch.Tensor]:
        """The vision tower's output, one tensor per video (shared out over ``sequence_shard``)."""
        ...

    def check_experience(
        self, group_size: int, engine_dtype: torch.dtype | None, episodes: bool = False
    ) -> None:
        """Raise ``ValueError`` listing every way G completions per prompt, sampled in
        ``engine_dtype`` (None: the policy's own), as tool-use ``episodes`` or single turns,
        cannot work with the module's settings."""
        ...


def collect_rollouts(
    prompts: PromptBatch,
    encode: VideoEncoder,
    generate: Generator,
    settings: ExperienceSettings,
    *,
    step: int,
    pad_token_id: int,
    length_multiple: int = 1,
    round_index: int = 0,
    forbidden_token_ids: Collection[int] = frozenset(),
    episodes: EpisodeRunner | None = None,
) -> RolloutBatch:
    """Scored rollouts of ``prompts`` (see the module docstring); ``length_multiple`` pads the
    scoring rows for a sequence-parallel group of that size; ``round_index`` is the sampling
    round within the step (dynamic sampling: :mod:`rollout.refill`); a completion holding one of
    ``forbidden_token_ids`` does not train (:mod:`rollout.guardrails`). With ``episodes`` the
    rollouts are tool-use episodes (:mod:`rollout.episodes`; ``generate`` is not used)."""
    with torch.no_grad():
        encoded = encode(prompts.pixel_values_videos, prompts.video_grid_thw)
    videos = [layout.encoded_video(embeds) for embeds, layout in zip(encoded, prompts.layouts, strict=True)]
    requests = [RolloutRequest(layout, video) for layout, video in zip(prompts.layouts, videos, strict=True)]
    sampling = settings.sampling_at(step, round_index)
    played: EpisodeRollouts | None = None
    if episodes is None:
        completions = [c for result in generate(requests, sampling) for c in result.completions]
    else:
        played = episodes(requests, sampling, prompts.meta)
        completions = played.completions
    g = sampling.n
    if len(completions) != len(prompts) * g:
        raise RuntimeError(f"the engine returned {len(completions)} completions for {len(prompts)} x {g}")
    prompt_of_row = [k for k in range(len(prompts)) for _ in range(g)]
    texts = [c.text for c in completions]
    fields = {name: [prompts.meta[k][name] for k in prompt_of_row] for name in SAMPLE_FIELDS}
    fields["frame_requests"] = played.requests if played is not None else [0] * len(completions)
    breakdown = compute_rewards(list(settings.rewards), texts, fields)
    if settings.overlong is not None:
        # Each turn of an episode has the whole budget: the penalty is its longest turn's (the
        # ramp only falls with length), equal to DAPO's for a one-turn episode.
        lengths = (
            [max(e.turn_lengths) for e in played.episodes]
            if played is not None
            else [len(c.token_ids) for c in completions]
        )
        penalties = overlong_penalties(lengths, sampling.max_new_tokens, settings.overlong)
        breakdown.per_function["overlong"] = penalties
        breakdown.total = [t + p for t, p in zip(breakdown.total, penalties, strict=True)]
    rewards = torch.tensor(breakdown.total, dtype=torch.float32)
    advantages = ADVANTAGE_ESTIMATORS[settings.advantage](rewards, g)
    flat = zero_variance_rows(rewards, g)
    row_mask = (~flat).float() if settings.filter_zero_variance else torch.ones_like(rewards)
    if settings.mask_truncated:
        row_mask = row_mask * torch.tensor([c.finish_reason != "length" for c in completions]).float()
    rejected = torch.tensor(rejected_rows(completions, forbidden_token_ids), dtype=torch.bool)
    row_mask = row_mask * (~rejected).float()
    rows = played.episodes if played is not None else None
    scoring, old_logprobs = scoring_rows(
        prompts.layouts, completions, rows, prompt_of_row, pad_token_id, length_multiple
    )
    return RolloutBatch(
        prompts,
        videos,
        completions,
        scoring,
        old_logprobs,
        breakdown,
        advantages,
        flat,
        row_mask,
        g,
        rejected,
        rows,
        played.stats if played is not None else None,
    )


def scoring_rows(
    layouts: Sequence[PromptLayout],
    completions: Sequence[Completion],
    episodes: Sequence[Episode] | None,
    prompt_of_row: Sequence[int],
    pad_token_id: int,
    length_multiple: int,
) -> tuple[ScoringBatch, torch.Tensor]:
    """The policy pass's rows and the engine's log-probs aligned with their completion columns:
    ``prompt + completion``, or for tool-use rollouts ``prompt + episode`` (the tool's replies
    in place, with no log-prob)."""
    if episodes is None:
        scoring = ScoringBatch.from_layouts(
            layouts,
            [c.token_ids for c in completions],
            prompt_of_row,
            pad_token_id=pad_token_id,
            length_multiple=length_multiple,
        )
        return scoring, pad_rows([c.logprobs for c in completions], torch.float32)[0]
    scoring = episode_scoring_batch(
        episodes, prompt_of_row, pad_token_id=pad_token_id, length_multiple=length_multiple
    )
    return scoring, pad_rows([e.logprobs for e in episodes], torch.float32)[0]


def rollout_metrics(*batches: RolloutBatch) -> dict[str, float]:
    """What the sampled rollouts looked like (several batches: a step's sampling rounds, taken
    together): rewards per function, accuracy, format, lengths, flat groups, truncated and
    rejected completions."""
    completions = [c for batch in batches for c in batch.completions]
    meta = [batch.prompts.meta[k] for batch in batches for k in batch.scoring.prompt_of_row]
    metrics: dict[str, float] = {}
    for name in batches[0].rewards.per_function:
        tensor = torch.tensor([v for batch in batches for v in batch.rewards.per_function[name]])
        metrics[f"reward/{name}_mean"] = float(tensor.mean())
        metrics[f"reward/{name}_std"] = float(tensor.std(unbiased=False))
    metrics["reward/total_mean"] = float(torch.tensor([v for b in batches for v in b.rewards.total]).mean())
    texts = [c.text for c in completions]
    correct = [
        float(response_choice(t, len(m["options"]) or 4, m["options"]) == m["answer"])
        for t, m in zip(texts, meta, strict=True)
    ]
    n = len(texts)
    metrics["rollout/accuracy"] = sum(correct) / n
    metrics["rollout/format_rate"] = sum(follows_format(t) for t in texts) / n
    lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)
    metrics["rollout/response_length_mean"] = float(lengths.mean())
    metrics["rollout/response_length_max"] = float(lengths.max())
    flat = torch.cat([batch.zero_variance for batch in batches])
    metrics["rollout/zero_variance_group_fraction"] = float(flat.float().mean())
    metrics["rollout/truncated_fraction"] = sum(c.finish_reason == "length" for c in completions) / n
    tool = merged_tool_stats([batch.tool_stats for batch in batches])
    if tool is not None:
        metrics.update(tool.metrics())
    if all(batch.rejected is not None for batch in batches):
        metrics["rollout/rejected_special_tokens"] = float(sum(int(b.rejected.sum()) for b in batches))  # type: ignore[union-attr]
    return metrics


def select_groups(
    rounds: Sequence[RolloutBatch],
    picks: Sequence[tuple[int, int]],
    *,
    pad_token_id: int,
    length_multiple: int = 1,
) -> RolloutBatch:
    """The groups ``picks`` (``(round, prompt)`` pairs) of several rollout batches as one batch, in
    that order: each group's prompt, video, completions, rewards, advantages and masks as they
    were (advantages are group-relative, so a group moves whole), the scoring rows laid out anew."""
    if not picks:
        raise ValueError("select_groups needs at least one group")
    g = rounds[0].group_size
    if any(r.group_size != g for r in rounds):
        raise ValueError("every round must have the same group size")
    layouts, meta, videos, grids, pixels = [], [], [], [], []
    rows: list[tuple[int, int]] = []  # (round, row) of each selected completion, prompt-major
    for round_index, k in picks:
        batch = rounds[round_index]
        prompts = batch.prompts
        offsets = [0, *prompts.video_grid_thw.prod(dim=-1).cumsum(0).tolist()]
        layouts.append(prompts.layouts[k])
        meta.append(prompts.meta[k])
        videos.append(batch.videos[k])
        grids.append(prompts.video_grid_thw[k])
        pixels.append(prompts.pixel_values_videos[offsets[k] : offsets[k + 1]])
        rows.extend((round_index, k * g + i) for i in range(g))
    completions = [rounds[r].completions[i] for r, i in rows]
    names = rounds[0].rewards.per_function
    per_function = {name: [rounds[r].rewards.per_function[name][i] for r, i in rows] for name in names}
    rewards = RewardBreakdown([rounds[r].rewards.total[i] for r, i in rows], per_function)

    def stacked(field: str) -> torch.Tensor:
        return torch.stack([getattr(rounds[r], field)[i] for r, i in rows])

    prompt_of_row = [k for k in range(len(picks)) for _ in range(g)]
    episodes = None
    if all(r.episodes is not None for r in rounds):
        episodes = [rounds[r].episodes[i] for r, i in rows]  # type: ignore[index]
    elif any(r.episodes is not None for r in rounds):
        raise ValueError("cannot select groups from tool-use and single-turn rounds together")
    scoring, old_logprobs = scoring_rows(
        layouts, completions, episodes, prompt_of_row, pad_token_id, length_multiple
    )
    prompt_batch = PromptBatch(layouts, meta, torch.cat(pixels), torch.stack(grids))
    return RolloutBatch(
        prompt_batch,
        videos,
        completions,
        scoring,
        old_logprobs,
        rewards,
        stacked("advantages"),
        stacked("zero_variance"),
        stacked("row_mask"),
        g,
        stacked("rejected") if all(r.rejected is not None for r in rounds) else None,
        episodes,
        None,  # what the tool did is logged per sampling round (rollout_metrics)
    )


def sample_records(rollouts: RolloutBatch, step: int) -> list[dict[str, Any]]:
    """One JSON-able record per completion (step, prompt key, answer, completion, reward)."""
    return [
        {
            "step": step,
            "key": rollouts.prompts.meta[k]["key"],
            "answer": rollouts.prompts.meta[k]["answer"],
            "completion": c.text,
            "reward": r,
        }
        for k, c, r in zip(
            rollouts.scoring.prompt_of_row, rollouts.completions, rollouts.rewards.total, strict=True
        )
    ]
