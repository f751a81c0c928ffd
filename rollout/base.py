"""The rollout engine interface: start on a policy, generate, take new weights, sleep and wake.

A request carries a prompt's :class:`~core.layout.PromptLayout` (token ids with the video
placeholders expanded, video slots, positions) and the video's cached embeddings, never raw
frames: the video was encoded once by the trainer and every rollout, the reference pass and the
policy pass reuse that encoding. Completions are returned per request; the trainer scores them
in the request's own layout, so nothing about the prompt comes back from the engine.

Engines are chosen in the config by ``class_path`` with their own ``init_args`` (all settings,
no model): constructing one is cheap, and :meth:`RolloutEngine.start` loads it once the policy
exists.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from core.layout import PromptLayout
from core.tool_use.episode import Episode
from core.video import VideoEmbedding
from rollout.engine_limits import RolloutShape


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled.

    Args:
        n: completions per prompt (G, the group size).
        temperature: softmax temperature of sampling (log-probs are reported at temperature 1).
        top_p: nucleus sampling mass.
        max_new_tokens: generation budget per completion.
        seed: base seed of the sampler (None: nondeterministic).
        stop_tokens: tokens that end a turn besides the end of turn itself (a tool-use episode's
            ``</tool_call>``: the turn stops at its request), kept as the turn's last token.
    """

    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    stop_tokens: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be at least 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")


@dataclass
class RolloutRequest:
    """One prompt to complete ``n`` times."""

    layout: PromptLayout
    video: VideoEmbedding | None = None
    """The prompt's video, encoded (None for a text-only prompt)."""


@dataclass
class TurnRequest:
    """The next assistant turn of a tool-use episode: everything so far is its prompt."""

    episode: Episode
    video: VideoEmbedding | None = None
    """The episode prompt's own video, encoded (the segments are in the episode)."""

    def videos(self) -> list[VideoEmbedding]:
        """The sequence's videos in the order of its placeholders."""
        return ([self.video] if self.video is not None else []) + list(self.episode.segments)

    def token_ids(self) -> list[int]:
        """The whole sequence so far, videos expanded."""
        return self.episode.prompt.token_ids.tolist() + self.episode.token_ids

    def video_slots(self) -> list[bool]:
        return self.episode.prompt.video_slots.tolist() + self.episode.video_slots


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each sampled token under the engine's weights, at temperature 1."""
    text: str
    finish_reason: str
    """``stop`` (end of turn) or ``length`` (budget exhausted)."""


@dataclass
class RolloutResult:
    """The completions of one request, in sampling order."""

    completions: list[Completion] = field(default_factory=list)


@dataclass
class PolicyHandle:
    """What an engine may need of the policy it samples for."""

    model_path: str
    """The HF directory the policy was loaded from (an engine with its own copy loads it)."""
    model: torch.nn.Module
    """The live policy (an engine that samples in place uses it)."""
    tokenizer: Any
    """Its tokenizer (special token ids, decoding)."""

    @classmethod
    def of(cls, module: Any) -> PolicyHandle:
        """The policy of a module that trains it (a :class:`~rollout.experience.RolloutConsumer`:
        its ``model_path``, live ``model`` and ``processor``)."""
        return cls(module.model_path, module.model, module.processor.tokenizer)


class RolloutEngine(ABC):
    """Samples completions for the trainer; one subclass per backend (vLLM, transformers).

    The trainer's calls, per training step (:class:`callbacks.rl_rollout.RolloutCallback`)::

        generate -> sleep -> [train] -> wake -> update_weights x buckets -> finish_weight_update

    and the next step's ``generate`` follows; :meth:`start` leaves the engine awake.
    """

    dtype: str | None = None
    """The dtype the engine computes in; None: the policy's own (it samples with the policy)."""

    needs_weight_sync: bool = True
    """False for an engine that samples with the policy module itself: nothing is gathered or
    pushed after an update (:func:`rollout.weight_sync.sync_weights`)."""

    def admit(self, shape: RolloutShape, max_position_embeddings: int | None) -> None:  # noqa: B027
        """Prepare for rollouts of ``shape`` before :meth:`start` (before any weight is loaded),
        or raise :class:`~rollout.engine_limits.EngineLimitError` naming what to set; an engine
        with no limits of its own (the default) takes anything."""

    @abstractmethod
    def start(self, policy: PolicyHandle) -> None:
        """Load the engine for ``policy`` (its weights as loaded from ``model_path``)."""

    @abstractmethod
    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        """``sampling.n`` completions per request, one result per request, in request order."""

    def generate_turns(self, requests: Sequence[TurnRequest], sampling: SamplingConfig) -> list[Completion]:
        """One next turn per episode (``sampling.n`` is not used), in request order: the
        continuation of multi-turn tool-use episodes (:mod:`rollout.episodes`)."""
        raise NotImplementedError(f"{type(self).__name__} does not run multi-turn episodes")

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take new values for the named parameters (HF names; parameters not named keep theirs).

        One bucket of a sync: called several times per sync (each :meth:`weight_group` whole in
        one call), then :meth:`finish_weight_update` once. The tensors belong to the caller, who
        frees them after the call: copy what must be kept.
        """

    def weight_group(self, name: str) -> str:
        """The key of the layer parameter ``name`` loads into: parameters with the same key must
        arrive in the same :meth:`update_weights` call. Each parameter alone by default."""
        return name

    def finish_weight_update(self) -> None:  # noqa: B027 (optional: most engines need nothing here)
        """After the last :meth:`update_weights` call of a sync: drop what was computed with the
        old weights (cached prefixes, encoder outputs). Nothing by default."""

    def sleep(self) -> None:  # noqa: B027 (optional: most engines need nothing here)
        """Release the engine's device memory while the trainer trains (a colocated engine);
        nothing by default.

        Called after each rollout. The next call is :meth:`wake`, before the updated weights are
        loaded (an engine cannot load weights into memory it has released).
        """

    def wake(self) -> None:  # noqa: B027 (optional: most engines need nothing here)
        """Undo :meth:`sleep` far enough to load weights; the engine is fully awake again by the end
        of the sync (:meth:`finish_weight_update`) or the next :meth:`generate`."""

    def shutdown(self) -> None:  # noqa: B027 (optional: most engines need nothing here)
        """Release the engine (best effort: also used on an engine that has failed)."""
