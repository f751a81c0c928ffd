"""Export the trained weights as a Hugging Face directory: the input of the RL stage and of vLLM."""

from __future__ import annotations

import os

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from models.export import save_hf_model
from models.vlm_module import VLMModule


class HFExport(Callback):
    """Writes ``save_pretrained`` model + processor files when fitting ends.

    Under a sharding strategy (FSDP2) every rank joins the gather of the full weights and rank 0
    writes (:func:`models.export.save_hf_model`). A model with LoRA adapters is written merged,
    with the adapter alone in ``<dirpath>/adapter``.

    Args:
        dirpath: where to write; default ``<trainer.default_root_dir>/hf``.
        on_checkpoint: also refresh the export each time a checkpoint is saved.
    """

    def __init__(self, dirpath: str | None = None, on_checkpoint: bool = False) -> None:
        self.dirpath = dirpath
        self.on_checkpoint = on_checkpoint

    def _target(self, trainer: L.Trainer) -> str:
        return self.dirpath or os.path.join(trainer.default_root_dir, "hf")

    def _write(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str:
        # Every rank: gathering a sharded model is a collective; rank 0 writes.
        if not isinstance(pl_module, VLMModule):
            raise TypeError(f"HFExport needs a VLMModule, got {type(pl_module).__name__}")
        assert pl_module.model is not None
        return str(save_hf_model(pl_module.model, pl_module.processor, self._target(trainer)))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        out = self._write(trainer, pl_module)
        rank_zero_info(f"Exported Hugging Face model to {out} (step {trainer.global_step})")
        trainer.strategy.barrier("hf_export")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Called on every rank while a checkpoint is being saved.
        if self.on_checkpoint:
            self._write(trainer, pl_module)
