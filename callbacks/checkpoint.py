"""Checkpoints that live in the run folder, so ``--ckpt_path last`` finds them on the next run."""

from __future__ import annotations

import os
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose default folder is ``<trainer.default_root_dir>/checkpoints``.

    Lightning's default folder follows the first logger's run id or version, which changes on
    every run, so ``--ckpt_path last`` would not find the previous run's ``last.ckpt``. All
    arguments are those of ``ModelCheckpoint``; ``save_last`` defaults to True here.
    """

    def __init__(self, *args: Any, save_last: bool | None = True, **kwargs: Any) -> None:
        super().__init__(*args, save_last=save_last, **kwargs)

    def _use_run_folder(self, trainer: L.Trainer) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.realpath(os.path.join(trainer.default_root_dir, "checkpoints"))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._use_run_folder(trainer)
        super().setup(trainer, pl_module, stage)

    def _find_last_checkpoints(self, trainer: L.Trainer) -> set[str]:
        self._use_run_folder(trainer)
        return super()._find_last_checkpoints(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Training that stops on max_steps inside a (streaming, endless) epoch would otherwise end
        # without a last.ckpt unless the step count happened to hit `every_n_train_steps`.
        if self.save_last and trainer.global_step != self._last_global_step_saved:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        super().on_train_end(trainer, pl_module)
