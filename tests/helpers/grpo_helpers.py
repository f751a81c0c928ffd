"""In-process GRPO fits on the tiny model, for tests that watch a run through callbacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L


def fit_tiny_grpo(
    module: L.LightningModule,
    tiny_model_dir: Path,
    synth_dir: Path,
    tmp_path: Path,
    *,
    steps: int,
    callbacks: list[L.Callback],
    prompts_per_step: int = 2,
    **data_args: Any,
) -> L.Trainer:
    """``trainer.fit`` of ``module`` on the synthetic shards (8 frames, no workers, no logger);
    ``data_args``: more of the datamodule's arguments."""
    from datamodules.longvideo_reason import LongVideoReasonDataModule

    data = LongVideoReasonDataModule(
        train_shards=str(synth_dir / "train-*.tar"),
        processor_path=str(tiny_model_dir),
        num_frames=8,
        batch_size=prompts_per_step,
        num_workers=0,
        **data_args,
    )
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        callbacks=callbacks,
    )
    trainer.fit(module, datamodule=data)
    return trainer
