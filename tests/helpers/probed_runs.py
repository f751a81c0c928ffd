"""Configs of small recorded runs: a demo config made tiny, with the probes of
:mod:`helpers.resume_probe` that write what each step did to ``RUN_DIR/steps.jsonl``."""

from __future__ import annotations

from pathlib import Path

import yaml

from helpers.cli import REPO_ROOT
from helpers.rollout_settings import tiny_rollout_settings


def recorded_run(
    config: dict, run_dir: Path, synth_dir: Path, max_steps: int, train_shards: str = "train-*.tar"
) -> dict:
    """Make a demo config small (CSV logs only, no validation, 2 samples of 8 frames per step from
    one worker); returns the step recorder's callback spec, writing into the run folder."""
    config["trainer"].update(
        default_root_dir=str(run_dir),
        max_steps=max_steps,
        limit_val_batches=0,
        log_every_n_steps=1,
        logger=[
            {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(run_dir), "name": "csv"},
            }
        ],
    )
    config["data"]["init_args"].update(
        train_shards=str(synth_dir / train_shards),
        val_shards=str(synth_dir / "val-*.tar"),
        num_frames=8,
        batch_size=2,
        num_workers=1,
        shuffle_buffer=8,
    )
    return {
        "class_path": "helpers.resume_probe.StepRecorder",
        "init_args": {"out": str(run_dir / "steps.jsonl")},
    }


def sft_config(
    tmp_path: Path,
    run_dir: Path,
    synth_dir: Path,
    model_dir: Path,
    *,
    max_steps: int,
    checkpoint_every: int,
    train_shards: str = "train-*.tar",
) -> Path:
    """The SFT demo config as a recorded run, checkpointing every ``checkpoint_every`` steps."""
    config = yaml.safe_load((REPO_ROOT / "configs/demo/sft.yaml").read_text())
    recorder = recorded_run(config, run_dir, synth_dir, max_steps, train_shards)
    trainer = config["trainer"]
    trainer["callbacks"] = [
        {
            "class_path": "callbacks.checkpoint.RunCheckpoint",
            "init_args": {"every_n_train_steps": checkpoint_every},
        },
        recorder,
    ]
    config["model"]["init_args"].update(model_path=str(model_dir), warmup_steps=2, learning_rate=1e-3)
    path = tmp_path / f"{run_dir.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def grpo_config(
    tmp_path: Path,
    run_dir: Path,
    synth_dir: Path,
    model_dir: Path,
    max_steps: int,
    train_shards: str = "train-*.tar",
) -> Path:
    """The GRPO demo config as a recorded run with vLLM rollouts, seeded random advantages (an
    untrained model's rewards are all 0) and a checkpoint every 2 steps."""
    config = tiny_rollout_settings("configs/demo/grpo.yaml", "vllm")
    recorder = recorded_run(config, run_dir, synth_dir, max_steps, train_shards)
    rollout = config["trainer"]["callbacks"][0]
    config["trainer"]["callbacks"] = [
        rollout,
        {"class_path": "helpers.resume_probe.SeededAdvantages"},
        {"class_path": "callbacks.checkpoint.RunCheckpoint", "init_args": {"every_n_train_steps": 2}},
        recorder,
    ]
    config["model"]["init_args"].update(model_path=str(model_dir), learning_rate=1e-3, max_new_tokens=8)
    path = tmp_path / f"{run_dir.name}-grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def with_refill_rounds(path: Path) -> Path:
    """The GRPO config at ``path`` with dynamic sampling (at most 2 rounds a step) and the reward
    ``probe_half_flat`` (:mod:`helpers.resume_probe`): about half the prompts' groups carry no
    signal, so most steps draw a second batch; the real advantages train."""
    config = yaml.safe_load(path.read_text())
    callbacks = config["trainer"]["callbacks"]
    callbacks[0]["init_args"].update(
        dynamic_sampling={"max_rounds": 2},
        # This salt makes step 1 of the synthetic shards' stream need one round, steps 2-4 two.
        rewards=[{"name": "probe_half_flat", "weight": 1.0, "kwargs": {"salt": "7"}}],
    )
    config["trainer"]["callbacks"] = [
        c for c in callbacks if not c["class_path"].endswith("SeededAdvantages")
    ]
    path.write_text(yaml.safe_dump(config))
    return path


def tool_grpo_config(
    tmp_path: Path, run_dir: Path, synth_dir: Path, model_dir: Path, max_steps: int, train_shards: str
) -> Path:
    """:func:`grpo_config` with tool-use episodes (at most 2 requests, vLLM taking 3 videos a
    prompt) for a model that writes ``</tool_call>`` often (``helpers.biased_models``): each turn
    may stop at a request, and episodes differ in turns and lengths."""
    path = grpo_config(tmp_path, run_dir, synth_dir, model_dir, max_steps, train_shards)
    config = yaml.safe_load(path.read_text())
    rollout = config["trainer"]["callbacks"][0]
    rollout["init_args"]["tool_use"] = {"max_calls": 2, "frames_per_call": 4, "frames_per_episode": 8}
    rollout["init_args"]["engine"]["init_args"]["videos_per_prompt"] = 3
    config["data"]["init_args"]["tool_use"] = True
    path.write_text(yaml.safe_dump(config))
    return path
