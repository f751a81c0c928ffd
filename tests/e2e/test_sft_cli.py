"""`lvrl fit` / `lvrl validate` end to end on the tiny model: checkpoint, resume, HF export, bad data.

The first fit and the validation run as `lvrl` subprocesses (the entry points themselves); the
resumed fit and the runs on bad data in this process (:func:`helpers.cli.run_lvrl`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from helpers.bad_shards import BROKEN_KEYS, write_shard_with_broken_samples
from helpers.cli import run_lvrl, run_lvrl_expecting_failure
from helpers.runs import fit_args, logged
from helpers.tolerances import assert_identical

from datatools.synthetic import SynthConfig


def test_fit_checkpoint_resume_and_export(tiny_model_dir: Path, synth_dir: Path, tmp_path: Path) -> None:
    from helpers.engine_helpers import greedy_ids_transformers, greedy_ids_vllm

    run_dir = tmp_path / "run"
    train, val = str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")
    run_lvrl(*fit_args(run_dir, tiny_model_dir, train, val, max_steps=2))
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.exists()
    assert torch.load(last, weights_only=False)["global_step"] == 2
    assert logged(run_dir, "train/global_step") == [0, 1]
    assert logged(run_dir, "val/accuracy")  # validation ran and logged accuracy
    assert list(run_dir.glob("wandb/offline-run-*")), "wandb offline run missing"

    # Resume: the next run continues at global step 2 and stops at 4.
    run_lvrl(*fit_args(run_dir, tiny_model_dir, train, val, max_steps=4), "--ckpt_path", "last")
    assert torch.load(last, weights_only=False)["global_step"] == 4
    assert logged(run_dir, "train/global_step") == [0, 1, 2, 3]
    # The scheduler resumed too: the 4-step warm-up carries on where it stopped.
    assert logged(run_dir, "train/lr") == pytest.approx([0.25e-3, 0.5e-3, 0.75e-3, 1e-3])

    # The exported HF directory is the trained model, and transformers and vLLM agree on it.
    export = run_dir / "hf"
    assert ((export / "config.json").exists() and (export / "preprocessor_config.json").exists()) or (
        export / "processor_config.json"
    ).exists()
    state = torch.load(last, weights_only=False)["state_dict"]
    from models.loading import load_model

    exported = load_model(export).state_dict()
    some_key = next(k for k in exported if "layers.0.mlp" in k)
    # The export writes the checkpoint's tensors as they are: identical, dtype included.
    assert_identical(exported[some_key], state[f"model.{some_key}"], reason="HF export vs checkpoint")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(export)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which color comes first?"}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert greedy_ids_transformers(export, prompt_ids, 12) == greedy_ids_vllm(export, prompt_ids, 12)


def test_validate_prints_accuracy_table(tiny_model_dir: Path, synth_dir: Path, tmp_path: Path) -> None:
    result = run_lvrl(
        "validate",
        "--config",
        "configs/demo/sft.yaml",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--model.init_args.model_path",
        str(tiny_model_dir),
        "--model.init_args.max_new_tokens",
        "8",
        "--data.init_args.val_shards",
        str(synth_dir / "val-*.tar"),
        "--data.init_args.num_frames",
        "8",
        "--data.init_args.num_workers",
        "0",
    )
    output = result.stdout + result.stderr
    for needle in ("Temporal", "Spatial", "Plot", "Goal and Purpose", "overall", "constant letter"):
        assert needle in output
    # Every question's result is kept, and agrees with the logged accuracy.
    (predictions,) = (tmp_path / "predictions").glob("val-step*.jsonl")
    records = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert sorted(r["key"] for r in records) == [f"synth-val-{i:06d}" for i in range(8)]
    with next(tmp_path.glob("csv/version_*/metrics.csv")).open() as f:
        logged = float(next(row for row in csv.DictReader(f) if row.get("val/accuracy"))["val/accuracy"])
    assert sum(r["correct"] for r in records) / 8 == pytest.approx(logged)


def test_broken_samples_train_on_with_named_warnings(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    shard = tmp_path / "mixed-00000.tar"
    write_shard_with_broken_samples(shard, SynthConfig(num_frames=20, size=56), good=6)
    run_dir = tmp_path / "run"
    result = run_lvrl(
        *fit_args(run_dir, tiny_model_dir, str(shard), str(synth_dir / "val-*.tar"), max_steps=3)
    )
    for key in BROKEN_KEYS:
        assert key in result.stderr, f"no warning names {key}"
    assert str(shard) in result.stderr
    with next(run_dir.glob("csv/version_*/metrics.csv")).open() as f:
        skipped = [
            float(r["data/skipped_samples"]) for r in csv.DictReader(f) if r.get("data/skipped_samples")
        ]
    assert skipped and max(skipped) == len(BROKEN_KEYS)


@pytest.mark.parametrize(
    ("shards", "message"),
    [("/nonexistent/train-00000.tar", "does not exist"), ("{tmp}/empty-*.tar", "no shard matches")],
)
def test_missing_shards_fail_before_training(
    tiny_model_dir: Path, tmp_path: Path, shards: str, message: str
) -> None:
    spec = shards.format(tmp=tmp_path)
    result = run_lvrl_expecting_failure(*fit_args(tmp_path / "run", tiny_model_dir, spec, spec, max_steps=1))
    assert spec in result.stderr and message in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_fit_can_stop_when_its_validation_loss_plateaus(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    """With ``val_answers: false`` validation computes the loss alone (no answers, no predictions),
    and Lightning's EarlyStopping on it ends the fit before ``max_steps``: what the zoom bench's
    baselines train to (a plateau, not a fixed budget)."""
    run_dir = tmp_path / "run"
    train, val = str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")
    args = fit_args(run_dir, tiny_model_dir, train, val, max_steps=40)
    run_lvrl(
        *args,
        "--model.init_args.val_answers",
        "false",
        "--trainer.callbacks+=EarlyStopping",
        "--trainer.callbacks.monitor=val/loss",
        "--trainer.callbacks.patience=1",
        "--trainer.callbacks.min_delta=100",  # no check improves on the first by this: stop at the second
    )
    assert len(logged(run_dir, "val/loss")) == 2
    assert not logged(run_dir, "val/accuracy") and not (run_dir / "predictions").exists()
    assert logged(run_dir, "train/global_step")[-1] < 39  # stopped long before max_steps
