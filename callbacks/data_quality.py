"""Log how many samples the data pipeline rejected, so data loss is visible in every run."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from datamodules.stream import SKIP_REASONS


def _skip_counts(datamodule: Any) -> dict[str, float]:
    """Every skip reason's count (zeros too: each rank must log the same names when syncing)."""
    by_reason = getattr(datamodule, "skipped_by_reason", None)
    if by_reason is None:
        return {}
    return {f"data/skipped/{reason}": float(by_reason.get(reason, 0)) for reason in SKIP_REASONS}


class SkippedSamplesMonitor(Callback):
    """Logs ``data/skipped_samples`` (cumulative, from the datamodule's counter) every training step,
    and the count of each reason as ``data/skipped/<reason>``
    (:data:`datamodules.stream.SKIP_REASONS`)."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        datamodule = trainer.datamodule
        skipped = getattr(datamodule, "skipped_samples", None)
        if skipped is not None:
            pl_module.log(
                "data/skipped_samples", float(skipped), reduce_fx="sum", sync_dist=True, batch_size=1
            )
            for name, count in _skip_counts(datamodule).items():
                pl_module.log(name, count, reduce_fx="sum", sync_dist=True, batch_size=1)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        skipped = getattr(trainer.datamodule, "skipped_samples", None)
        if skipped is not None and not trainer.sanity_checking:
            pl_module.log("data/skipped_samples_total", float(skipped), sync_dist=True)
            for name, count in _skip_counts(trainer.datamodule).items():
                pl_module.log(name, count, sync_dist=True)
