"""CoT-SFT under the sharded strategy: `lvrl fit` of the SFT demo config on 2 CPU processes.

Data-parallel 2 with the model sharded by FSDP2 (blocks in float32, a trainable vision tower
sharded with the root), Lightning's automatic optimization and gradient clipping, validation
on the model gathered whole (the ranks hold different numbers of questions), a distributed
checkpoint and the HF export at the end. Each of the 8 validation questions is answered once, by one rank.
A command under the strategy ends the process group it started (``parallel.process_group``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from helpers.cli import REPO_ROOT, run_cli, run_lvrl
from helpers.runs import tiny_data_args

from models.loading import load_model


def sharded_sft_args(model_dir: Path) -> list[str]:
    """The sharded strategy (no sequence split, blocks in float32, gloo) on the tiny model."""
    return [
        "--trainer.strategy", "parallel.strategy.SequenceParallelStrategy",
        "--trainer.strategy.sequence_parallel_size", "1",
        "--trainer.strategy.param_dtype", "float32",
        "--trainer.strategy.process_group_backend", "gloo",
        "--model.init_args.model_path", str(model_dir),
        "--model.init_args.max_new_tokens", "4",
    ]  # fmt: skip


def test_sft_trains_validates_and_checkpoints_sharded(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    result = run_cli(
        "fit",
        "--config", str(REPO_ROOT / "configs/demo/sft.yaml"),
        "--trainer.default_root_dir", str(run_dir),
        "--trainer.devices", "2",
        "--trainer.max_steps", "2",
        "--trainer.val_check_interval", "2",
        "--trainer.limit_val_batches", "4",
        *sharded_sft_args(tiny_model_dir),
        "--model.init_args.learning_rate", "1e-3",
        *tiny_data_args(str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")),
    )  # fmt: skip
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    assert checkpoint.is_dir() and len(list(checkpoint.glob("*.distcp"))) == 2  # one shard per rank
    assert int(torch.load(checkpoint / "meta.pt", weights_only=False)["global_step"]) == 2
    trained, initial = load_model(run_dir / "hf").state_dict(), load_model(tiny_model_dir).state_dict()
    moved = [name for name, weight in initial.items() if not torch.equal(weight, trained[name])]
    assert any("visual" in name for name in moved) and any("layers" in name for name in moved)
    # Each rank validated its own questions (4 of the 8), on the model gathered whole.
    keys = [
        json.loads(line)["key"]
        for rank in (0, 1)
        for line in (run_dir / "predictions" / f"val-step000002-rank{rank}.jsonl").read_text().splitlines()
    ]
    assert len(keys) == len(set(keys)) == 8, result.stderr[-2000:]


def test_an_lvrl_command_ends_the_process_group_it_started(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    """In this process, one rank: gloo would otherwise keep the group's threads until the
    interpreter ends, where they can abort a rank that finished its work."""
    run_lvrl(
        "fit",
        "--config", str(REPO_ROOT / "configs/demo/sft.yaml"),
        "--trainer.default_root_dir", str(tmp_path / "run"),
        "--trainer.devices", "1",
        "--trainer.max_steps", "1",
        "--trainer.limit_val_batches", "0",
        *sharded_sft_args(tiny_model_dir),
        *tiny_data_args(str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")),
    )  # fmt: skip
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_dir()  # it ran under the strategy
    assert not dist.is_initialized()
