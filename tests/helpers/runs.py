"""Arguments of small runs on the tiny model, and what a finished run left behind (CSV metrics,
step records, checkpoint weights)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch


def tiny_data_args(train: str, val: str) -> list[str]:
    """Data overrides shared by the CLI tests: the given shards, 8 frames, batches of 2, no workers."""
    return [
        "--data.init_args.train_shards", train,
        "--data.init_args.val_shards", val,
        "--data.init_args.num_frames", "8",
        "--data.init_args.batch_size", "2",
        "--data.init_args.num_workers", "0",
    ]  # fmt: skip


def fit_args(run_dir: Path, model_dir: Path, train: str, val: str, max_steps: int) -> list[str]:
    """``lvrl fit`` of the SFT demo config made tiny: validation every 2 steps on one batch,
    8-token answers, a constant learning rate after a 4-step warm-up."""
    return [
        "fit",
        "--config",
        "configs/demo/sft.yaml",
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.max_steps",
        str(max_steps),
        "--trainer.val_check_interval",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.log_every_n_steps",
        "1",
        "--model.init_args.model_path",
        str(model_dir),
        "--model.init_args.max_new_tokens",
        "8",
        "--model.init_args.learning_rate",
        "1e-3",
        "--model.init_args.warmup_steps",
        "4",
        "--model.init_args.lr_schedule",
        "constant",
        *tiny_data_args(train, val),
    ]


def logged(run_dir: Path, metric: str) -> list[float]:
    """Values of a metric in the CSV logs of all runs in ``run_dir``, in run order."""
    values = []
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with path.open() as f:
            values += [float(row[metric]) for row in csv.DictReader(f) if row.get(metric)]
    return values


def steps_of(run_dir: Path) -> dict[int, dict]:
    """Per step, the last record :class:`helpers.resume_probe.StepRecorder` wrote for it (a resumed
    run re-does the steps after its checkpoint)."""
    records = {}
    for line in (run_dir / "steps.jsonl").read_text().splitlines():
        record = json.loads(line)
        records[record["step"]] = record
    return records


def weights_of(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model weights in the run's ``last.ckpt``."""
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)[
        "state_dict"
    ]
