"""Early stopping with a floor: a run trains at least ``after_step`` steps, then until its monitored
metric stops improving, by Lightning's own ``EarlyStopping`` rule counted from the first check at
or after the floor.

Why not ``Trainer(min_steps=...)`` with ``EarlyStopping``: Lightning keeps a stop signalled before
``min_steps`` and acts on it as soon as ``min_steps`` is reached, even when the metric has fallen
again since. A run whose loss flattens, then falls once a skill sets in late (the zoom task's
reading of the markers, docs/tool-use.md), would end at the floor, not at its plateau.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping


class DeferredEarlyStopping(EarlyStopping):
    """Lightning's ``EarlyStopping``, inert until ``trainer.global_step`` reaches ``after_step``."""

    def __init__(
        self,
        monitor: str,
        mode: str = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        after_step: int = 0,
    ) -> None:
        """``monitor``, ``mode``, ``patience`` and ``min_delta`` as Lightning's ``EarlyStopping``
        (a stop after ``patience`` checks in a row without an improvement of more than
        ``min_delta``); ``after_step``: the steps trained before any check counts, the first one
        counted setting the best so far."""
        if after_step < 0:
            raise ValueError(f"after_step must be 0 or more, not {after_step}")
        super().__init__(monitor=monitor, mode=mode, patience=patience, min_delta=min_delta)
        self.after_step = after_step

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step >= self.after_step:
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step >= self.after_step:
            super().on_validation_end(trainer, pl_module)
