"""One training step's experience, produced by one object: :class:`RolloutWorker`.

:class:`~callbacks.rl_rollout.RolloutCallback` owns a worker and calls it at Lightning's hooks;
everything the step does with the engine reads top to bottom here, in named methods, and tests
drive a worker without a Trainer. A step, in order::

    encode     the batch's videos, once each (the module's vision tower, shared out over a
               sequence-parallel group)
    generate   G completions per prompt from the supervised engine (or play tool-use episodes)
    score      rewards, group advantages and the scoring rows of one round of prompts
    select     with dynamic sampling, more rounds until enough groups are informative
    hand_over  the engine sleeps; the training batch carries the rollouts its update learns from
    sync       after the update: the engine wakes and takes the new weights

The worker holds the engine (behind its :class:`~rollout.supervision.EngineSupervisor`), the
step's settings (:class:`~rollout.experience.ExperienceSettings`, the frames tool, dynamic
sampling) and the module it feeds (a :class:`~rollout.experience.RolloutConsumer`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, TypeVar

import torch

from parallel.collectives import share_out
from rollout.base import RolloutEngine, RolloutRequest, RolloutResult, SamplingConfig
from rollout.episodes import (
    EpisodeRollouts,
    FrameTool,
    alone,
    episode_rollouts,
    frame_sources,
    given_turns_of,
)
from rollout.experience import (
    ExperienceSettings,
    PromptBatch,
    RolloutBatch,
    RolloutConsumer,
    collect_rollouts,
)
from rollout.guardrails import forbidden_completion_ids
from rollout.refill import DynamicSampling, RefillReport, sample_until_informative
from rollout.supervision import EngineSupervisor
from rollout.weight_sync import SyncReport

T = TypeVar("T")


class RolloutWorker:
    """Produces each training step's scored rollouts for ``module`` and keeps ``supervisor``'s
    engine in step with the module's weights.

    Args:
        module: the module that encodes the videos and learns from the rollouts.
        supervisor: the engine, kept answering (restarted and retried on failure, timed out).
        settings: how experience is produced (G, sampling, rewards, advantage, filtering).
        tool: the frames tool of tool-use episodes (built by :meth:`frames_tool`); None: single-turn.
        dynamic_sampling: keep the step's number of informative groups by sampling more prompts.
    """

    def __init__(
        self,
        module: RolloutConsumer,
        supervisor: EngineSupervisor,
        settings: ExperienceSettings,
        tool: FrameTool | None = None,
        dynamic_sampling: DynamicSampling | None = None,
    ) -> None:
        self.module = module
        self.supervisor = supervisor
        self.engine = supervisor.engine
        self.settings = settings
        self.tool = tool
        self.dynamic_sampling = dynamic_sampling
        self.step = 0
        """The training step being prepared (its sampling seeds and the supervisor's records)."""
        self.vision_calls = 0
        """Vision-tower encodings so far (one per prompt per step; the tests count them)."""
        self.forbidden_token_ids: frozenset[int] = frozenset()
        """Special tokens a completion must not hold (:mod:`rollout.guardrails`), set at :meth:`start`."""

    def frames_tool(self, budget: Any, processor: Any, family: Any) -> FrameTool:
        """The frames tool of this worker's episodes: ``budget`` per episode, replies laid out by
        ``processor`` and ``family``, encoded by :meth:`encode` (pixels kept when the module
        encodes them again with grad)."""
        return FrameTool(budget, processor, family, self.encode, keep_pixels=self.module.trains_vision)

    # -- the engine's life --------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine on the policy as loaded (awake)."""
        self.forbidden_token_ids = forbidden_completion_ids(self.module.processor.tokenizer)
        self.supervisor.start(sync_weights=False)

    def sync(self) -> SyncReport:
        """Stream the module's current weights into the engine, woken first (weights load into
        an awake engine)."""
        self.engine.wake()
        return self.supervisor.sync_weights()

    def sync_with_next_rollout(self) -> None:
        """Stream the module's weights into the (awake) engine as the next rollout starts, under
        the supervisor with it: a resumed run's checkpoint weights."""
        self.supervisor.sync_before_next_rollout()

    # -- one step -----------------------------------------------------------------------------
    def encode(self, pixels: torch.Tensor, grids: torch.Tensor) -> list[torch.Tensor]:
        """The module's encoding of each video (counted in :attr:`vision_calls`)."""
        encoded = self.module.encode_videos(pixels, grids)
        self.vision_calls += len(encoded)
        return encoded

    def generate(self, requests: list[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        """Completions of ``requests`` from the engine; sequence-parallel peers, which hold the
        same prompts, each sample a share."""
        shard = self.module.sequence_shard

        def on(engine: RolloutEngine) -> list[RolloutResult]:
            if shard is None:
                return engine.generate(requests, sampling)
            return share_out(requests, lambda mine: engine.generate(mine, sampling), shard.rollout_group)

        return self._on_engine(on)

    def play_episodes(
        self, requests: list[RolloutRequest], sampling: SamplingConfig, meta: list[dict[str, Any]]
    ) -> EpisodeRollouts:
        """Tool-use episodes of ``requests`` (their videos and given turns from the prompts'
        ``meta``); sequence-parallel peers each sample a share of every round's turns and serve
        the replies together (the tool encodes with the group)."""
        assert self.tool is not None
        shard = self.module.sequence_shard
        share = alone if shard is None else functools.partial(share_out, group=shard.rollout_group)
        sources = frame_sources(meta)
        given = given_turns_of(meta, self.module.processor.tokenizer)
        relevant = [sample.get("relevant_span_s") for sample in meta]
        tool = self.tool
        return self._on_engine(
            lambda engine: episode_rollouts(engine, requests, sources, sampling, tool, share, given, relevant)
        )

    def score(self, prompts: PromptBatch, round_index: int = 0) -> RolloutBatch:
        """One round of the step: encode, generate (or play episodes), reward, advantages and
        the scoring rows of ``prompts``."""
        return collect_rollouts(
            prompts,
            self.encode,
            self.generate,
            self.settings,
            step=self.step,
            **self._row_layout(),
            round_index=round_index,
            forbidden_token_ids=self.forbidden_token_ids,
            episodes=self.play_episodes if self.tool is not None else None,
        )

    def select(
        self,
        prompts: PromptBatch,
        draw: Callable[[], PromptBatch | None],
        everywhere: Callable[[bool], bool],
    ) -> tuple[RolloutBatch, list[RolloutBatch], RefillReport | None]:
        """The step's rollouts (what trains), every round scored (for statistics) and, with
        dynamic sampling, its report: more rounds of prompts from ``draw`` until enough groups
        are informative on every rank (``everywhere``)."""
        if self.dynamic_sampling is None:
            rollouts = self.score(prompts)
            return rollouts, [rollouts], None
        return sample_until_informative(
            prompts, self.score, draw, self.dynamic_sampling, everywhere=everywhere, **self._row_layout()
        )

    def hand_over(self, rollouts: RolloutBatch, batch: dict[str, Any]) -> None:
        """The engine sleeps (the trainer gets the device until the weight sync) and the step's
        training ``batch`` carries the rollouts its update learns from (under the module's
        ``EXPERIENCE`` key)."""
        self.engine.sleep()
        batch[self.module.EXPERIENCE] = rollouts

    def _row_layout(self) -> dict[str, int]:
        """How scoring rows are laid out: the tokenizer's padding id, and lengths a multiple of
        the sequence-parallel size (1 without a group)."""
        shard = self.module.sequence_shard
        return {
            "pad_token_id": self.module.processor.tokenizer.pad_token_id,
            "length_multiple": shard.length_multiple if shard is not None else 1,
        }

    def _on_engine(self, work: Callable[[RolloutEngine], T]) -> T:
        """``work(engine)`` under the supervisor."""
        return self.supervisor.run(lambda engine: self._live(engine, work), self.step)

    def _live(self, engine: RolloutEngine, work: Callable[[RolloutEngine], T]) -> T:
        # An engine sampling with the live policy decodes different lengths on each rank, so a
        # sharded policy is gathered whole for it (no collective inside).
        live = self.module.gathered_model() if not engine.needs_weight_sync else nullcontext()
        with live:
            return work(engine)
