"""`lvrl fit` of the demo's SFT and GRPO configs on Qwen2-VL and Qwen3-VL: only the model path changes.

For each family's tiny model the SFT config trains 2 steps with a validation (greedy answers from
the cached encoding through the transformers engine), then the GRPO config trains 2 steps with
rollouts from the transformers engine and a KL term to the reference; the trainer's log-probs
equal the engine's within the float32 bar (the engine samples with the family's positions and,
for Qwen3-VL, DeepStack features; a wrong position or a dropped feature gives gaps over 1e-2).
vLLM per family is tested in ``tests/e2e/test_rollout_vllm_families.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.cli import run_lvrl
from helpers.rollout_settings import engine_gap_bar, tiny_rollout_settings
from helpers.runs import fit_args, logged, tiny_data_args


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_sft_then_grpo_through_lvrl_fit(
    family: str, family_model_dir, synth_dir: Path, tmp_path: Path
) -> None:
    model_dir = family_model_dir(family)
    train, val = str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")
    sft_dir = tmp_path / "sft"
    run_lvrl(*fit_args(sft_dir, model_dir, train, val, max_steps=2))
    assert logged(sft_dir, "train/global_step") == [0, 1]
    assert len(logged(sft_dir, "val/accuracy")) >= 1  # answers generated and scored
    assert all(loss > 0 for loss in logged(sft_dir, "train/loss"))

    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump(tiny_rollout_settings("configs/demo/grpo.yaml", "transformers")))
    grpo_dir = tmp_path / "grpo"
    run_lvrl(
        "fit", "--config", str(config),
        "--trainer.default_root_dir", str(grpo_dir),
        "--trainer.max_steps", "2",
        "--trainer.limit_val_batches", "0",
        "--model.init_args.model_path", str(sft_dir / "hf"),
        "--model.init_args.kl_coef", "0.01",
        "--model.init_args.learning_rate", "1e-3",
        *tiny_data_args(train, val),
    )  # fmt: skip
    assert len(logged(grpo_dir, "train/loss")) == 2
    assert max(logged(grpo_dir, "rollout/logprob_diff_max")) <= engine_gap_bar(model_dir)
    assert (grpo_dir / "hf" / "config.json").exists()
