"""Rollout correction inside GRPO steps (tiny model, transformers engine, in-process fits).

- The old policy the correction uses is the trainer's own first-iteration log-probs: equal, bit
  for bit, to a separate no-grad pass over the same rows before the update, and reused unchanged
  by the batch's later updates.
- Sequence-level masking removes a completion exactly as an advantage of 0 would.
- ``max_logprob_gap`` stops a run whose engine disagrees with the trainer for K steps in a row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers.grpo_helpers import fit_tiny_grpo
from helpers.tolerances import assert_identical

import models.grpo
from callbacks.rl_rollout import RolloutCallback
from models.grpo import GRPOModule, LogprobGapTooLarge, micro_batches, rows_that_train
from rewards.combine import RewardSpec
from rewards.registry import register
from rollout.hf_engine import TransformersEngine


@register("test_correction_length")
def completion_length(completions: list[str], **_: Any) -> list[float]:
    """Varies within a group even for an untrained model, so advantages are not 0."""
    return [len(text) / 10.0 for text in completions]


class Tamper(L.Callback):
    """Runs after the rollout callback: edits the rollouts the step is about to learn from, and
    records what the test needs of them (no-grad log-probs, gradients)."""

    def __init__(self, edit: Any = None, record_old_policy: bool = False) -> None:
        self.edit = edit
        self.record_old_policy = record_old_policy
        self.no_grad_passes: list[list[torch.Tensor]] = []
        self.gradients: list[dict[str, torch.Tensor]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        rollout = pl_module.experience_of(batch)
        if self.edit is not None:
            self.edit(rollout)
        if self.record_old_policy:
            trained = rows_that_train(rollout.advantages, rollout.row_mask, pl_module.hparams.kl_coef)
            videos = rollout.video_embeds()
            with torch.no_grad():
                self.no_grad_passes.append(
                    [
                        pl_module._logprobs(pl_module.model, rollout.scoring.select(rows), videos)
                        for rows in micro_batches(trained, pl_module.hparams.micro_batch_rows)
                    ]
                )

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        self.gradients.append(
            {n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        )


def fit(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path, steps: int, tamper: Tamper, **module_args: Any
) -> None:
    L.seed_everything(0)
    module = GRPOModule(
        str(tiny_model_dir), learning_rate=1e-3, max_new_tokens=8, max_grad_norm=None, **module_args
    )
    rollout = RolloutCallback(
        engine=TransformersEngine(),
        num_generations=3,
        max_new_tokens=8,
        rewards=[RewardSpec("test_correction_length", 1.0)],
    )
    fit_tiny_grpo(module, tiny_model_dir, synth_dir, tmp_path, steps=steps, callbacks=[rollout, tamper])


def test_old_policy_is_the_first_pass_bit_for_bit(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[torch.Tensor] = []
    weigh = models.grpo.importance_weights

    def recording(old: torch.Tensor, *args: Any) -> Any:
        seen.append(old.clone())
        return weigh(old, *args)

    monkeypatch.setattr(models.grpo, "importance_weights", recording)
    tamper = Tamper(record_old_policy=True)
    correction = {"mode": "mask", "level": "token", "upper": 2.0}
    # Two updates per batch over micro-batches of one prompt's 3 rows: the weights are computed in
    # the first update only (one call per micro-batch) and the second reuses them.
    fit(
        tiny_model_dir,
        synth_dir,
        tmp_path,
        4,
        tamper,
        num_iterations=2,
        micro_batch_rows=3,
        rollout_correction=correction,
    )
    expected = [old for step in tamper.no_grad_passes for old in step]
    assert len(tamper.no_grad_passes) == 2 and len(expected) >= 2
    assert len(seen) == len(expected)
    for old, no_grad in zip(seen, expected, strict=True):
        assert_identical(old, no_grad, reason="the same forward, with and without autograd recording")


def test_sequence_masking_equals_zero_advantage(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    def push_prompt_1_out(rollout: Any) -> None:
        # The engine "reports" prompt 1's completions 50 nats less likely than the trainer
        # finds them: sequence weights exp(50 * tokens), far above 2: masked.
        rollout.old_logprobs[3:6] -= 50.0

    def zero_prompt_1(rollout: Any) -> None:
        rollout.advantages[3:6] = 0.0

    masked = Tamper(push_prompt_1_out)
    zeroed = Tamper(zero_prompt_1)
    correction = {"mode": "mask", "level": "sequence", "upper": 2.0}
    common = {"micro_batch_rows": 1, "rollout_correction": correction}
    fit(tiny_model_dir, synth_dir, tmp_path / "masked", 1, masked, **common)
    fit(tiny_model_dir, synth_dir, tmp_path / "zeroed", 1, zeroed, **common)
    (a,), (b,) = masked.gradients, zeroed.gradients
    assert a.keys() == b.keys() and any(g.abs().sum() > 0 for g in a.values())
    for name in a:
        # Masked rows add exactly-zero gradients (weight 0), after the same per-row passes in
        # the same order: the sums are the same floats.
        assert_identical(a[name], b[name], reason=f"{name}: masked rows vs rows of advantage 0")


def test_a_persistent_gap_stops_the_run(tiny_model_dir: Path, synth_dir: Path, tmp_path: Path) -> None:
    def disagree(rollout: Any) -> None:
        rollout.old_logprobs += 1.0  # a 1-nat gap on every token

    with pytest.raises(LogprobGapTooLarge, match="2 steps in a row"):
        fit(tiny_model_dir, synth_dir, tmp_path, 5, Tamper(disagree), max_logprob_gap=0.5, max_gap_steps=2)
