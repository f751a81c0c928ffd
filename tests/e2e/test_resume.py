"""Exact resume: a run killed (SIGKILL mid-step, SIGTERM) and resumed with `--ckpt_path last` continues as
if nothing happened: same samples in the same order, same per-step losses, same final weights.

"Same" is bit-for-bit: both runs execute on the same machine with the same thread count and
code, and the checkpoint restores weights, optimizer state, RNG states and the data position
exactly, so every later step repeats the same float operations in the same order (vLLM's
sampling included: same weights, prompts and seeds). Measured: 0 difference in all of the
~220 comparisons. A nonzero difference is a lost piece of state, not rounding.

Only the runs that are killed from outside are `lvrl fit` subprocesses (a signal or SIGKILL ends
a process); the uninterrupted reference runs, the resumed runs and the run that sends itself a
SIGTERM at a fixed point go through the same CLI in this process (:func:`helpers.cli.lvrl`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers.biased_models import save_biased_model
from helpers.cli import PROBES_ENV, REPO_ROOT, lvrl, run_lvrl
from helpers.probed_runs import grpo_config, sft_config, tool_grpo_config, with_refill_rounds
from helpers.process_tree import (
    EXIT_WITHIN,
    TREE_WITHIN,
    EndedCommand,
    assert_stopped_with_a_checkpoint,
    run_to_its_end,
)
from helpers.runs import steps_of, weights_of
from helpers.tolerances import assert_identical

MAX_STEPS = 6
CHECKPOINT_EVERY = 2
# The SFT runs read 2 of the 6 training shards: 8 samples, batches of 2 from one worker, an
# epoch of 4 steps.
SFT_SHARDS = "train-0000[01].tar"
STEPS_PER_EPOCH = 4


def recorded_sft_config(tmp_path: Path, run_dir: Path, synth_dir: Path, model_dir: Path) -> Path:
    return sft_config(
        tmp_path,
        run_dir,
        synth_dir,
        model_dir,
        max_steps=MAX_STEPS,
        checkpoint_every=CHECKPOINT_EVERY,
        train_shards=SFT_SHARDS,
    )


def start_fit(config: Path, stderr: int = subprocess.PIPE) -> subprocess.Popen:
    """`lvrl fit --config CONFIG` in the background (offline wandb, the test probes importable)."""
    return subprocess.Popen(
        [sys.executable, "-m", "app", "fit", "--config", str(config)],
        cwd=REPO_ROOT,
        env={**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **PROBES_ENV},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def run_until(
    config: Path, run_dir: Path, step: int, sig: int, *args: str, group: bool = False
) -> EndedCommand:
    """`lvrl fit ARGS` in a session of its own, sent ``sig`` once step ``step`` has finished; how
    it ended. Every process it started must be gone soon after (the checks and bounds of
    tests/e2e/test_exit_hygiene.py: this is its SIGTERM to the group and SIGKILL to the trainer).

    With ``group``, the signal goes to the run's whole process group, as a job scheduler, a
    shell's Ctrl-C or `timeout` send it: the data loader's workers get it too."""
    steps = run_dir / "steps.jsonl"

    def reached() -> bool:
        with contextlib.suppress(FileNotFoundError, ValueError):  # not written yet, or a line half-written
            return any(json.loads(x)["step"] >= step for x in steps.read_text().splitlines())
        return False

    return run_to_its_end(
        [sys.executable, "-m", "app", "fit", "--config", str(config), *args],
        cwd=REPO_ROOT,
        env={**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **PROBES_ENV},
        output_dir=run_dir.parent / f"{run_dir.name}-{signal.Signals(sig).name}-after-step-{step}",
        exit_within=EXIT_WITHIN,
        tree_within=TREE_WITHIN,
        send=sig,
        when=reached,
        to_group=group,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, synth_dir, tiny_model_dir) -> Path:
    tmp = tmp_path_factory.mktemp("resume")
    run_dir = tmp / "whole"
    run_lvrl("fit", "--config", str(recorded_sft_config(tmp, run_dir, synth_dir, tiny_model_dir)))
    return run_dir


def assert_same_run(run_dir: Path, reference: Path) -> None:
    got, expected = steps_of(run_dir), steps_of(reference)
    assert sorted(got) == sorted(expected) == list(range(1, MAX_STEPS + 1))
    for step in expected:
        assert got[step]["keys"] == expected[step]["keys"], f"step {step} trained on other samples"
        assert_identical(got[step]["loss"], expected[step]["loss"], reason=f"step {step} loss, resumed")
    ours, theirs = weights_of(run_dir), weights_of(reference)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert_identical(ours[name], theirs[name], reason=f"{name} weights, resumed")


def test_the_uninterrupted_run_crosses_an_epoch_boundary(uninterrupted):
    steps = steps_of(uninterrupted)
    first_epoch = [k for s in range(1, STEPS_PER_EPOCH + 1) for k in steps[s]["keys"]]
    assert len(first_epoch) == len(set(first_epoch)) == 8  # every sample once, then epoch 2
    assert set(steps[STEPS_PER_EPOCH + 1]["keys"]) <= set(first_epoch)


@pytest.mark.parametrize(
    ("sig", "after_step"),
    [
        (signal.SIGKILL, 5),  # resumes from step 4: at the epoch boundary
    ],
)
def test_a_killed_run_resumes_exactly(uninterrupted, tmp_path, synth_dir, tiny_model_dir, sig, after_step):
    run_dir = tmp_path / "killed"
    config = recorded_sft_config(tmp_path, run_dir, synth_dir, tiny_model_dir)
    ended = run_until(config, run_dir, after_step, sig)
    assert ended.returncode == (143 if sig == signal.SIGTERM else -signal.SIGKILL), ended.tail()
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    if sig == signal.SIGTERM:
        assert saved["global_step"] >= after_step  # saved at the signal, not at the last periodic save
    else:
        assert saved["global_step"] == after_step // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    run_lvrl("fit", "--config", str(config), "--ckpt_path", "last")
    assert_same_run(run_dir, uninterrupted)


def test_a_sigterm_to_the_whole_process_group_stops_after_the_step_and_resumes_exactly(
    uninterrupted, tmp_path, synth_dir, tiny_model_dir
):
    # A scheduler's pre-emption signals every process of the job: the data loader's worker
    # must not die with it (its death would raise in the trainer wherever it happens to be,
    # and the run would end with a traceback and no checkpoint of its last step).
    run_dir = tmp_path / "group"
    config = recorded_sft_config(tmp_path, run_dir, synth_dir, tiny_model_dir)
    assert_stopped_with_a_checkpoint(run_until(config, run_dir, 2, signal.SIGTERM, group=True), run_dir)
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] >= 2
    run_lvrl("fit", "--config", str(config), "--ckpt_path", "last")
    assert_same_run(run_dir, uninterrupted)


def test_a_sigterm_after_the_steps_checkpoint_hook_saves_that_step_and_resumes_exactly(
    uninterrupted, tmp_path, synth_dir, tiny_model_dir
):
    # In this process: the probe logger sends the SIGTERM at a fixed point of step 3 (no
    # periodic checkpoint is due), after the checkpoint callback's end-of-step hook.
    run_dir = tmp_path / "termed"
    config_path = recorded_sft_config(tmp_path, run_dir, synth_dir, tiny_model_dir)
    config = yaml.safe_load(config_path.read_text())
    config["trainer"]["logger"].append(
        {"class_path": "helpers.resume_probe.SigtermWhileLogging", "init_args": {"at_step": 3}}
    )
    config_path.write_text(yaml.safe_dump(config))
    stopped = lvrl("fit", "--config", str(config_path))
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == 3
    config["trainer"]["logger"].pop()
    config_path.write_text(yaml.safe_dump(config))
    run_lvrl("fit", "--config", str(config_path), "--ckpt_path", "last")
    assert_same_run(run_dir, uninterrupted)


GRPO_STEPS = 4
# The GRPO runs read 1 of the 6 training shards: 4 samples, an epoch of 2 steps.
GRPO_SHARDS = "train-00000.tar"


@pytest.fixture(scope="module")
def uninterrupted_grpo(tmp_path_factory, synth_dir, tiny_model_dir) -> Path:
    tmp = tmp_path_factory.mktemp("resume_grpo")
    run_dir = tmp / "whole"
    config = grpo_config(tmp, run_dir, synth_dir, tiny_model_dir, GRPO_STEPS, GRPO_SHARDS)
    run_lvrl("fit", "--config", str(config))
    return run_dir


def test_a_grpo_run_resumes_exactly(uninterrupted_grpo, tmp_path, synth_dir, tiny_model_dir):
    # vLLM rollouts seeded per step, weights re-synced to the engine on resume: the resumed run
    # samples the same completions (same engine log-probs), so losses and weights agree too.
    # One run, stopped three times, resumed each time: a SIGTERM to its process group after step 1
    # (a checkpoint of the step during which the signal came); then a SIGTERM that also fails the
    # rollout of step 2 (below); then a SIGKILL mid-step 4 (the step-2 checkpoint, at the epoch
    # boundary, is the latest); resumed again to the end.
    killed = tmp_path / "killed"
    config = grpo_config(tmp_path, killed, synth_dir, tiny_model_dir, GRPO_STEPS, GRPO_SHARDS)

    def saved_step() -> int:
        return torch.load(killed / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]

    assert_stopped_with_a_checkpoint(run_until(config, killed, 1, signal.SIGTERM, group=True), killed)
    assert 1 <= saved_step() <= 2

    # A scheduler's SIGTERM reaches the engine's processes too, and the rollout under way fails.
    # Restarting the engine could outlast the grace period before the SIGKILL: the run stops at
    # once with the last finished step saved (the batch of the failed one is read again), and
    # exits as a pre-empted run. (In this process: the probe sends it the SIGTERM.)
    failing = yaml.safe_load(config.read_text())
    failing["trainer"]["callbacks"][:0] = [
        {"class_path": "helpers.resume_probe.EngineKiller", "init_args": {"at_step": 2, "sigterm": True}}
    ]
    failing_config = tmp_path / "failing-rollout.yaml"
    failing_config.write_text(yaml.safe_dump(failing))
    stopped = lvrl("fit", "--config", str(failing_config), "--ckpt_path", "last")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "the rollout of step 2 failed after a stop signal" in stopped.stderr
    assert "restarting it" not in stopped.stdout + stopped.stderr
    assert saved_step() == 2

    ended = run_until(config, killed, 3, signal.SIGKILL, "--ckpt_path", "last")
    assert ended.returncode == -signal.SIGKILL, ended.tail()
    assert saved_step() == 2
    run_lvrl("fit", "--config", str(config), "--ckpt_path", "last")

    assert_same_grpo_run(killed, uninterrupted_grpo)


def assert_same_grpo_run(run_dir: Path, reference: Path) -> None:
    got, expected = steps_of(run_dir), steps_of(reference)
    assert sorted(got) == sorted(expected) == list(range(1, GRPO_STEPS + 1))
    assert {tuple(s) for s in expected[3]["stream"]} == {(1, 0, 0), (1, 0, 1)}  # step 3 opens epoch 2
    for step in expected:
        assert got[step]["keys"] == expected[step]["keys"], f"step {step} trained on other samples"
        for field in ("rollout_logprob_sum", "loss", "reward"):
            assert_identical(got[step][field], expected[step][field], reason=f"grpo step {step} {field}")
    ours, theirs = weights_of(run_dir), weights_of(reference)
    for name in theirs:
        assert_identical(ours[name], theirs[name], reason=f"grpo {name} weights, resumed")


def test_a_kill_while_a_checkpoint_is_written_leaves_the_previous_one(tmp_path, synth_dir, tiny_model_dir):
    run_dir = tmp_path / "run"
    config_path = recorded_sft_config(tmp_path, run_dir, synth_dir, tiny_model_dir)
    config = yaml.safe_load(config_path.read_text())
    config["trainer"]["callbacks"][0]["init_args"]["every_n_train_steps"] = 1
    config["trainer"]["callbacks"].append(
        {"class_path": "helpers.resume_probe.Ballast", "init_args": {"megabytes": 400}}
    )
    config_path.write_text(yaml.safe_dump(config))
    process = start_fit(config_path, stderr=subprocess.DEVNULL)
    folder = run_dir / "checkpoints"
    deadline = time.monotonic() + 300
    partial: list[Path] = []
    try:
        while time.monotonic() < deadline and process.poll() is None:
            partial = list(folder.glob("last.ckpt.partial-*")) if (folder / "last.ckpt").exists() else []
            if partial:
                process.kill()  # the step-1 checkpoint is complete, a later one is being written
                break
            time.sleep(0.005)
    finally:
        process.kill()
        process.wait()
    assert partial, "never saw a checkpoint being written"
    saved = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] >= 1 and saved["ballast"].numel() == 400 * 2**18
    # Resuming picks the complete checkpoint and clears the half-written file.
    run_lvrl(
        "fit",
        "--config",
        str(config_path),
        "--ckpt_path",
        "last",
        "--trainer.max_steps",
        str(saved["global_step"] + 1),
    )
    assert not list(folder.glob("*.partial-*"))
    assert (
        torch.load(folder / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
        == saved["global_step"] + 1
    )


def test_a_tool_use_grpo_run_with_refill_rounds_resumes_exactly(tmp_path, synth_dir, tiny_model_dir):
    # Episodes of a model that stops at a request about one token in five, sampled in up to two
    # rounds a step (dynamic sampling): the turns, the tool's replies, each round's seeds and the
    # engine's log-probs must all come out the same after a SIGKILL in step 3 and a resume from
    # the step-2 checkpoint. Dynamic sampling draws batches beyond the one Lightning fetched ahead,
    # so at that checkpoint the fetched batch is older than the newest one trained: it must be
    # read again on resume (and nothing drawn must be). Steps 2 to 4 need two rounds, step 1 one.
    model_dir = save_biased_model(tiny_model_dir, tmp_path / "asking", "</tool_call>", margin=0.0)

    def config(run_dir: Path) -> Path:
        return with_refill_rounds(tool_grpo_config(tmp_path, run_dir, synth_dir, model_dir, 4, "train-*.tar"))

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_lvrl("fit", "--config", str(config(whole)))
    expected = steps_of(whole)
    assert [expected[s]["rounds"] for s in range(1, 5)] == [1, 2, 2, 2]
    requests = [expected[s]["tool_requests"] for s in range(1, 5)]
    assert all(r is not None and r > 0 for r in requests) and len(set(requests)) > 1, requests
    killed_config = config(killed)
    ended = run_until(killed_config, killed, 3, signal.SIGKILL)
    assert ended.returncode == -signal.SIGKILL, ended.tail()
    saved = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 2
    stream = next(v for k, v in saved.items() if k.endswith("DataModule"))["ranks"][0]
    assert stream["read_again"], "the batch fetched ahead at the checkpoint was not older than a drawn one"
    run_lvrl("fit", "--config", str(killed_config), "--ckpt_path", "last")

    got = steps_of(killed)
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
    for step in expected:
        for field in ("keys", "trained_keys", "rounds"):
            assert got[step][field] == expected[step][field], f"step {step} {field}"
        for field in ("rollout_logprob_sum", "loss", "reward", "tool_requests"):
            assert_identical(got[step][field], expected[step][field], reason=f"tool-use step {step} {field}")
    ours, theirs = weights_of(killed), weights_of(whole)
    for name in theirs:
        assert_identical(ours[name], theirs[name], reason=f"tool-use {name} weights, resumed")
