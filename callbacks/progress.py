"""Progress that reads well in a terminal and in a log file.

- :class:`StepProgressBar`: Lightning's tqdm bar in a terminal, counting optimizer steps out of
  ``trainer.max_steps`` when the run is bounded by steps (Lightning's own label reads
  ``Epoch 0/-2`` there: ``max_epochs=-1``); silent when stdout is not a terminal, where a bar
  is drawn only once, at the end.
- :class:`ProgressLines`: when stdout is not a terminal (``make demo > demo.log``), one plain line
  every ``every_n_steps`` steps or ``every_n_seconds`` seconds: step/total, the logged loss,
  reward and rollout accuracy, seconds per step and the time left; likewise for evaluation
  batches.

The configs under ``configs/`` list both: each covers the case the other leaves silent.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Literal

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only

DEFAULT_METRICS = {"loss": "train/loss", "reward": "reward/total_mean", "accuracy": "rollout/accuracy"}


def output_is_terminal() -> bool:
    return bool(getattr(sys.stdout, "isatty", None) and sys.stdout.isatty())


def step_bounded(trainer: Trainer) -> bool:
    """The run ends at ``max_steps`` (not after a number of epochs): count steps, not epochs."""
    return trainer.max_steps is not None and trainer.max_steps > 0 and trainer.max_epochs in (None, -1)


def format_duration(seconds: float) -> str:
    """``42s``, ``14m 06s``, ``2h 03m``."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, counting ``global_step`` out of ``max_steps`` in a step-bounded run
    (a resumed run starts at its step), and off when stdout is not a terminal."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if not output_is_terminal():
            self.disable()

    def on_train_epoch_start(self, trainer: Trainer, *args: Any) -> None:
        if not step_bounded(trainer):
            super().on_train_epoch_start(trainer, *args)
            return
        # One bar for the whole run (a step-bounded run has one endless epoch): steps done of max_steps.
        bar = self.train_progress_bar
        bar.set_description("Steps", refresh=False)
        bar.reset(total=trainer.max_steps)
        bar.n = bar.initial = trainer.global_step

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not step_bounded(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        bar = self.train_progress_bar
        if not bar.disable:
            bar.n = trainer.global_step  # GRPO's num_iterations makes several steps per batch
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # refreshes the bar


class ProgressLines(Callback):
    """One line of progress every ``every_n_steps`` optimizer steps (or every ``every_n_seconds``
    seconds, whichever comes first), on stdout, from global rank 0::

        train step 20/300 (7%)  loss 0.0123  reward 0.512  accuracy 0.438  2.91 s/step  ETA 13m 35s
        validate batch 10/25  0.84 s/batch  ETA 13s

    Args:
        every_n_steps: steps (and evaluation batches) between two lines.
        every_n_seconds: a line at least this often while steps or batches complete.
        when: ``redirected`` prints only when stdout is not a terminal (pair with
            :class:`StepProgressBar` for terminals); ``always`` prints in both cases.
        metrics: label -> logged metric key; shown when the key has been logged (the default
            shows ``train/loss``, GRPO's ``reward/total_mean`` and ``rollout/accuracy``).
    """

    def __init__(
        self,
        every_n_steps: int = 10,
        every_n_seconds: float = 60.0,
        when: Literal["redirected", "always"] = "redirected",
        metrics: dict[str, str] | None = None,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps}: must be at least 1")
        self.every_n_steps = every_n_steps
        self.every_n_seconds = every_n_seconds
        self.when = when
        self.metrics = dict(DEFAULT_METRICS if metrics is None else metrics)
        self.enabled = False
        self._train: _Window | None = None
        self._eval: _Window | None = None
        self._eval_loader = 0
        self._eval_batches = 0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.enabled = self.when == "always" or not output_is_terminal()

    @staticmethod
    @rank_zero_only
    def _print(line: str) -> None:
        print(line, file=sys.stdout, flush=True)  # flushed: a redirected stdout is block-buffered

    # -- training --------------------------------------------------------------------------------

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._train = _Window(trainer.global_step)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled or self._train is None:
            return
        total = _total_steps(trainer)
        line = self._train.advance(trainer.global_step, total, self.every_n_steps, self.every_n_seconds)
        if line is None:
            return
        done, per_unit, eta = line
        parts = [f"train step {done}" + (f"/{total} ({100 * done / total:.0f}%)" if total else "")]
        for label, key in self.metrics.items():
            value = trainer.callback_metrics.get(key)
            if value is not None:
                parts.append(f"{label} {float(value):.4g}")
        parts.append(f"{per_unit:.2f} s/step")
        if eta is not None:
            parts.append(f"ETA {format_duration(eta)}")
        self._print("  ".join(parts))

    # -- evaluation (validation inside fit, validate, test) ----------------------------------------

    def _eval_start(self, trainer: Trainer) -> None:
        self._eval = None if trainer.sanity_checking else _Window(0)
        self._eval_loader, self._eval_batches = 0, 0

    def _eval_batch_end(self, trainer: Trainer, name: str, totals: Any, batch_idx: int, loader: int) -> None:
        if self._eval is None:
            return
        self._eval_batches += 1
        if loader != self._eval_loader:  # the next evaluation of a sweep (val_num_frames)
            self._eval = _Window(0, started=self._eval.started)
            self._eval_loader = loader
        total = _loader_total(totals, loader)
        line = self._eval.advance(batch_idx + 1, total, self.every_n_steps, self.every_n_seconds)
        if not self.enabled or line is None:
            return
        done, per_unit, eta = line
        loaders = len(totals) if isinstance(totals, list) else 1
        text = f"{name} batch {done}" + (f"/{total}" if total else "")
        text += f" (loader {loader + 1}/{loaders})" if loaders > 1 else ""
        text += f"  {per_unit:.2f} s/batch"
        if eta is not None:
            text += f"  ETA {format_duration(eta)}"
        self._print(text)

    def _eval_end(self, trainer: Trainer, name: str) -> None:
        window, self._eval = self._eval, None
        if window is None:
            return
        elapsed = time.monotonic() - window.started
        if self._train is not None and trainer.state.fn == TrainerFn.FITTING:
            self._train.pause(elapsed)  # validation inside fit is not part of the seconds per step
        if self.enabled:
            batches = f"{self._eval_batches} batch{'es' * (self._eval_batches != 1)}"
            self._print(f"{name} done: {batches} in {format_duration(elapsed)}")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, "validate", trainer.num_val_batches, batch_idx, dataloader_idx)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_end(trainer, "validate")

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, "test", trainer.num_test_batches, batch_idx, dataloader_idx)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_end(trainer, "test")


class _Window:
    """Counts done units (steps or batches) and the time since the last printed line."""

    def __init__(self, start: int, started: float | None = None) -> None:
        now = time.monotonic()
        self.started = now if started is None else started
        self.done = start
        self.line_done = start  # units done at the last line
        self.line_time = now

    def pause(self, seconds: float) -> None:
        self.line_time += seconds

    def advance(
        self, done: int, total: int | None, every_n: int, every_s: float
    ) -> tuple[int, float, float | None] | None:
        """Record ``done`` units; a line ``(done, seconds per unit, seconds left)`` when one is due."""
        self.done = done
        now = time.monotonic()
        new = done - self.line_done
        finished = total is not None and done >= total
        due = done // every_n > self.line_done // every_n or now - self.line_time >= every_s or finished
        if new <= 0 or not due:
            return None
        per_unit = (now - self.line_time) / new
        self.line_done, self.line_time = done, now
        eta = per_unit * max(total - done, 0) if total is not None else None
        return done, per_unit, eta


def _total_steps(trainer: Trainer) -> int | None:
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return trainer.max_steps
    batches, epochs = trainer.num_training_batches, trainer.max_epochs
    if epochs is not None and epochs > 0 and math.isfinite(batches):
        return int(batches * epochs)
    return None


def _loader_total(totals: Any, loader: int) -> int | None:
    value = totals[loader] if isinstance(totals, list) and loader < len(totals) else totals
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
