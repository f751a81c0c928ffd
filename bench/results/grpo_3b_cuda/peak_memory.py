"""Per-step CUDA memory for the device check (README.md): the rollout's peak, the training
part's peak (scoring, backward, optimizer step) and what is held between steps, from
``torch.cuda.max_memory_allocated`` reset at each step's start and again after the rollout."""

from typing import Any

import lightning as L
import torch

GIB = 2**30


def report(message: str) -> None:
    print(f"[memory] {message}", flush=True)


class StepPeakMemory(L.Callback):
    """Listed before the rollout callback: its reset comes before the rollout."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if torch.cuda.is_available():
            peak = torch.cuda.memory_stats()["allocated_bytes.all.peak"] / GIB
            report(
                f"before the first step: allocated {torch.cuda.memory_allocated() / GIB:.2f} GiB, "
                f"peak so far {peak:.2f} GiB, reserved {torch.cuda.memory_reserved() / GIB:.2f} GiB"
            )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / GIB
            reserved = torch.cuda.max_memory_reserved() / GIB
            held = torch.cuda.memory_allocated() / GIB
            report(
                f"step {trainer.global_step} training (scoring, backward, optimizer): peak allocated "
                f"{peak:.2f} GiB, peak reserved {reserved:.2f} GiB, held after the step {held:.2f} GiB"
            )
            values = {
                "cuda/peak_allocated_gib": peak,
                "cuda/peak_reserved_gib": reserved,
                "cuda/held_gib": held,
            }
            pl_module.log_dict(values, batch_size=1)


class RolloutPeak(L.Callback):
    """Listed after the rollout callback: the peak since the step began is the rollout's; then a
    fresh count for the training part of the step."""

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / GIB
            report(f"step {trainer.global_step + 1} rollout: peak allocated {peak:.2f} GiB")
            pl_module.log("cuda/rollout_peak_allocated_gib", peak, batch_size=1)
            torch.cuda.reset_peak_memory_stats()
