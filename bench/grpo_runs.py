"""Variants of the demo's GRPO run, side by side over seeds: what ``bench/mismatch.py`` and
``bench/agreement.py`` share (a config per run, the run as an ``lvrl`` subprocess, its CSV
metrics, a mean ± spread over seeds).

A run whose folder holds ``done`` is not run again, and one stopped part way resumes from its
last checkpoint, so an interrupted comparison continues where it stopped.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import itertools
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from app.commands.report import read_text
from bench.process_usage import Usage, run_counted
from evaluation.provenance import commit, provenance

REPO = Path(__file__).resolve().parent.parent
DEMO_GRPO = REPO / "configs/demo/grpo.yaml"
ATTEMPTS = "attempts.jsonl"


def demo_grpo_config(run_dir: Path, sft: str, data: str, seed: int, steps: int) -> dict[str, Any]:
    """The demo's GRPO config for one run: CSV metrics in ``run_dir``, ``seed`` for the rollouts'
    sampling (and ``seed_everything``), no validation during training. Every run reads the
    training prompts in the same order (the datamodule's own seed): seeds vary the sampling only,
    so two settings of one seed see the same prompts at every step."""
    config = yaml.safe_load(DEMO_GRPO.read_text())
    config["seed_everything"] = seed
    trainer = config["trainer"]
    trainer.update(default_root_dir=str(run_dir), max_steps=steps, limit_val_batches=0)
    trainer["logger"] = [training_csv_logger(run_dir)]
    rollout_callback(config)["init_args"]["seed"] = seed
    config["model"]["init_args"]["model_path"] = sft
    config["data"]["init_args"].update(train_shards=f"{data}/train-*.tar", val_shards=f"{data}/val-*.tar")
    return config


def training_csv_logger(run_dir: Path) -> dict[str, Any]:
    """CSV metrics in ``run_dir/csv/version_N``, a new N for each attempt: Lightning deletes the
    ``metrics.csv`` of a version folder a run reopens, so a pinned version would lose everything
    logged before a resume. :func:`column` reads a run's versions as one history."""
    init_args = {"save_dir": str(run_dir), "name": "csv"}
    return {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": init_args}


def rollout_callback(config: dict[str, Any]) -> dict[str, Any]:
    """The config's ``RolloutCallback`` entry (to change its ``init_args``)."""
    return next(c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("RolloutCallback"))


def run_lvrl(run_dir: Path, arguments: list[str], log_name: str = "run.log", append: bool = False) -> Usage:
    """``lvrl ARGUMENTS`` from the repository root, its output in ``run_dir/log_name``; returns
    what it used. Every attempt, finished or not, appends a line to ``run_dir/attempts.jsonl``:
    the lvrl command, the bench command, commit, machine and date (at its start), exit status, CPU and wall
    seconds (:mod:`bench.process_usage`), so a stage run over several attempts says which code
    ran each part and what the whole cost.

    A failed or stopped command ends the bench with a short message (the command, its exit status, the
    log's last line and where the log is) rather than a traceback of this process: a stage
    stopped with SIGTERM is the normal way to pause a bench, and the next start continues it.
    The bench waits for the command to stop (:func:`bench.process_usage.stops_wait_for`), so a
    SIGTERM to its whole process group records the stopped attempt too; one to the bench alone
    lets the command finish and ends the bench after it."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(REPO)}
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / log_name
    # The checkout when the command starts (not this bench's start, nor the command's end): the
    # code it imports is the checkout's at that moment, and commits made while it runs do not
    # change it.
    started = {**provenance(sys.argv), "commit": commit()}
    with log_path.open("a" if append else "w") as log:
        command = [sys.executable, "-m", "app", *arguments]
        usage = run_counted(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    record = {"lvrl": arguments, **started, **dataclasses.asdict(usage)}
    with (run_dir / ATTEMPTS).open("a") as attempts:
        attempts.write(json.dumps(record) + "\n")
    if usage.exit_status != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        subcommand = " ".join(itertools.takewhile(lambda word: not word.startswith("-"), arguments[:2]))
        sys.exit(
            f"lvrl {subcommand} stopped (exit status {usage.exit_status}): "
            f"{lines[-1] if lines else '(no output)'}\n"
            f"its output: {log_path}. If it was stopped, the same command continues (finished stages are "
            "skipped, a stopped training stage resumes from its last checkpoint)"
        )
    if usage.stop_requests:  # a signal to the bench alone: the command ran to its end
        sys.exit(
            f"stopped ({', '.join(usage.stop_requests)}) after the command under way finished: "
            f"{' '.join(arguments[:2])}; the same bench command continues"
        )
    return usage


def attempts(run_dir: Path) -> list[dict[str, Any]]:
    """The records :func:`run_lvrl` appended in ``run_dir``, oldest first."""
    path = run_dir / ATTEMPTS
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def fit_or_resume(run_dir: Path, continuing: Path | None = None) -> None:
    """``lvrl fit`` of ``run_dir/config.yaml``, continuing from the checkpoint an interrupted
    attempt left (stop a run with SIGTERM to its ``lvrl`` process: it finishes the step and
    writes ``last.ckpt``; the bench then stops too, and its next start resumes the run). A first
    attempt starts from ``continuing`` (another run's checkpoint) when given."""
    resume = (run_dir / "checkpoints" / "last.ckpt").exists()
    arguments = ["fit", "--config", str(run_dir / "config.yaml")]
    if resume:
        print(f"resuming {run_dir.name} from its last checkpoint", flush=True)
        arguments += ["--ckpt_path", "last"]
    elif continuing is not None:
        print(f"{run_dir.name} continues {continuing}", flush=True)
        arguments += ["--ckpt_path", str(continuing)]
    run_lvrl(run_dir, arguments, append=resume)


def fit_once(run_dir: Path, config: dict[str, Any], then: Callable[[Path], None] | None = None) -> Path:
    """Train ``config`` in ``run_dir`` unless done before (then ``then(run_dir)``, e.g. an
    evaluation); returns the run's CSV metrics folder (for :func:`column`)."""
    if not (run_dir / "done").exists():
        print(f"running {run_dir.name} ...", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(copy.deepcopy(config)))
        if not (run_dir / "provenance.json").exists():  # the attempt that started the run
            (run_dir / "provenance.json").write_text(json.dumps(provenance(sys.argv), indent=1) + "\n")
        fit_or_resume(run_dir)
        if then is not None:
            then(run_dir)
        (run_dir / "done").touch()
    return run_dir / "csv"


def evaluate(
    model_dir: Path | str, out: Path, data: str, splits: str = "{val,test}", samples: int | None = None
) -> Path:
    """``model_dir``'s greedy answer (and ``samples`` answers sampled at temperature 1; None: as
    ``configs/demo/sft.yaml`` says) to every question of ``data``'s ``splits`` (a brace list, as
    ``make demo`` evaluates); returns the CSV logger's folder, the answers are in
    ``out/predictions``. An evaluation that logged its accuracy is kept; one stopped before that
    runs again (into a new ``version_N``, which :func:`column` reads as the latest attempt)."""
    metrics = out / "csv"
    if not column(metrics, "val/accuracy"):
        arguments = {
            "--config": "configs/demo/sft.yaml",
            "--trainer.default_root_dir": str(out),
            "--trainer.limit_val_batches": "null",
            "--model.init_args.model_path": str(model_dir),
            "--data.init_args.train_shards": f"{data}/train-*.tar",
            "--data.init_args.val_shards": f"{data}/{splits}-*.tar",
        }
        if samples is not None:
            arguments["--model.init_args.val_samples"] = str(samples)
        run_lvrl(
            out,
            ["validate", *(part for pair in arguments.items() for part in pair)],
            log_name="eval.log",
        )
    return metrics


def column(metrics: Path, name: str) -> list[float]:
    """Every logged value of ``name``, in step order, from a ``metrics.csv`` or from a CSV logger's
    folder of ``version_N`` attempts (a run and its resumptions). A resumed attempt logs again the
    steps its predecessor logged after the checkpoint it resumed from; the later attempt's rows
    replace those steps."""
    if metrics.is_file():
        return [float(row[name]) for row in csv_rows(metrics) if row.get(name)]
    logs = [f for f in metrics.glob("version_*/metrics.csv*") if f.name in ("metrics.csv", "metrics.csv.gz")]
    versions = sorted(logs, key=lambda f: int(f.parent.name.split("_")[1]))
    kept: list[dict[str, str]] = []
    for attempt in reversed(versions):  # latest first: it owns every step it logged
        rows = csv_rows(attempt)
        owned = {row["step"] for row in kept}
        kept = [row for row in rows if row["step"] not in owned] + kept
    kept.sort(key=lambda row: int(row["step"]))  # stable: rows of one step keep their order
    return [float(row[name]) for row in kept if row.get(name)]


def csv_rows(metrics: Path) -> list[dict[str, str]]:
    """A CSV log's rows (``metrics.csv``, or gzipped as saved results keep it)."""
    return list(csv.DictReader(io.StringIO(read_text(metrics))))


def mean_and_spread(values: list[float], digits: int = 3) -> str:
    """``mean ± sample standard deviation`` over seeds (``-`` for none)."""
    values = [v for v in values if v == v]  # NaN: not logged in that run
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
