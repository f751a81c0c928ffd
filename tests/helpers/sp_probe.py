"""A test callback for sequence-parallel runs: fixed advantages, and the first rollout saved.

Loaded as ``helpers.sp_probe.FixedAdvantagesAndRecord`` (``PYTHONPATH=tests``) after the
rollout callback. An untrained tiny model scores every completion 0, so advantages would be 0 and the loss
trivially equal everywhere; seeded random advantages (identical on every rank) give a loss
and gradients that depend on every log-prob.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch


class FixedAdvantagesAndRecord(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        rollout = pl_module.experience_of(batch)
        generator = torch.Generator().manual_seed(trainer.global_step)
        rollout.advantages = torch.randn(rollout.advantages.shape, generator=generator)
        if trainer.global_step == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            torch.save(rollout, self.out_dir / f"rollout0-rank{trainer.global_rank}.pt")
