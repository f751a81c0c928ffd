"""Checkpoints that live in the run folder, carry every RNG state, and are written on pre-emption.

``--ckpt_path last`` finds the previous run's ``last.ckpt`` in ``<default_root_dir>/checkpoints``.
A checkpoint holds what an exact continuation needs: weights, optimizer and schedule, the
global step (Lightning), the data stream position (the datamodule's state), and here the
Python, NumPy and torch RNG states of every rank. Local checkpoints are written by
:class:`AtomicCheckpointIO`, a checkpoint plugin (``lvrl fit`` adds it to the trainer's
``plugins`` unless the config names its own, :func:`with_atomic_checkpoint_io`): to a
temporary file next to the target, synced, then renamed over it, so a crash while saving
leaves the previous checkpoint intact. (Lightning's own writer stages the file in the system
temp folder and moves it; across file systems that move is a copy, which a crash can leave
half-written.)

On SIGTERM (a pre-empted job) or a first Ctrl-C, training stops at the end of the current step
with a ``last.ckpt`` of that step; a second Ctrl-C interrupts at once (one that comes within
``SAME_CTRL_C_WITHIN_S`` of the first is taken for the same: torchrun forwards a terminal's
Ctrl-C to ranks that got it already). SIGTERM is Lightning's
(its handler sets ``trainer.received_sigterm`` and the loop raises ``SIGTERMException``; the
checkpoint is written at the end of the step, or, in a one-process run, when the exception is
raised if the signal came after that); a Ctrl-C is recorded here and stops through the public
``trainer.should_stop``, after which Lightning runs the validation an early stop calls for (the
checkpoint is written before it, so a second Ctrl-C during it loses nothing) and ``lvrl fit``
exits with status 143 as on SIGTERM.
Training that stops with a :class:`~core.failures.SafeStop` (non-finite updates, a rollout
engine that cannot be restarted, a rollout that failed after a SIGTERM) also leaves a
``last.ckpt``; when the step under way had not trained on its batch
(:class:`~core.failures.StepNotTaken`), that batch is saved as not read, so that the resumed run
trains on it: the data position written is the one at the end of the last finished step.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import CheckpointIO, TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from core.failures import SafeStop, StepNotTaken
from core.rng import rng_states, set_rng_states
from parallel.collectives import gather_from_all_ranks

SAME_CTRL_C_WITHIN_S = 2.0
"""A second SIGINT this soon after the first is the same Ctrl-C, forwarded by a launcher."""

PARTIAL_MARKER = ".partial-"
"""Infix of checkpoint files being written (``last.ckpt.partial-<pid>``); never a ``.ckpt``."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes local checkpoints to ``<path>.partial-<pid>``, fsyncs, and renames over ``<path>``.

    Remote paths (``s3://``, ...) go to Lightning's writer unchanged.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        target = str(path)
        if "://" in target and not target.startswith("file://"):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        target = target.removeprefix("file://")
        folder = os.path.dirname(os.path.abspath(target))
        os.makedirs(folder, exist_ok=True)
        partial = f"{target}{PARTIAL_MARKER}{os.getpid()}"
        try:
            with open(partial, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        # The rename itself must reach the disk before the previous checkpoint is relied on.
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def with_atomic_checkpoint_io(plugins: Any, strategy: Any = None) -> Any:
    """The trainer's ``plugins`` with an :class:`AtomicCheckpointIO` added, unless the run chose
    its own checkpoint writer (a ``CheckpointIO`` plugin, or a strategy instance built with one).

    ``plugins`` as the ``Trainer`` takes it: None, one plugin (or its name), or a list. A
    strategy *instance* carries the writer itself (Lightning refuses one given both there and as
    a plugin), so it gets the atomic writer through its public ``checkpoint_io`` instead.
    """
    given = [] if plugins is None else list(plugins) if isinstance(plugins, list | tuple) else [plugins]
    if any(isinstance(plugin, CheckpointIO) for plugin in given):
        return plugins
    if isinstance(strategy, Strategy):
        if type(strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default writer
            strategy.checkpoint_io = AtomicCheckpointIO()
        return plugins
    return [*given, AtomicCheckpointIO()]


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` in ``<default_root_dir>/checkpoints``, with RNG states and pre-emption saves.

    Lightning's default folder follows the first logger's run id or version, which changes on
    every run, so ``--ckpt_path last`` would not find the previous run's ``last.ckpt``. All
    arguments are those of ``ModelCheckpoint``; ``save_last`` defaults to True here.
    """

    def __init__(self, *args: Any, save_last: bool | None = True, **kwargs: Any) -> None:
        super().__init__(*args, save_last=save_last, **kwargs)
        self._previous_sigint: Any = None
        self.interrupt_requested = False
        """A first Ctrl-C arrived on this rank: stop at the end of the step, with a checkpoint."""
        self.interrupted = False
        """Training was stopped for a Ctrl-C (on any rank): the run is to be resumed, not finished."""

    def _use_run_folder(self, trainer: L.Trainer) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.realpath(os.path.join(trainer.default_root_dir, "checkpoints"))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._use_run_folder(trainer)
        if trainer.is_global_zero and self.dirpath and os.path.isdir(self.dirpath):
            for name in os.listdir(self.dirpath):  # left by a run killed while saving
                if PARTIAL_MARKER in name:
                    path = os.path.join(self.dirpath, name)
                    # (a sharded checkpoint is a folder: parallel.strategy writes it partial too)
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
        super().setup(trainer, pl_module, stage)

    def _find_last_checkpoints(self, trainer: L.Trainer) -> set[str]:
        # Protected (no public hook runs before `--ckpt_path last` is resolved, and the folder
        # depends on the trainer's default_root_dir): tests/unit/test_lightning_internals.py.
        self._use_run_folder(trainer)
        return super()._find_last_checkpoints(trainer)

    # -- RNG states --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        # Called on every rank when a checkpoint is written; rank 0 writes the file, so the
        # ranks' states are gathered into it.
        return {**super().state_dict(), "rng_states": gather_from_all_ranks(rng_states())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        states = state.pop("rng_states", None)
        super().load_state_dict(state)
        if states:
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            set_rng_states(states[rank] if rank < len(states) else states[0])

    # -- pre-emption -------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.interrupt_requested = self.interrupted = False
        self._first_sigint_at: float | None = None
        self._finished_step_data: Any = None
        try:
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread (signals cannot be handled here)
            self._previous_sigint = None

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        # The first Ctrl-C asks for a clean stop (a checkpoint at the end of the step), like
        # SIGTERM; a second one interrupts at once. torchrun forwards the terminal's Ctrl-C to
        # ranks that have it already, a moment later: one within SAME_CTRL_C_WITHIN_S is that one.
        now = time.monotonic()
        if self._first_sigint_at is None:
            self._first_sigint_at = now
            rank_zero_info("interrupt: stopping after this step with a checkpoint (Ctrl-C again to abort)")
            self.interrupt_requested = True
        elif now - self._first_sigint_at > SAME_CTRL_C_WITHIN_S:
            previous = self._previous_sigint or signal.default_int_handler
            signal.signal(signal.SIGINT, previous)
            if callable(previous):
                previous(signum, frame)  # Python's own raises KeyboardInterrupt here
            else:
                signal.raise_signal(signal.SIGINT)

    def _interrupted(self, trainer: L.Trainer) -> bool:
        # Every rank must stop after the same step: one Ctrl-C on any rank stops them all.
        if trainer.world_size == 1:
            return self.interrupt_requested
        return trainer.strategy.reduce_boolean_decision(self.interrupt_requested, all=False)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._remember_data_position(trainer)
        # On SIGTERM Lightning's handler sets `received_sigterm` and the loop stops after this
        # hook; a Ctrl-C asks the loop to stop after it too. Either way, with this step's checkpoint.
        interrupted = not self.interrupted and self._interrupted(trainer)
        if not (trainer.received_sigterm or interrupted):
            return
        if self._last_unsaved(trainer):
            rank_zero_info(f"pre-empted: saving the checkpoint of step {trainer.global_step}")
            self._save_last_now(trainer)
        if interrupted:
            self.interrupted = True
            trainer.should_stop = True  # (Lightning says so when trainer.min_steps/min_epochs forbid it)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # Stopped between two steps (non-finite updates, a rollout engine that cannot be
        # restarted): the state is consistent, so keep it.
        stopped_safely = isinstance(exception, SafeStop) and trainer.state.fn == "fit"
        # A SIGTERM that arrives after this callback's `on_train_batch_end` but before the loop
        # looks at `received_sigterm` (logging, validation, the epoch's end) stops the run with
        # that step finished and unsaved: save it now, as Lightning's own end-of-step saves do.
        # One process only: several ranks need not all be stopping here, and a save gathers
        # from every rank.
        stopped_by_sigterm = (
            isinstance(exception, SIGTERMException) and trainer.state.fn == "fit" and trainer.world_size == 1
        )
        unsaved = self._last_unsaved(trainer)
        if isinstance(exception, StepNotTaken) and stopped_safely and self._finished_step_data is not None:
            trainer.datamodule.rewind_training_position(self._finished_step_data)
        if (stopped_safely or stopped_by_sigterm) and unsaved:
            rank_zero_info(f"saving the checkpoint of step {trainer.global_step} before stopping")
            self._save_last_now(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._remember_data_position(trainer)

    def _remember_data_position(self, trainer: L.Trainer) -> None:
        # Where the stream stood when the last step finished (a datamodule that can rewind).
        if callable(getattr(trainer.datamodule, "training_position", None)):
            self._finished_step_data = trainer.datamodule.training_position()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
        super().teardown(trainer, pl_module, stage)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Training that stops on max_steps inside a (streaming, endless) epoch would otherwise end
        # without a last.ckpt unless the step count happened to hit `every_n_train_steps`.
        if self._last_unsaved(trainer):
            self._save_last_now(trainer)
        super().on_train_end(trainer, pl_module)

    # -- ModelCheckpoint's protected members, used here and in _find_last_checkpoints only -----
    # Lightning 2.6 has no public way to write `last.ckpt` outside ModelCheckpoint's own schedule
    # with its bookkeeping (last_model_path, the link, the previous last removed), nor to ask
    # whether this step is saved already; tests/unit/test_lightning_internals.py fails loudly
    # when an upgrade renames or changes them.
    def _last_unsaved(self, trainer: L.Trainer) -> bool:
        return bool(self.save_last) and trainer.global_step != self._last_global_step_saved

    def _save_last_now(self, trainer: L.Trainer) -> None:
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
