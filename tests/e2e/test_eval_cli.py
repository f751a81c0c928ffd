"""`lvrl validate --config configs/eval/longvideo_reason.yaml`: released eval layout -> table + 3 files.

Every `lvrl` command here runs in this process (:func:`helpers.cli.run_lvrl`)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from helpers.cli import lvrl, run_lvrl

CPU_OVERRIDES = [
    "--trainer.accelerator", "cpu",
    "--trainer.precision", "32-true",
    "--model.dtype", "float32",
    "--model.attn_implementation", "null",
    "--model.max_new_tokens", "8",
    "--data.max_pixels_per_frame", "3136",
    "--data.num_workers", "0",
    "--data.val_batch_size", "4",
]  # fmt: skip


def other_type_rows(rows: list[dict]) -> list[dict]:
    """Two numerical questions and an open-ended one on the same videos (no judge: not scored)."""
    base = {"data_type": "video", "reasoning": "Counted.", "category": "Plot"}
    return [
        {**base, "problem_id": "numeric-0", "videos": rows[0]["videos"], "problem_type": "numerical",
         "problem": "How many scenes are there?", "answer": "<answer>2</answer>"},
        {**base, "problem_id": "numeric-1", "videos": rows[1]["videos"], "problem_type": "numerical",
         "problem": "How long is the video, in seconds?", "answer": "<answer>10</answer>"},
        {**base, "problem_id": "open-0", "videos": rows[2]["videos"], "problem_type": "open-ended",
         "problem": "Describe the first scene.", "answer": "<answer>a red background</answer>"},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def eval_shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """12 synthetic multiple-choice questions written in the released eval layout, 2 numerical
    and 1 open-ended one beside them, built into shards."""
    root = tmp_path_factory.mktemp("released_eval")
    run_lvrl("data", "synth", "--released", "--out", str(root), "--num-train", "0", "--num-val", "12",
            "--num-test", "0", "--frames", "20", "--fps", "2")  # fmt: skip
    rows = [json.loads(line) for line in (root / "val.jsonl").read_text().splitlines()]
    with (root / "val.jsonl").open("a") as f:
        f.writelines(json.dumps(row) + "\n" for row in other_type_rows(rows))
    run_lvrl("data", "build", "--jsonl", str(root / "val.jsonl"), "--videos-root", str(root / "videos"),
            "--out", str(root / "shards"), "--split", "eval", "--no-progress")  # fmt: skip
    return root / "shards", rows


def test_eval_config_prints_the_table_and_writes_json_markdown_and_chart(
    eval_shards, tiny_model_dir, tmp_path
):
    shards, rows = eval_shards
    run_dir = tmp_path / "eval"
    result = run_lvrl(
        "validate", "--config", "configs/eval/longvideo_reason.yaml",
        "--model.model_path", str(tiny_model_dir),
        "--data.val_shards", str(shards / "eval-*.tar"),
        "--data.num_frames", "8", "--data.val_num_frames", "[4, 8]", "--model.val_samples", "3",
        "--trainer.default_root_dir", str(run_dir), *CPU_OVERRIDES,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert "| **multiple choice** | 12 |" in output and "| unparseable answers |" in output
    assert "| numeric | 2 |" in output and "| not scored | | 1 not scored | 1 not scored |" in output

    report = json.loads((run_dir / "eval" / "eval.json").read_text())
    assert [e["frames"] for e in report["evaluations"]] == [4, 8]
    key = Counter(row["answer"][len("<answer>") : -len("</answer>")] for row in rows)
    per_category = Counter(row["category"] for row in rows)
    for evaluation in report["evaluations"]:
        # Scores agree with the per-question records of the same frame count.
        suffix = "" if evaluation["frames"] == 8 else f"-frames{evaluation['frames']}"
        records = [
            json.loads(line)
            for line in (run_dir / "predictions" / f"val-step000000{suffix}.jsonl").read_text().splitlines()
        ]
        assert {r["num_frames"] for r in records} == {evaluation["frames"]}
        # Every question has its record, with its problem_id, type and the scoring used.
        assert sorted(r["problem_id"] for r in records) == sorted(
            [row["problem_id"] for row in rows] + ["numeric-0", "numeric-1", "open-0"]
        )
        scoring = {r["problem_id"]: (r["problem_type"], r["scoring"]) for r in records}
        assert scoring["numeric-0"] == ("numerical", "numeric") and scoring["open-0"] == (
            "open-ended",
            "not_scored",
        )
        assert all(scoring[row["problem_id"]] == ("multiple choice", "choice") for row in rows)
        others = [r for r in records if r["scoring"] != "choice"]
        assert [r["correct"] for r in others if r["scoring"] == "not_scored"] == [None]
        numeric = [r["correct"] for r in others if r["scoring"] == "numeric"]
        assert evaluation["numeric"] == {"accuracy": pytest.approx(sum(numeric) / 2), "count": 2}
        assert evaluation["not_scored"] == 1 and evaluation["open_ended_judged"] is None
        records = [r for r in records if r["scoring"] == "choice"]
        assert evaluation["questions"] == len(records) == 12 and evaluation["all_questions"] == 15
        assert evaluation["accuracy"] == pytest.approx(sum(r["correct"] for r in records) / 12)
        assert evaluation["unparseable"] == sum(r["predicted"] is None for r in records)
        # Three sampled answers per question: fractions in thirds, their mean reported.
        assert all(round(3 * r["sampled_correct"]) == 3 * r["sampled_correct"] for r in records)
        sampled_mean = sum(r["sampled_correct"] for r in records) / 12
        assert evaluation["sampled_accuracy"] == pytest.approx(sampled_mean)
        assert {c: v["count"] for c, v in evaluation["per_category"].items()} == per_category
        # The constant-letter baselines come from the multiple-choice answer key only.
        assert evaluation["constant_letter_baselines"] == pytest.approx({x: key[x] / 12 for x in "ABCD"})
        assert evaluation["best_constant_letter"] == pytest.approx(max(key.values()) / 12)
        # Reasoning agreement: over the questions whose reasoning states exactly one option.
        decided = [r["reasoning_agrees"] for r in records if r["reasoning_agrees"] is not None]
        expected = sum(decided) / len(decided) if decided else None
        assert evaluation["reasoning_agreement"] == (pytest.approx(expected) if decided else None)

    table = (run_dir / "eval" / "eval.md").read_text()
    assert "| | n | 4 frames | 8 frames |" in table and "| always B |" in table
    assert "| **multiple choice** | 12 |" in table and "| numeric | 2 |" in table
    assert "| sampled answers (mean) | |" in table
    measured_reasoning = any(e["reasoning_agreement"] is not None for e in report["evaluations"])
    assert ("| reasoning names the chosen option | |" in table) == measured_reasoning
    assert (run_dir / "eval" / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The report reached the (offline) wandb run: the chart and the table.
    media = next((run_dir / "wandb").glob("offline-run-*/files/media"))
    assert list(media.glob("images/eval/*.png")) and list(media.glob("table/eval/*.table.json"))


def test_an_evaluation_stopped_by_a_signal_says_it_did_not_finish(eval_shards, tiny_model_dir, tmp_path):
    """SIGTERM during `lvrl validate`: exit 143 (not 0, which would read as finished) and a
    message that asks for the evaluation again, not for a checkpoint that validate never writes."""
    shards, _ = eval_shards
    result = lvrl(
        "validate", "--config", "configs/eval/longvideo_reason.yaml",
        "--model.model_path", str(tiny_model_dir),
        "--data.val_shards", str(shards / "eval-*.tar"), "--data.num_frames", "4",
        "--trainer.default_root_dir", str(tmp_path / "eval"),
        "--trainer.callbacks+=helpers.resume_probe.SigtermInValidation", *CPU_OVERRIDES,
    )  # fmt: skip
    assert result.returncode == 143, result.stderr[-3000:]
    assert "stopped by a signal; lvrl validate did not finish and saved nothing" in result.stderr
    assert "--ckpt_path" not in result.stderr
    assert not (tmp_path / "eval" / "eval" / "eval.json").exists()
