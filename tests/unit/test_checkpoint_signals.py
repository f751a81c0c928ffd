"""RunCheckpoint's Ctrl-C stop, its save at a SIGTERM that comes after its end-of-step hook, and the
atomic checkpoint writer as a trainer plugin, in-process.

(`tests/e2e/test_resume.py` covers SIGTERM and SIGKILL through the CLI, with exact resumption.)
"""

from __future__ import annotations

import os
import signal

import lightning as L
import pytest
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, TensorDataset

from callbacks.checkpoint import AtomicCheckpointIO, RunCheckpoint, with_atomic_checkpoint_io


class TinyModule(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class CtrlCAfter(Callback):
    """Sends this process ``times`` SIGINTs, one after the other, at the end of training step
    ``step`` (a terminal's Ctrl-C; twice: torchrun forwarding it to a rank that got it already)."""

    def __init__(self, step: int, times: int = 1) -> None:
        self.step = step
        self.times = times

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)


def quiet_trainer(tmp_path, callbacks: list[Callback]) -> Trainer:
    """20 steps on the CPU with the atomic writer; no logger, progress bar or validation."""
    return Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_steps=20,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        plugins=with_atomic_checkpoint_io(None),
    )


def test_a_first_ctrl_c_stops_after_the_step_with_its_checkpoint(tmp_path) -> None:
    checkpoint = RunCheckpoint()
    trainer = quiet_trainer(tmp_path, [CtrlCAfter(3), checkpoint])
    before = signal.getsignal(signal.SIGINT)
    trainer.fit(TinyModule(), DataLoader(TensorDataset(torch.randn(80, 4)), batch_size=2))
    assert checkpoint.interrupted and trainer.global_step == 3  # no further step was taken
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 3
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C is the caller's again


def test_a_ctrl_c_forwarded_by_a_launcher_is_the_same_ctrl_c(tmp_path) -> None:
    # Two SIGINTs within SAME_CTRL_C_WITHIN_S: still the one clean stop with its checkpoint.
    checkpoint = RunCheckpoint()
    trainer = quiet_trainer(tmp_path, [CtrlCAfter(3, times=2), checkpoint])
    trainer.fit(TinyModule(), DataLoader(TensorDataset(torch.randn(80, 4)), batch_size=2))
    assert checkpoint.interrupted and trainer.global_step == 3
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3


def test_a_second_ctrl_c_after_the_window_aborts(tmp_path, monkeypatch) -> None:
    # The same two SIGINTs, the window shrunk to nothing: the second is a person's second Ctrl-C,
    # and Lightning's KeyboardInterrupt handling ends the run at once (exit status 1, which
    # `lvrl` turns into 143: app.lightning_cli).
    monkeypatch.setattr("callbacks.checkpoint.SAME_CTRL_C_WITHIN_S", 0.0)
    trainer = quiet_trainer(tmp_path, [CtrlCAfter(3, times=2), RunCheckpoint()])
    # Python's own Ctrl-C handling, as in a terminal (a pytest-xdist worker ignores SIGINT; the
    # second Ctrl-C goes to what was there before the run, so it would be ignored too).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as stopped:
            trainer.fit(TinyModule(), DataLoader(TensorDataset(torch.randn(80, 4)), batch_size=2))
    finally:
        signal.signal(signal.SIGINT, before)  # (Lightning leaves SIGINT ignored after an abort)
    assert stopped.value.code == 1 and isinstance(stopped.value.__context__, KeyboardInterrupt)
    assert trainer.global_step == 3


class TermedAfterTheCheckpointHook(TinyModule):
    """Sends this process a SIGTERM from its own ``on_train_batch_end`` at step ``step``: Lightning
    calls a module's hook after every callback's, so the checkpoint callback has already looked
    for a signal and found none (as when a pre-emption lands while the step's metrics are logged)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_after_the_checkpoint_hook_still_saves_that_step(tmp_path) -> None:
    trainer = quiet_trainer(tmp_path, [RunCheckpoint(every_n_train_steps=5)])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SIGTERMException):
        data = DataLoader(TensorDataset(torch.randn(80, 4)), batch_size=2)
        trainer.fit(TermedAfterTheCheckpointHook(3), data)
    assert trainer.global_step == 3  # no further step was taken
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 3  # not left without a checkpoint (none was due before step 5)
    assert signal.getsignal(signal.SIGTERM) is before


class OwnWriter(TorchCheckpointIO):
    """A checkpoint writer a run chose for itself."""


def test_the_atomic_writer_joins_the_plugins_unless_the_run_chose_a_writer() -> None:
    (added,) = with_atomic_checkpoint_io(None)
    assert isinstance(added, AtomicCheckpointIO)
    other = object()
    assert with_atomic_checkpoint_io(other)[0] is other
    assert isinstance(with_atomic_checkpoint_io([other])[1], AtomicCheckpointIO)
    own = TorchCheckpointIO()
    assert with_atomic_checkpoint_io([own]) == [own]
    chosen = OwnWriter()
    strategy = SingleDeviceStrategy("cpu", checkpoint_io=chosen)
    assert with_atomic_checkpoint_io(None, strategy) is None
    assert strategy.checkpoint_io is chosen  # the strategy's own writer stays
    # A strategy object without a writer of its own gets the atomic one itself: Lightning refuses
    # a writer given both by the strategy object and as a plugin.
    bare = SingleDeviceStrategy("cpu")
    plugins = with_atomic_checkpoint_io(None, bare)
    assert plugins is None and isinstance(bare.checkpoint_io, AtomicCheckpointIO)
    trainer = L.Trainer(strategy=bare, plugins=plugins, logger=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
