"""A test callback recording what each training step did: its samples, loss and reward.

Loaded by ``lvrl fit`` subprocesses (``PYTHONPATH=tests``). Appends one JSON line per step to
``{out}`` (flushed and synced at once, so a run killed mid-step has recorded every finished
step): ``{"step", "keys", "stream", "epoch", "loss", "reward"}`` (``stream``: each sample's
(epoch, worker, position) in the data stream).
"""

from __future__ import annotations

import json
import os
from typing import Any

import lightning as L
import torch


class StepRecorder(L.Callback):
    def __init__(self, out: str) -> None:
        self.out = out
        self._keys: list[str] = []
        self._stream: list[list[int]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._keys = [m["key"] for m in batch["meta"]]
        self._stream = [list(m["stream"]) for m in batch["meta"]]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        metrics = trainer.callback_metrics
        loss = outputs["loss"] if isinstance(outputs, dict) and "loss" in outputs else outputs
        if loss is None:
            loss = metrics.get("train/loss")
        reward = metrics.get("reward/total_mean")
        record = {
            "step": trainer.global_step,
            "keys": self._keys,
            "stream": self._stream,
            "epoch": trainer.current_epoch,
            "loss": float(loss) if isinstance(loss, torch.Tensor | float) else None,
            "reward": float(reward) if reward is not None else None,
        }
        with open(self.out, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
