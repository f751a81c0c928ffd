"""Dynamic sampling that refills the batch: sample more prompts until enough groups carry signal.

A group whose G completions all score alike has advantage 0 everywhere and teaches nothing.
As the policy improves, more groups come back all-correct (and, early on, all-wrong), so a
step that only *drops* them (``filter_zero_variance``) trains on fewer and fewer groups. DAPO
(Yu et al., 2025, section 3.2) keeps the batch full instead: it samples further prompts until
the step has the configured number of groups with non-zero reward variance. Here:

    round 0: the step's own batch of prompts
    round r: one more batch drawn from the training stream, while some data-parallel rank has
             fewer than ``groups`` informative groups and r < ``max_rounds``
    then:    the first ``groups`` informative groups, in sampling order, train

Every prompt drawn counts as consumed (the datamodule's position in checkpoints includes the
extra batches, so a resumed run draws exactly what the uninterrupted one drew). When the
rounds run out (or the epoch's data does) the step trains on what it has, and says so in the
logs (``sampling/short_steps``). Each round samples with its own seed (step and round), so a
round never repeats another's draws.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from core.settings import settings_block
from rollout.experience import MAX_SAMPLING_ROUNDS, PromptBatch, RolloutBatch, select_groups


@dataclass(frozen=True)
class DynamicSampling:
    """The ``dynamic_sampling:`` block of the rollout callback.

    Attributes:
        groups: informative groups (non-zero reward variance) each step trains on, per
            data-parallel rank; null: the batch's own number of prompts (``data.batch_size``).
        max_rounds: sampling rounds a step may take, the step's own batch included (each extra
            round draws one more batch of prompts); at most 10.
    """

    groups: int | None = None
    max_rounds: int = 3

    def __post_init__(self) -> None:
        if self.groups is not None and self.groups < 1:
            raise ValueError(f"dynamic_sampling.groups must be >= 1 or null, got {self.groups}")
        if not 1 <= self.max_rounds <= MAX_SAMPLING_ROUNDS:
            raise ValueError(
                f"dynamic_sampling.max_rounds must be in [1, {MAX_SAMPLING_ROUNDS}], got {self.max_rounds}"
            )

    @classmethod
    def of(cls, value: DynamicSampling | Mapping[str, Any] | None) -> DynamicSampling | None:
        return settings_block(cls, value, "dynamic_sampling")


@dataclass
class RefillReport:
    """What one step's dynamic sampling did (logged under ``sampling/``)."""

    rounds: int
    prompts: int
    """Prompts sampled over all rounds (all consumed from the stream)."""
    informative: int
    """Groups with non-zero reward variance among them."""
    kept: int
    """Groups the step trains on (at most the target)."""
    target: int

    def metrics(self) -> dict[str, float]:
        return {
            "sampling/rounds": float(self.rounds),
            "sampling/prompts": float(self.prompts),
            "sampling/informative_groups": float(self.informative),
            "sampling/kept_groups": float(self.kept),
            "sampling/short_steps": float(self.kept < self.target),
        }


def informative_groups(batch: RolloutBatch) -> list[int]:
    """Prompts of ``batch`` whose group's rewards are not all equal."""
    g = batch.group_size
    return [k for k in range(len(batch.prompts)) if not bool(batch.zero_variance[k * g])]


def sample_until_informative(
    first: PromptBatch,
    collect: Callable[[PromptBatch, int], RolloutBatch],
    draw: Callable[[], PromptBatch | None],
    settings: DynamicSampling,
    *,
    everywhere: Callable[[bool], bool] = lambda flag: flag,
    pad_token_id: int,
    length_multiple: int = 1,
) -> tuple[RolloutBatch, list[RolloutBatch], RefillReport]:
    """Sample rounds (see the module docstring); returns the groups that train, every round's
    rollouts (for the step's rollout statistics), and a report.

    ``collect(prompts, round)`` produces one round's scored rollouts; ``draw()`` the next batch
    of prompts from the training stream (None: this epoch's data is used up); ``everywhere(flag)``
    is True when ``flag`` holds on every data-parallel rank (ranks sample in lockstep: the
    engine and the encoder may be collectives).
    """
    target = settings.groups or len(first)
    rounds = [collect(first, 0)]
    while True:
        found = [(r, k) for r, batch in enumerate(rounds) for k in informative_groups(batch)]
        if everywhere(len(found) >= target) or len(rounds) >= settings.max_rounds:
            break
        more = draw()
        if not everywhere(more is not None):
            break  # some rank's stream ran out: train on what there is (a drawn batch is consumed)
        assert more is not None
        rounds.append(collect(more, len(rounds)))
    kept = found[:target]
    report = RefillReport(len(rounds), sum(len(b.prompts) for b in rounds), len(found), len(kept), target)
    if not kept:  # nothing informative at all: the step's own batch, none of it training
        only = rounds[0]
        return dataclasses.replace(only, row_mask=torch.zeros_like(only.row_mask)), rounds, report
    training = select_groups(rounds, kept, pad_token_id=pad_token_id, length_multiple=length_multiple)
    return training, rounds, report
