"""Sharded checkpoints: a 2-process sharded GRPO run killed with SIGKILL mid-step resumes exactly,
and its HF export loads in transformers with the run's weights.

The runs are the GRPO demo config on 2 CPU processes (data-parallel 2, the model sharded with
FSDP2 over both, blocks in float32), vLLM rollouts, seeded advantages, a distributed checkpoint
(one folder, a shard per rank) every 2 steps. The killed run loses the whole process group at
once (SIGKILL to every rank) during step 4; resumed from the step-2 checkpoint it must repeat
the uninterrupted run bit for bit on both ranks: the same samples, rollouts, losses and
weights (same machine, code and thread count: a difference is lost state, not rounding).
"""

from __future__ import annotations

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
from helpers.cli import PROBES_ENV, REPO_ROOT, free_port, lvrl, run_cli
from helpers.probed_runs import grpo_config
from helpers.process_tree import TREE_WITHIN, run_to_its_end
from helpers.runs import steps_of
from helpers.tolerances import assert_identical
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

STEPS = 4
SHARDS = "train-0000[01].tar"  # a shard of 4 samples per data-parallel rank: epochs of 2 steps
RUN_ENV = {**PROBES_ENV, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
"""Every run's extra environment: the thread count set for all of them, since the runs compared
bit for bit start under both launchers and torchrun sets 1 where it is unset."""
RUN_WITHIN = 400.0  # seconds for a whole run: ~30 s alone, several times that beside other tests


def sharded_config(tmp_path: Path, run_dir: Path, synth_dir: Path, model_dir: Path) -> Path:
    path = grpo_config(tmp_path, run_dir, synth_dir, model_dir, STEPS, SHARDS)
    config = yaml.safe_load(path.read_text())
    config["trainer"]["devices"] = 2
    config["trainer"]["strategy"] = {
        "class_path": "parallel.strategy.SequenceParallelStrategy",
        "init_args": {"sequence_parallel_size": 1, "param_dtype": "float32", "process_group_backend": "gloo"},
    }
    config["trainer"]["callbacks"].append({"class_path": "callbacks.export.HFExport"})
    path.write_text(yaml.safe_dump(config))
    return path


def full_state(checkpoint: Path, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a sharded checkpoint folder, assembled without processes."""
    out = tmp_path / f"{checkpoint.parent.parent.name}-full.pt"
    dcp_to_torch_save(checkpoint, out)
    return torch.load(out, weights_only=False)["state_dict"]


def saved_step(checkpoint: Path) -> int:
    return int(torch.load(checkpoint / "meta.pt", weights_only=False)["global_step"])


def kill_group_after(config: Path, run_dir: Path, step: int, timeout: float = 400) -> None:
    """``lvrl fit`` on 2 processes; SIGKILL to every rank once step ``step`` is recorded."""
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "fit", "--config", str(config)],
        cwd=REPO_ROOT,
        env={**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **RUN_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # rank 0 starts rank 1 in its session: one kill reaches both
    )
    steps = run_dir / "steps.jsonl"
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if steps.exists() and any(json.loads(x)["step"] >= step for x in steps.read_text().splitlines()):
                os.killpg(process.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"


def rank_steps(run_dir: Path) -> dict[int, dict[int, dict]]:
    ranks = {0: steps_of(run_dir)}
    rank1 = run_dir / "steps.jsonl.rank1"
    ranks[1] = {r["step"]: r for r in map(json.loads, rank1.read_text().splitlines())}
    return ranks


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, synth_dir: Path, tiny_model_dir: Path) -> Path:
    """The reference run, started by torchrun (two processes on one node) where the killed and
    resumed runs use Lightning's own launcher, so the two launchers must give the same run. It is
    also torchrun's natural end for tests/e2e/test_exit_hygiene.py: status 0, no traceback, every
    process gone within the bound."""
    tmp = tmp_path_factory.mktemp("sharded_resume")
    run_dir = tmp / "whole"
    config = sharded_config(tmp, run_dir, synth_dir, tiny_model_dir)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    ended = run_to_its_end(
        [
            torchrun,
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            "-m",
            "app",
            "fit",
            "--config",
            str(config),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **RUN_ENV},
        output_dir=tmp / "output",
        exit_within=RUN_WITHIN,
        tree_within=TREE_WITHIN,
    )
    assert ended.returncode == 0 and "Traceback" not in ended.stderr, ended.tail()
    return run_dir


def test_a_killed_sharded_run_resumes_exactly(
    uninterrupted: Path, tmp_path: Path, synth_dir: Path, tiny_model_dir: Path
) -> None:
    killed = tmp_path / "killed"
    config = sharded_config(tmp_path, killed, synth_dir, tiny_model_dir)
    kill_group_after(config, killed, 3)
    checkpoint = killed / "checkpoints" / "last.ckpt"
    assert checkpoint.is_dir() and saved_step(checkpoint) == 2  # the step-4 save never started
    shards = sorted(p.name for p in checkpoint.iterdir() if p.suffix == ".distcp")
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # one file per rank
    run_cli("fit", "--config", str(config), "--ckpt_path", "last", extra_env=RUN_ENV)
    assert not list((killed / "checkpoints").glob("*.partial-*"))

    got, expected = rank_steps(killed), rank_steps(uninterrupted)
    for rank in (0, 1):
        # The killed run recorded steps 1-3 before the kill; the resumed one 3-4 again.
        assert set(got[rank]) == set(expected[rank]) == set(range(1, STEPS + 1))
        for step, want in expected[rank].items():
            record = got[rank][step]
            assert record["keys"] == want["keys"], f"rank {rank} step {step} trained on other samples"
            for field in ("rollout_logprob_sum", "loss", "reward"):
                assert want[field] is not None
                assert_identical(record[field], want[field], reason=f"rank {rank} step {step} {field}")
    assert set(expected[0][1]["keys"]).isdisjoint(expected[1][1]["keys"])  # data-parallel ranks
    ours = full_state(killed / "checkpoints" / "last.ckpt", tmp_path)
    theirs = full_state(uninterrupted / "checkpoints" / "last.ckpt", tmp_path)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert_identical(ours[name], theirs[name], reason=f"{name} weights, resumed")


def test_the_export_of_a_sharded_run_loads_with_its_weights(uninterrupted: Path, tmp_path: Path) -> None:
    from models.loading import load_model

    exported = load_model(uninterrupted / "hf").state_dict()
    trained = full_state(uninterrupted / "checkpoints" / "last.ckpt", tmp_path)
    prefix = "model."  # the LightningModule's attribute holding the HF model
    assert {prefix + name for name in exported} <= trained.keys()
    for name, weight in exported.items():
        assert_identical(weight, trained[prefix + name], reason=f"exported {name}")


def test_lvrl_model_export_reads_a_sharded_checkpoint(uninterrupted: Path, tmp_path: Path) -> None:
    from models.loading import load_model

    lvrl(
        "model",
        "export",
        "--ckpt",
        str(uninterrupted / "checkpoints" / "last.ckpt"),
        "--out",
        str(tmp_path / "hf"),
    )
    exported = load_model(tmp_path / "hf").state_dict()
    at_fit_end = load_model(uninterrupted / "hf").state_dict()
    for name, weight in at_fit_end.items():
        assert_identical(exported[name], weight, reason=f"{name}: lvrl model export vs the run's own export")
