"""The order of a colocated engine's calls in a real GRPO run: sleep while training, wake to sync.

A Trainer fits the tiny model for two rollouts, two optimizer updates each, with an engine that
logs every call the rollout callback makes (the Transformers engine underneath, so the rollouts
are real; it takes the weight syncs a colocated engine would). The order is the contract of
:class:`callbacks.rl_rollout.RolloutCallback`: the engine sleeps from the end of a rollout to
the end of the training step, is woken before the updated weights are loaded (vLLM's sleep has
moved them off the GPU), and stays awake into the next rollout. Real sleep is GPU-only in vLLM;
on CPU its sleep and wake do nothing (tests/e2e/test_rollout_vllm.py).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import lightning as L
from helpers.grpo_helpers import fit_tiny_grpo
from helpers.recording_engines import CallRecorder

from callbacks.rl_rollout import RolloutCallback
from models.grpo import GRPOModule

MIB = 2**20


class LogUpdates(L.Callback):
    """Adds each optimizer update to the engine's call log."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        self.calls.append("optimizer_step")


def runs(log: list[str]) -> list[tuple[str, int]]:
    """``log`` with repeats collapsed: [(call, times in a row)]."""
    return [(call, len(list(group))) for call, group in itertools.groupby(log)]


def test_the_engine_sleeps_through_training_and_wakes_to_take_the_weights(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    log: list[str] = []
    module = GRPOModule(str(tiny_model_dir), learning_rate=1e-3, kl_coef=0.01, num_iterations=2)
    # A quarter-MiB bucket: the sync takes several calls (the tiny model's trainable weights are
    # 2.5 MiB; its embedding and LM head, 0.5 MiB each, go alone).
    rollout = RolloutCallback(
        engine=CallRecorder(log), num_generations=2, max_new_tokens=4, weight_sync_bucket_mb=0.25
    )
    trainer = fit_tiny_grpo(
        module, tiny_model_dir, synth_dir, tmp_path, steps=4, callbacks=[rollout, LogUpdates(log)]
    )
    assert trainer.global_step == 4  # two rollouts of two updates each
    calls = runs(log)
    buckets = calls[5][1]
    assert buckets > 2
    one_step = [
        ("generate", 1),
        ("sleep", 1),
        ("optimizer_step", 2),
        ("wake", 1),
        ("update_weights", buckets),
        ("finish_weight_update", 1),
    ]
    assert calls == [("start", 1), *one_step, *one_step]
    largest_layer = 1024 * 128 * 4  # the embedding (and the LM head): vocabulary x hidden, float32
    assert trainer.callback_metrics["memory/weight_sync_peak_mb"].item() == largest_layer / MIB
