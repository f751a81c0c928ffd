"""The GRPO update: micro-batched gradient accumulation and several updates per rollout batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from helpers.grpo_helpers import fit_tiny_grpo
from helpers.tolerances import EPS32, GRADIENT_ULPS, assert_float32_close

from callbacks.rl_rollout import RolloutCallback
from core.layout import PositionRule, PromptLayout, ScoringBatch
from models.grpo import GRPOModule, loss_normalizers, rows_that_train
from models.loading import load_model
from models.logprobs import completion_logprobs
from models.rl.losses import policy_loss
from rewards.combine import RewardSpec
from rewards.registry import register
from rollout.hf_engine import TransformersEngine


@register("test_completion_length")
def completion_length(completions: list[str], **_: Any) -> list[float]:
    """A reward that varies within a group even for an untrained model, so advantages are not 0."""
    return [len(text) / 10.0 for text in completions]


class Record(L.Callback):
    """Keeps the completions each step trained on and the gradients of every optimizer update."""

    def __init__(self) -> None:
        self.completions: list[torch.Tensor] = []
        self.gradients: list[dict[str, torch.Tensor]] = []
        self.global_steps_at_batch_start: list[int] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.completions.append(pl_module.experience_of(batch).scoring.completion_ids.clone())
        self.global_steps_at_batch_start.append(trainer.global_step)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        self.gradients.append(
            {n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None}
        )


def fit_grpo(tiny_model_dir: Path, synth_dir: Path, tmp_path: Path, steps: int, **module_args: Any) -> Record:
    L.seed_everything(0)
    module = GRPOModule(
        str(tiny_model_dir), learning_rate=1e-3, max_new_tokens=8, max_grad_norm=None, **module_args
    )
    record = Record()
    rollout = RolloutCallback(
        engine=TransformersEngine(),
        num_generations=3,
        max_new_tokens=8,
        rewards=[RewardSpec("test_completion_length", 1.0)],
    )
    # The rollout callback comes first, so `Record` sees the rollout it put in the batch.
    fit_tiny_grpo(module, tiny_model_dir, synth_dir, tmp_path, steps=steps, callbacks=[rollout, record])
    return record


def test_micro_batches_accumulate_the_full_batch_gradient(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    # Trainable vision tower: micro-batches of 2 rows cut prompt groups of 3 (rows 0-1, 2-3, 4-5),
    # so each micro-batch re-encodes the videos of the prompts it touches.
    common = {"freeze_vision": False, "kl_coef": 0.05}
    for aggregation in ("token_mean", "seq_mean_token_mean"):
        whole = fit_grpo(
            tiny_model_dir, synth_dir, tmp_path / "whole", 1, loss_aggregation=aggregation, **common
        )
        micro = fit_grpo(
            tiny_model_dir,
            synth_dir,
            tmp_path / "micro",
            1,
            loss_aggregation=aggregation,
            micro_batch_rows=2,
            **common,
        )
        assert torch.equal(whole.completions[0], micro.completions[0])  # the same rollout
        (full,), (accumulated,) = whole.gradients, micro.gradients
        assert full.keys() == accumulated.keys() and any("visual" in name for name in full)
        assert any(grad.abs().sum() > 0 for grad in full.values())
        for name, grad in full.items():
            # Relative to the largest entry: micro-batches group the shared prompt passes
            # differently and add their gradients in another order, so entries differ by float
            # rounding; a micro-batch counted twice or dropped, or a wrong normaliser, changes
            # the gradient by >= 1/3 of its size.
            assert_float32_close(
                accumulated[name], grad, ulps=GRADIENT_ULPS, reason=f"{name}: micro-batches vs whole batch"
            )


def test_several_updates_per_rollout_batch(tiny_model_dir: Path, synth_dir: Path, tmp_path: Path) -> None:
    record = fit_grpo(tiny_model_dir, synth_dir, tmp_path, 4, num_iterations=2)
    # max_steps counts optimizer updates: 4 updates = 2 rollout batches of 2 updates each.
    assert record.global_steps_at_batch_start == [0, 2]
    assert len(record.gradients) == 4
    # The second update of a batch starts from moved weights, so its gradient differs from the
    # first (the ratio to the engine's log-probs is no longer 1).
    # "Differs" means beyond rounding: by more than the bar within which two orders of the same
    # computation agree (GRADIENT_ULPS of the tensor's largest entry).
    first, second = record.gradients[0], record.gradients[1]
    assert any(
        (first[n] - second[n]).abs().max() > GRADIENT_ULPS * EPS32 * first[n].abs().max() for n in first
    )


def test_rows_without_signal_are_skipped_exactly(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir).train()
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 200, (n,), generator=generator).tolist() for n in (5, 7, 6, 9)]
    completions = [torch.randint(10, 200, (n,), generator=generator).tolist() for n in (4, 6, 3, 5)]
    layouts = [PromptLayout.build(p, video_token_id=-1, rule=PositionRule(2, 2.0)) for p in prompts]
    scoring = ScoringBatch.from_layouts(layouts, completions, [0, 1, 2, 3], pad_token_id=0)
    old = torch.randn(scoring.completion_mask.shape, generator=generator) * 0.1 - 5.0
    advantages = torch.tensor([1.0, 0.0, -0.5, 0.0])
    row_mask = torch.ones(4)
    assert rows_that_train(advantages, row_mask, kl_coef=0.0) == [0, 2]
    assert rows_that_train(advantages, torch.tensor([1.0, 1.0, 0.0, 1.0]), kl_coef=0.1) == [0, 1, 3]
    normalizers = loss_normalizers(scoring.completion_mask, "token_mean")

    def gradient(rows: list[int]) -> dict[str, torch.Tensor]:
        model.zero_grad()
        batch = scoring.select(rows)
        loss, _ = policy_loss(
            completion_logprobs(model, batch, [None] * 4),
            old[rows],
            advantages[rows],
            batch.completion_mask,
            **normalizers,
        )
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    every_row, trained_rows = gradient([0, 1, 2, 3]), gradient([0, 2])
    assert any(g.abs().sum() > 0 for g in every_row.values())
    for name, grad in every_row.items():
        # Rows 1 and 3 add exact zeros, but the batch of 4 is padded to another length than the
        # batch of 2, so the forward's reductions are blocked differently: a float32 bar.
        assert_float32_close(
            trained_rows[name], grad, ulps=GRADIENT_ULPS, reason=f"{name}: rows 0, 2 alone vs with rows 1, 3"
        )
