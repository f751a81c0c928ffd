"""Export the trained weights as a Hugging Face directory: the input of the RL stage and of vLLM."""

from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from models.vlm_module import VLMModule


class HFExport(Callback):
    """Writes ``save_pretrained`` model + processor files when fitting ends.

    Args:
        dirpath: where to write; default ``<trainer.default_root_dir>/hf``.
        on_checkpoint: also refresh the export each time a checkpoint is saved.
    """

    def __init__(self, dirpath: str | None = None, on_checkpoint: bool = False) -> None:
        self.dirpath = dirpath
        self.on_checkpoint = on_checkpoint

    def _target(self, trainer: L.Trainer) -> str:
        return self.dirpath or os.path.join(trainer.default_root_dir, "hf")

    def _export(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not isinstance(pl_module, VLMModule):
            raise TypeError(f"HFExport needs a VLMModule, got {type(pl_module).__name__}")
        if trainer.is_global_zero:
            out = pl_module.export_hf(self._target(trainer))
            rank_zero_info(f"Exported Hugging Face model to {out} (step {trainer.global_step})")
        trainer.strategy.barrier("hf_export")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._export(trainer, pl_module)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if self.on_checkpoint and trainer.is_global_zero:
            pl_module.export_hf(self._target(trainer))  # type: ignore[attr-defined]
