"""Every ``lvrl`` command ends when its work ends, and takes every process it started with it.

Each entry point runs as a real command in a session of its own, with the processes the
configs give it (one dataloader worker forked by its fork server, the in-process vLLM engine, two
rendering or probing processes for the data tools, two ranks under torchrun): to its natural end,
and stopped mid-step by a SIGTERM to its process group (a scheduler, ``timeout``,
``kill -- -PGID``) and by a Ctrl-C (SIGINT to the foreground group, as a terminal sends it).
The trainer stops at the end of the step with a checkpoint, the data tools at once; either exits
with status 143 and a line saying so, without a traceback (under torchrun, both ranks do, and
torchrun reports the signal with its own status, 1). A trainer killed outright (SIGKILL) runs no
clean-up at all: its workers and their fork server must still end with it.

Cases run elsewhere, with the same checks (:func:`helpers.process_tree.run_to_its_end`), are not
run twice: the natural end of ``lvrl fit`` (SFT, and GRPO with vLLM) and ``lvrl validate`` with the
demo configs is the demo script's test (``tests/e2e/test_demo_script.py``: each command stops
inside its pass, as here, and every process must be gone when the script has ended); a SIGTERM to
the group of ``lvrl fit`` (SFT, and GRPO with vLLM) and a SIGKILL to the SFT trainer are the
stopped runs of ``tests/e2e/test_resume.py``, which then resume them exactly; the natural end of
two ranks under one torchrun is the reference run of ``tests/e2e/test_sharded_resume.py``. A
Ctrl-C to ``lvrl fit`` is tried on the GRPO config, whose processes (workers, their fork server,
the engine) include all of the SFT config's. The bounds are
:data:`helpers.process_tree.EXIT_WITHIN` and :data:`~helpers.process_tree.TREE_WITHIN`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers.cli import PROBES_ENV, REPO_ROOT, free_port, run_lvrl
from helpers.process_tree import (
    EXIT_WITHIN,
    STOPPED_BY_SIGNAL,
    TREE_WITHIN,
    EndedCommand,
    assert_stopped_with_a_checkpoint,
    run_to_its_end,
)
from helpers.rollout_settings import tiny_rollout_settings

TORCHRUN_SIGNALLED = 1  # torchrun's own status when a signal stops it (SignalException)

NATURAL, TERM_GROUP, TERM_TRAINER, CTRL_C = (
    "natural end",
    "SIGTERM to the group",
    "SIGTERM to the trainer",
    "Ctrl-C",
)
SIGNALS = {
    TERM_GROUP: (signal.SIGTERM, True),
    TERM_TRAINER: (signal.SIGTERM, False),
    CTRL_C: (signal.SIGINT, True),
}

ENV = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **PROBES_ENV}
LVRL = [sys.executable, "-m", "app"]


def run(
    command: list[str], scenario: str, tmp_path: Path, cue: Callable[[], bool] | None = None
) -> EndedCommand:
    sig, to_group = SIGNALS.get(scenario, (None, True))
    return run_to_its_end(
        command,
        cwd=REPO_ROOT,
        env=ENV,
        output_dir=tmp_path / "output",
        exit_within=EXIT_WITHIN,
        tree_within=TREE_WITHIN,
        send=sig,
        when=cue if sig is not None else None,
        to_group=to_group,
    )


# -- the trainer: lvrl fit (SFT, GRPO with vLLM), lvrl validate, torchrun ---------------------------
def trainer_config(source: str, tmp_path: Path, synth_dir: Path, model_dir: Path, cue: Path | None) -> Path:
    """``source`` made tiny (3 steps of 2 samples of 8 frames, validation on one batch at the end)
    with its own data workers and engine; with a ``cue`` file, a probe holds step 2 (or
    evaluation batch 2) open until a signal comes."""
    config = (
        tiny_rollout_settings(source)
        if "grpo" in source
        else yaml.safe_load((REPO_ROOT / source).read_text())
    )
    trainer = config["trainer"]
    trainer.update(
        default_root_dir=str(tmp_path / "run"), max_steps=3, val_check_interval=3, limit_val_batches=1
    )
    if cue is not None:
        trainer["callbacks"].append(
            {
                "class_path": "helpers.exit_probe.HoldStepUntilSignalled",
                "init_args": {"cue_file": str(cue), "at_step": 2},
            }
        )
    config["model"]["init_args"]["model_path"] = str(model_dir)
    config["data"]["init_args"].update(
        train_shards=str(synth_dir / "train-*.tar"),
        val_shards=str(synth_dir / "val-*.tar"),
        num_frames=8,
        batch_size=2,
        val_batch_size=2,
    )
    assert config["data"]["init_args"]["num_workers"] >= 1, "the configs read their data with workers"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("scenario", [TERM_TRAINER])
def test_lvrl_fit_sft(scenario: str, tmp_path: Path, synth_dir: Path, tiny_model_dir: Path) -> None:
    cue = tmp_path / "cue"
    config = trainer_config("configs/demo/sft.yaml", tmp_path, synth_dir, tiny_model_dir, cue)
    ended = run([*LVRL, "fit", "--config", str(config)], scenario, tmp_path, cue.exists)
    assert_stopped_with_a_checkpoint(ended, tmp_path / "run")


@pytest.mark.parametrize("scenario", [CTRL_C])
def test_lvrl_fit_grpo_with_vllm(
    scenario: str, tmp_path: Path, synth_dir: Path, tiny_model_dir: Path
) -> None:
    cue = tmp_path / "cue"
    config = trainer_config("configs/demo/grpo.yaml", tmp_path, synth_dir, tiny_model_dir, cue)
    ended = run([*LVRL, "fit", "--config", str(config)], scenario, tmp_path, cue.exists)
    assert_stopped_with_a_checkpoint(ended, tmp_path / "run")


@pytest.mark.parametrize("scenario", [TERM_GROUP, CTRL_C])
def test_lvrl_validate(scenario: str, tmp_path: Path, synth_dir: Path, tiny_model_dir: Path) -> None:
    cue = tmp_path / "cue"
    config = trainer_config("configs/demo/sft.yaml", tmp_path, synth_dir, tiny_model_dir, cue)
    command = [*LVRL, "validate", "--config", str(config), "--trainer.limit_val_batches", "3"]
    ended = run(command, scenario, tmp_path, cue.exists)
    assert ended.returncode == STOPPED_BY_SIGNAL, ended.tail()
    assert "lvrl validate did not finish and saved nothing to continue from" in ended.stderr, ended.tail()
    assert "Traceback" not in ended.stderr, ended.tail()


@pytest.mark.parametrize("scenario", [TERM_GROUP, CTRL_C])
def test_torchrun_two_processes(scenario: str, tmp_path: Path, synth_dir: Path, tiny_model_dir: Path) -> None:
    cue = tmp_path / "cue"
    config = trainer_config("configs/demo/sft.yaml", tmp_path, synth_dir, tiny_model_dir, cue)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    # lvrl's own strategy, as its multi-process configs run: the model sharded over both ranks
    # (FSDP2), the checkpoint a distributed one (a folder, a shard per rank).
    command = [
        torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "app", "fit", "--config", str(config), "--trainer.devices", "2",
        "--trainer.strategy", "parallel.strategy.SequenceParallelStrategy",
        "--trainer.strategy.sequence_parallel_size", "1",
        "--trainer.strategy.process_group_backend", "gloo",
    ]  # fmt: skip
    ended = run(command, scenario, tmp_path, cue.exists)
    # torchrun reports the signal itself (its traceback, status 1), after both ranks stopped at
    # the end of the step, the checkpoint written, each saying so.
    assert ended.returncode == TORCHRUN_SIGNALLED, ended.tail()
    assert ended.stderr.count("continue with --ckpt_path last") == 2, ended.tail()
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_dir()


# -- the data tools: lvrl data synth, lvrl data build ------------------------------------------------
# A signalled command must still be at work when its first shard of 8 appears (it stops there, so
# its count costs nothing); one left to its natural end needs only a few shards from each worker.
SIGNALLED_SAMPLES = 400
NATURAL_END_SAMPLES = 40
RELEASED_SAMPLES = 200


def first_shard(out: Path) -> Callable[[], bool]:
    return lambda: any(out.glob("*.tar"))


def assert_tool_ended(ended: EndedCommand, scenario: str, command: str) -> None:
    if scenario == NATURAL:
        assert ended.returncode == 0, ended.tail()
    else:
        assert ended.returncode == STOPPED_BY_SIGNAL, ended.tail()
        assert f"{command}: stopped by SIG" in ended.stderr, ended.tail()
    assert "Traceback" not in ended.stderr, ended.tail()


@pytest.mark.parametrize("scenario", [NATURAL, TERM_GROUP, CTRL_C])
def test_lvrl_data_synth(scenario: str, tmp_path: Path) -> None:
    out = tmp_path / "synth"
    count = str(NATURAL_END_SAMPLES if scenario == NATURAL else SIGNALLED_SAMPLES)
    command = [*LVRL, "data", "synth", "--out", str(out), "--num-train", count, "--num-val", "0"]
    command += ["--num-test", "0", "--samples-per-shard", "8", "--workers", "2"]
    ended = run(command, scenario, tmp_path, first_shard(out))
    assert_tool_ended(ended, scenario, "lvrl data synth")
    if scenario == NATURAL:
        assert (out / "dataset.json").is_file()


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic task in the released LongVideo-Reason layout: train.jsonl and its videos."""
    out = tmp_path_factory.mktemp("released")
    counts = ["--num-train", str(RELEASED_SAMPLES), "--num-val", "0", "--num-test", "0"]
    run_lvrl("data", "synth", "--released", "--out", str(out), *counts)
    return out


@pytest.mark.parametrize("scenario", [NATURAL, TERM_GROUP, CTRL_C])
def test_lvrl_data_build(scenario: str, tmp_path: Path, released: Path) -> None:
    out = tmp_path / "shards"
    rows = (released / "train.jsonl").read_text().splitlines(keepends=True)
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(rows[:NATURAL_END_SAMPLES] if scenario == NATURAL else rows))
    command = [
        *LVRL, "data", "build", "--jsonl", str(jsonl),
        "--videos-root", str(released / "videos"), "--out", str(out),
        "--samples-per-shard", "8", "--workers", "2", "--no-progress",
    ]  # fmt: skip
    ended = run(command, scenario, tmp_path, first_shard(out))
    assert_tool_ended(ended, scenario, "lvrl data build")
    if scenario == NATURAL:
        assert (out / "dataset.json").is_file()
