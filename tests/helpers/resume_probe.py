"""A test callback recording what each training step did: its samples, loss and reward.

Loaded by configs as ``helpers.resume_probe.StepRecorder`` (``PYTHONPATH=tests`` in
subprocesses). Appends one JSON line per step to ``{out}`` (flushed and synced at once, so a
run killed mid-step has recorded every finished step): ``{"step", "keys", "stream", "epoch",
"loss", "reward", "trained_keys", "rounds"}`` (``stream``: each sample's (epoch, worker, position)
in the data stream; ``trained_keys``: the prompts the GRPO step trained on, which dynamic
sampling may have drawn after the batch; ``rounds``: its sampling rounds).

Also registers the reward ``probe_half_flat`` for runs whose steps need several sampling rounds.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import zlib
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger

from rewards.registry import register


@register("probe_half_flat")
def half_flat_reward(completions: Sequence[str], key: Sequence[str], salt: str = "", **_: Any) -> list[float]:
    """0 for every completion of a prompt whose salted key hashes even (a group without signal);
    else a hash of the completion's text in [0, 1] (a group with signal, for any model)."""

    def flat(k: str) -> bool:
        return hashlib.sha256(f"{salt}{k}".encode()).digest()[0] % 2 == 0

    return [
        0.0 if flat(k) else (zlib.crc32(text.encode()) % 7) / 6
        for text, k in zip(completions, key, strict=True)
    ]


class StepRecorder(L.Callback):
    def __init__(self, out: str) -> None:
        self.out = out
        self._keys: list[str] = []
        self._stream: list[list[int]] = []
        self._rollout: float | None = None
        self._trained_keys: list[str] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._keys = [m["key"] for m in batch["meta"]]
        self._stream = [list(m["stream"]) for m in batch["meta"]]
        rollout = batch.get("experience")  # GRPO, after the rollout callback
        # The engine's log-probs of the sampled tokens: equal only if the same tokens were sampled.
        self._rollout = None if rollout is None else float(rollout.old_logprobs.double().sum())
        self._trained_keys = self._keys if rollout is None else [m["key"] for m in rollout.prompts.meta]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        metrics = trainer.callback_metrics
        loss = metrics.get("train/loss")  # both modules log it every step
        reward = metrics.get("reward/total_mean")
        rounds = metrics.get("sampling/rounds")
        requests = metrics.get("tool/requests_per_episode")
        record = {
            "step": trainer.global_step,
            "keys": self._keys,
            "stream": self._stream,
            "epoch": trainer.current_epoch,
            "loss": float(loss) if isinstance(loss, torch.Tensor | float) else None,
            "reward": float(reward) if reward is not None else None,
            "rollout_logprob_sum": self._rollout,
            "trained_keys": self._trained_keys,
            "rounds": int(rounds) if rounds is not None else None,
            "tool_requests": float(requests) if requests is not None else None,
        }
        # One file per rank (ranks train on different samples): steps.jsonl, steps.jsonl.rank1, ...
        out = self.out if trainer.global_rank == 0 else f"{self.out}.rank{trainer.global_rank}"
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


class SeededAdvantages(L.Callback):
    """Replaces the rollout's advantages by normal draws seeded with the step (after the rollout
    callback): an untrained tiny model scores every completion 0, so GRPO would not move.

    ``nan_from_step``: from that global step on, the advantages are NaN (``nan_times`` batches
    in all; None: every batch from then on), which makes the loss NaN.
    """

    def __init__(self, nan_from_step: int | None = None, nan_times: int | None = None) -> None:
        self.nan_from_step = nan_from_step
        self.nan_times = nan_times
        self.injected = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        rollout = pl_module.experience_of(batch)
        generator = torch.Generator().manual_seed(1000 + trainer.global_step)
        rollout.advantages = torch.randn(rollout.advantages.shape, generator=generator)
        poisoned = self.nan_from_step is not None and trainer.global_step >= self.nan_from_step
        if poisoned and (self.nan_times is None or self.injected < self.nan_times):
            rollout.advantages = torch.full_like(rollout.advantages, float("nan"))
            self.injected += 1


class EngineKiller(L.Callback):
    """Shuts the rollout engine down before the rollout of ``at_step`` (put it before the rollout
    callback), as a crashed engine; with ``every_restart`` also each engine started after that;
    with ``sigterm``, sends this process a SIGTERM first (a pre-emption that stops the engine)."""

    def __init__(self, at_step: int, every_restart: bool = False, sigterm: bool = False) -> None:
        self.at_step = at_step
        self.every_restart = every_restart
        self.sigterm = sigterm
        self.done = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        from callbacks.rl_rollout import RolloutCallback

        rollout = next(c for c in trainer.callbacks if isinstance(c, RolloutCallback))
        self.rollout = rollout
        if self.every_restart:
            supervisor = rollout.supervisor
            start = supervisor.start

            def start_dead(*args: Any, **kwargs: Any) -> None:
                start(*args, **kwargs)
                if self.done:
                    rollout.engine.shutdown()

            supervisor.start = start_dead

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.at_step and not self.done:
            if self.sigterm:
                os.kill(os.getpid(), signal.SIGTERM)
            self.rollout.engine.shutdown()
            self.done = True


class Ballast(L.Callback):
    """Makes every checkpoint ``megabytes`` larger, so that writing one takes a while (to be killed)."""

    def __init__(self, megabytes: int) -> None:
        self.megabytes = megabytes

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        checkpoint["ballast"] = torch.ones(self.megabytes * 2**18)  # float32: 4 bytes each


class SigtermWhileLogging(Logger):
    """A logger that sends this process a SIGTERM while the metrics of step ``at_step`` are logged:
    after every callback's ``on_train_batch_end`` (the checkpoint callback's included) and before
    the loop looks for a signal, the gap in which a pre-emption finds the step done but unsaved."""

    def __init__(self, at_step: int) -> None:
        super().__init__()
        self.at_step = at_step

    @property
    def name(self) -> str:
        return "sigterm"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        # During training step N Lightning logs with step = the N - 1 batches stepped before it.
        if step is not None and step + 1 == self.at_step and "train/loss" in metrics:
            os.kill(os.getpid(), signal.SIGTERM)


class SigtermInValidation(L.Callback):
    """Sends this process a SIGTERM after the first validation batch, as a scheduler would. It
    refuses to where nothing handles SIGTERM (Lightning registers its handler only for a run in
    the main thread), which would end the whole test process."""

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            raise AssertionError("no SIGTERM handler is installed: the signal would kill this process")
        os.kill(os.getpid(), signal.SIGTERM)
