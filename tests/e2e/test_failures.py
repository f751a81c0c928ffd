"""Fault isolation in GRPO runs: a crashed rollout engine is restarted once, non-finite updates are
skipped, and a run that cannot go on stops with a clear message and a usable checkpoint.

The runs go through the real CLI in this process (:func:`helpers.cli.lvrl`): what ends a run
here is an exception the CLI turns into an exit status, not the process dying."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from helpers.cli import run_lvrl_expecting_failure
from helpers.probed_runs import grpo_config
from helpers.runs import logged, steps_of


def with_probes(config_path: Path, before_rollout: list[dict], model_args: dict | None = None) -> Path:
    config = yaml.safe_load(config_path.read_text())
    config["trainer"]["callbacks"][:0] = before_rollout
    config["model"]["init_args"].update(model_args or {})
    config_path.write_text(yaml.safe_dump(config))
    return config_path


def advantages_probe(config_path: Path, **init_args: object) -> None:
    config = yaml.safe_load(config_path.read_text())
    for callback in config["trainer"]["callbacks"]:
        if callback["class_path"] == "helpers.resume_probe.SeededAdvantages":
            callback["init_args"] = init_args
    config_path.write_text(yaml.safe_dump(config))


def test_a_crashed_engine_is_restarted_a_nan_update_skipped_and_a_second_failure_stops_the_run(
    tmp_path, synth_dir, tiny_model_dir
):
    # Step 1: the engine crashes and is restarted; step 2: a NaN update is skipped; step 3: the
    # engine crashes and so does its restart, which stops the run with a checkpoint.
    run_dir = tmp_path / "run"
    config = grpo_config(tmp_path, run_dir, synth_dir, tiny_model_dir, max_steps=4)
    killers = [
        {"class_path": "helpers.resume_probe.EngineKiller", "init_args": {"at_step": 1}},
        {
            "class_path": "helpers.resume_probe.EngineKiller",
            "init_args": {"at_step": 3, "every_restart": True},
        },
    ]
    with_probes(config, killers)
    advantages_probe(config, nan_from_step=2, nan_times=1)
    result = run_lvrl_expecting_failure("fit", "--config", str(config))
    output = result.stdout + result.stderr
    assert result.returncode == 1, result.stderr[-3000:]
    assert "step 1: the rollout engine failed" in output and "restarting it" in output
    assert "step 2: non-finite loss, update skipped (1 in a row, 1 in all" in output
    assert "training stopped: the rollout engine failed again after a restart at step 3" in result.stderr
    assert "continue with --ckpt_path last" in result.stderr
    # Three updates were applied from four batches (the NaN one was skipped), with one restart.
    assert sorted(steps_of(run_dir)) == [1, 2, 3]
    assert logged(run_dir, "rollout/engine_restarts")[-1] == 1.0
    assert logged(run_dir, "train/nonfinite_skipped")[-1] == 1.0
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 3


def test_consecutive_nan_updates_stop_the_run_with_the_last_good_weights(tmp_path, synth_dir, tiny_model_dir):
    run_dir = tmp_path / "run"
    config = grpo_config(tmp_path, run_dir, synth_dir, tiny_model_dir, max_steps=6)
    with_probes(config, [], {"max_consecutive_nonfinite": 2})
    advantages_probe(config, nan_from_step=2)
    result = run_lvrl_expecting_failure("fit", "--config", str(config))
    assert "training stopped: 2 consecutive updates had a non-finite loss" in result.stderr
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 2
    assert all(torch.isfinite(t).all() for t in saved["state_dict"].values())
