"""Log how many samples the data pipeline rejected, so data loss is visible in every run."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class SkippedSamplesMonitor(Callback):
    """Logs ``data/skipped_samples`` (cumulative, from the datamodule's counter) every training step."""

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        datamodule = trainer.datamodule
        skipped = getattr(datamodule, "skipped_samples", None)
        if skipped is not None:
            pl_module.log(
                "data/skipped_samples", float(skipped), reduce_fx="sum", sync_dist=True, batch_size=1
            )

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        skipped = getattr(trainer.datamodule, "skipped_samples", None)
        if skipped is not None and not trainer.sanity_checking:
            pl_module.log("data/skipped_samples_total", float(skipped), sync_dist=True)
