"""GRPO end to end on the tiny model: `lvrl fit` with each rollout engine, and the encode-once rule.

The `lvrl fit` runs go through the real CLI in this process (:func:`helpers.cli.run_lvrl`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from helpers.cli import run_lvrl, run_lvrl_expecting_failure
from helpers.grpo_helpers import fit_tiny_grpo
from helpers.rollout_settings import engine_gap_bar, engine_init_args, tiny_rollout_settings
from helpers.runs import logged, tiny_data_args

EXPECTED_METRICS = (
    "reward/accuracy_mean",
    "reward/accuracy_std",
    "reward/format_mean",
    "reward/format_std",
    "reward/total_mean",
    "rollout/accuracy",
    "rollout/format_rate",
    "rollout/response_length_mean",
    "rollout/zero_variance_group_fraction",
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "train/loss",
    "train/clip_fraction",
    "train/ref_kl",
    "train/entropy",
    "train/grad_norm",
    "train/trained_row_fraction",
    "time/rollout_s",
    "time/train_s",
    "time/weight_sync_s",
)


def tiny_grpo_config(tmp_path: Path, engine: str) -> Path:
    path = tmp_path / f"grpo-{engine}.yaml"
    path.write_text(yaml.safe_dump(tiny_rollout_settings("configs/demo/grpo.yaml", engine)))
    return path


@pytest.mark.parametrize("engine", ["vllm", "transformers"])
def test_three_grpo_steps_log_every_metric(
    engine: str, tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_lvrl(
        "fit",
        "--config",
        str(tiny_grpo_config(tmp_path, engine)),
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.max_steps",
        "3",
        "--trainer.limit_val_batches",
        "0",
        "--model.init_args.model_path",
        str(tiny_model_dir),
        "--model.init_args.kl_coef",
        "0.01",
        "--model.init_args.learning_rate",
        "1e-3",
        *tiny_data_args(str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")),
    )
    for metric in EXPECTED_METRICS:
        values = logged(run_dir, metric)
        assert len(values) == 3, f"{metric}: {values}"
    # Trainer and engine score the same sampled tokens alike (float32, same layout and positions).
    assert max(logged(run_dir, "rollout/logprob_diff_max")) <= engine_gap_bar(tiny_model_dir)
    samples = [json.loads(line) for line in (run_dir / "rollout_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 2 * 4 and {"completion", "reward", "answer"} <= samples[0].keys()
    assert (run_dir / "checkpoints" / "last.ckpt").exists() and (run_dir / "hf" / "config.json").exists()


def test_vision_tower_runs_once_per_prompt_per_step(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    from callbacks.rl_rollout import RolloutCallback
    from models.grpo import GRPOModule
    from models.vision import vision_tower

    calls = []

    class CountVisionCalls(L.Callback):
        def on_fit_start(self, trainer, pl_module) -> None:
            def count(module, args, kwargs, output) -> None:
                videos = kwargs["grid_thw"] if "grid_thw" in kwargs else args[1]
                calls.extend([trainer.global_step] * len(videos))

            vision_tower(pl_module.model).register_forward_hook(count, with_kwargs=True)

    steps, prompts, generations = 2, 2, 4
    module = GRPOModule(str(tiny_model_dir), learning_rate=1e-3, kl_coef=0.01, max_new_tokens=8)
    rollout = RolloutCallback(
        **engine_init_args("transformers"), num_generations=generations, max_new_tokens=8
    )
    fit_tiny_grpo(
        module,
        tiny_model_dir,
        synth_dir,
        tmp_path,
        steps=steps,
        callbacks=[CountVisionCalls(), rollout],
        prompts_per_step=prompts,
    )
    # One encoding per prompt per step, shared by the G rollouts, the reference and the policy pass.
    assert calls == [0] * prompts + [1] * prompts
    assert rollout.vision_calls == steps * prompts


def test_trainable_vision_tower_is_re_encoded_with_grad(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from callbacks.rl_rollout import RolloutCallback
    from models.grpo import GRPOModule
    from models.vision import vision_tower

    calls, grads = [], []

    class Watch(L.Callback):
        def on_fit_start(self, trainer, pl_module) -> None:
            vision_tower(pl_module.model).register_forward_hook(
                lambda *_: calls.append(torch.is_grad_enabled())
            )

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            grads.append(any(p.grad is not None for p in vision_tower(pl_module.model).parameters()))

    # A KL term makes every row train (an untrained model scores all completions alike).
    module = GRPOModule(
        str(tiny_model_dir), learning_rate=1e-3, freeze_vision=False, kl_coef=0.01, max_new_tokens=8
    )
    rollout = RolloutCallback(**engine_init_args("transformers"), num_generations=2, max_new_tokens=8)
    with caplog.at_level(logging.WARNING, logger="models.grpo"):
        fit_tiny_grpo(module, tiny_model_dir, synth_dir, tmp_path, steps=1, callbacks=[Watch(), rollout])
    assert "re-encodes" in caplog.text
    assert calls == [False, True]  # cached encoding without grad, then the policy pass with grad
    assert grads == [True]


def test_trainer_gradient_clipping_is_redirected_to_the_module(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    result = run_lvrl_expecting_failure(
        "fit",
        "--config", str(tiny_grpo_config(tmp_path, "transformers")),
        "--trainer.default_root_dir", str(tmp_path / "run"),
        "--trainer.gradient_clip_val", "1.0",
        "--model.init_args.model_path", str(tiny_model_dir),
        *tiny_data_args(str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")),
    )  # fmt: skip
    assert "remove trainer.gradient_clip_val=1.0 and set model.init_args.max_grad_norm" in result.stderr
