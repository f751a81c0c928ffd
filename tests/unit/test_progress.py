"""Progress lines when stdout is a file, and the step-labelled bar in a terminal: a real Trainer
fitting a tiny module in-process, its printed lines checked."""

from __future__ import annotations

import re

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

import callbacks.progress as progress
from callbacks.progress import ProgressLines, StepProgressBar, format_duration

DURATION = r"(\d+h \d\dm|\d+m \d\ds|\d+s)"


class TinyModule(LightningModule):
    """Logs the keys GRPO logs (loss, reward, rollout accuracy) on every step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train/loss", loss)
        self.log("reward/total_mean", 0.25 + 0.01 * self.global_step)
        self.log("rollout/accuracy", 0.5)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(batches: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(batches * 2, 4)), batch_size=2)


def _fit(tmp_path, callbacks, max_steps: int = 25) -> None:
    torch.manual_seed(0)
    trainer = Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_steps=max_steps,
        max_epochs=-1,
        limit_val_batches=3,
        val_check_interval=max_steps,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(TinyModule(), _loader(64), _loader(8))


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 42.4, 846, 7380, -3)] == ["0s", "42s", "14m 06s", "2h 03m", "0s"]


def test_lines_when_stdout_is_a_file(tmp_path, capsys) -> None:
    _fit(tmp_path, [ProgressLines(every_n_steps=10, every_n_seconds=1e9), StepProgressBar()])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("train step")]
    # every 10 steps and the last one; step/total, percent, the logged metrics, speed and time left
    assert [line.split()[2] for line in lines] == ["10/25", "20/25", "25/25"], out
    for line in lines:
        assert re.fullmatch(
            rf"train step \d+/25 \(\d+%\)  loss [-0-9.e]+  reward [0-9.]+  accuracy 0\.5  "
            rf"[0-9.]+ s/step  ETA {DURATION}",
            line,
        ), line
    assert lines[0].startswith("train step 10/25 (40%)") and "reward 0.34" in lines[0]
    assert lines[-1].startswith("train step 25/25 (100%)") and lines[-1].endswith("ETA 0s")
    assert re.search(r"^validate batch 3/3  [0-9.]+ s/batch  ETA 0s$", out, re.M), out
    assert re.search(rf"^validate done: 3 batches in {DURATION}$", out, re.M), out
    # the bar stays silent: stdout is not a terminal (capsys), and Lightning's default bar was replaced
    assert "Steps" not in out and "Epoch" not in out and "\r" not in out


def test_lines_every_n_seconds(tmp_path, capsys) -> None:
    _fit(tmp_path, [ProgressLines(every_n_steps=1000, every_n_seconds=0.0)], max_steps=5)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train step")]
    assert [line.split()[2] for line in lines] == ["1/5", "2/5", "3/5", "4/5", "5/5"]


def test_terminal_bar_counts_steps(tmp_path, capsys, monkeypatch) -> None:
    # As if stdout were a terminal: the tqdm bar draws, labelled by steps, and no lines are printed.
    monkeypatch.setattr(progress, "output_is_terminal", lambda: True)
    _fit(tmp_path, [ProgressLines(), StepProgressBar()], max_steps=12)
    captured = capsys.readouterr()
    screen = captured.out + captured.err
    assert "Steps: 100%" in screen and "12/12" in screen, screen[-2000:]
    assert "Epoch" not in screen and "/-2" not in screen
    assert "train step" not in screen


def test_rejects_zero_interval() -> None:
    with pytest.raises(ValueError, match="every_n_steps=0"):
        ProgressLines(every_n_steps=0)
