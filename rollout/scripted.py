"""An engine that plays written turns instead of sampling them.

The trainer's side of tool-use episodes (stopping at a request, serving frames, laying out the
rows, scoring them) can then be measured or tested with turns chosen in advance: the same
requests every run, replies of known length, no model sampling in the timings.
``bench/zoom_cost.py`` times a GRPO group's rows this way, and the episode tests drive
:func:`rollout.episodes.run_episodes` with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from rollout.base import (
    Completion,
    PolicyHandle,
    RolloutEngine,
    RolloutRequest,
    RolloutResult,
    SamplingConfig,
    TurnRequest,
)


class ScriptedEngine(RolloutEngine):
    """Each script is one episode's assistant turns, as token ids. Every request's completions are
    the scripts' first turns, in order (one per script: ``sampling.n`` is not read); a later turn
    of an episode is the next turn of the script its first turn came from. Each token's
    log-prob is ``logprob``. No weights: nothing to sync."""

    needs_weight_sync = False

    def __init__(self, scripts: list[list[list[int]]], logprob: float = 0.0) -> None:
        firsts = [tuple(script[0]) for script in scripts]
        if len(set(firsts)) < len(firsts):
            raise ValueError("two scripts begin with the same turn: a later turn could not tell them apart")
        self.scripts = scripts
        self.logprob = logprob
        self._by_first = dict(zip(firsts, scripts, strict=True))

    def start(self, policy: PolicyHandle) -> None:
        pass

    def completion(self, token_ids: list[int]) -> Completion:
        return Completion(list(token_ids), [self.logprob] * len(token_ids), "", "stop")

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        return [RolloutResult([self.completion(script[0]) for script in self.scripts]) for _ in requests]

    def generate_turns(self, requests: Sequence[TurnRequest], sampling: SamplingConfig) -> list[Completion]:
        return [self.completion(self.script_of(request)[request.episode.turns]) for request in requests]

    def script_of(self, request: TurnRequest) -> list[list[int]]:
        """The script whose first turn the request's episode began with."""
        episode = request.episode
        if not episode.turn_lengths:
            raise ValueError("a scripted episode is found by its first sampled turn; a given turn is not one")
        first = tuple(episode.sampled_ids[: episode.turn_lengths[0]])
        if first not in self._by_first:
            raise KeyError(f"no script begins with the episode's first turn ({len(first)} tokens)")
        return self._by_first[first]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass
