"""`lvrl report`: curves and before/after tables read from a run's CSV logs."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from app.cli import main
from app.commands.report import (
    PairedComparison,
    comparison_table,
    format_p_value,
    last_predictions,
    last_validation,
    metric_rows,
    metric_series,
    moving_average,
    paired_comparison,
    paired_means,
)


def write_log(run_dir: Path, version: int, rows: list[dict[str, object]]) -> None:
    path = run_dir / "csv" / f"version_{version}" / "metrics.csv"
    path.parent.mkdir(parents=True)
    keys = sorted({k for row in rows for k in row})
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        writer.writerows(rows)


def test_moving_average_is_trailing() -> None:
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([2.0, 4.0], 10) == [2.0, 3.0]


def test_series_follow_run_versions_numerically(tmp_path: Path) -> None:
    # version_10 was written after version_2: a plain string sort would put it first.
    write_log(tmp_path, 2, [{"step": 0, "reward": 0.5}, {"step": 1, "reward": 0.6}])
    write_log(tmp_path, 10, [{"step": 2, "train/global_step": 2, "reward": 0.9}])
    steps, values = metric_series(metric_rows(tmp_path), "reward")
    assert (steps, values) == ([0.0, 1.0, 2.0], [0.5, 0.6, 0.9])
    with pytest.raises(KeyError, match=r"never logged.*reward"):
        metric_series(metric_rows(tmp_path), "loss")
    with pytest.raises(FileNotFoundError, match="no CSV logs"):
        metric_rows(tmp_path / "missing")


def test_compare_table_uses_the_last_validation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    write_log(
        before,
        0,
        [
            {"val/accuracy": 0.1, "val/accuracy/Plot": 0.1},
            {"val/accuracy": 0.5, "val/accuracy/Plot": 0.25, "val/format_rate": 1.0},
            {"train/loss": 0.3},
        ],
    )
    write_log(after, 0, [{"val/accuracy": 0.75, "val/accuracy/Plot": 0.5, "val/accuracy/Spatial": 1.0}])
    assert last_validation(metric_rows(before))["val/accuracy"] == 0.5
    main(
        [
            "report",
            "compare",
            "--run",
            f"SFT={before}",
            "--run",
            f"GRPO={after}",
            "--out",
            str(tmp_path / "t.md"),
        ]
    )
    table = capsys.readouterr().out
    assert "| Plot | 25.0% | 50.0% |" in table
    assert "| Spatial | - | 100.0% |" in table
    assert "| **overall** | 50.0% | 75.0% |" in table
    assert (tmp_path / "t.md").read_text().strip() == table.strip()
    assert comparison_table({"A": {"val/accuracy": 1.0}}).count("\n") == 4


def test_curve_writes_a_png(tmp_path: Path) -> None:
    write_log(tmp_path, 0, [{"step": i, "reward/total_mean": i / 10} for i in range(20)])
    out = tmp_path / "plots" / "reward.png"
    main(["report", "curve", "--run", str(tmp_path), "--metric", "reward/total_mean", "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def write_predictions(run_dir: Path, name: str, correct: list[bool]) -> None:
    folder = run_dir / "predictions"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"key": f"q{i}", "correct": c}) for i, c in enumerate(correct)]
    (folder / name).write_text("\n".join(lines) + "\n")


def test_mcnemar_exact_p_value_by_hand() -> None:
    # 8 vs 2 disagreements: p = 2 * (C(10,0) + C(10,1) + C(10,2)) / 2^10 = 2 * 56 / 1024.
    assert PairedComparison(100, 8, 2).p_value == pytest.approx(112 / 1024)
    assert PairedComparison(100, 8, 2).change == pytest.approx(0.06)
    assert PairedComparison(100, 2, 8).p_value == pytest.approx(112 / 1024)
    assert PairedComparison(100, 5, 5).p_value == 1.0
    assert PairedComparison(100, 0, 0).p_value == 1.0
    # 10 vs 0: p = 2 / 1024.
    assert PairedComparison(50, 10, 0).p_value == pytest.approx(2 / 1024)


def test_paired_comparison_reads_the_last_predictions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    write_log(before, 0, [{"val/accuracy": 0.5}])
    write_log(after, 0, [{"val/accuracy": 0.75}])
    write_predictions(before, "val-step000000.jsonl", [True, True, False, False])
    # An older validation of `after` is ignored; the last one is split across two ranks.
    write_predictions(after, "val-step000010.jsonl", [False] * 4)
    write_predictions(after, "val-step000150-rank0.jsonl", [True, False])
    (after / "predictions" / "val-step000150-rank1.jsonl").write_text(
        json.dumps({"key": "q2", "correct": True}) + "\n" + json.dumps({"key": "q3", "correct": True}) + "\n"
    )
    assert last_predictions(after) == {"q0": True, "q1": False, "q2": True, "q3": True}
    assert last_predictions(tmp_path / "missing") is None
    # Saved results keep their predictions gzip-compressed: read the same.
    compressed = tmp_path / "compressed" / "predictions"
    compressed.mkdir(parents=True)
    for path in (after / "predictions").iterdir():
        (compressed / (path.name + ".gz")).write_bytes(gzip.compress(path.read_bytes()))
    assert last_predictions(compressed.parent) == last_predictions(after)
    paired = paired_comparison(last_predictions(before), last_predictions(after))
    assert (paired.questions, paired.only_new, paired.only_base) == (4, 2, 1)
    main(["report", "compare", "--run", f"SFT={before}", "--run", f"GRPO={after}"])
    out = capsys.readouterr().out
    assert "GRPO vs SFT, same 4 questions: +25.0% (2 right only in GRPO, 1 right only in SFT)" in out
    assert "exact McNemar p = 1\n" in out
    # These records predate problem_id: paired on the shard key, and the report says so.
    assert "GRPO vs SFT: paired on the shard key" in out


def test_sampled_accuracy_is_compared_question_by_question(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Per-question fractions right: differences +0.5, +0.25, 0, +0.25 -> mean 0.25, sd 0.204,
    # z = 0.25 / (0.204 / 2) = 2.449, two-sided p = 0.0143.
    base = {"q0": 0.0, "q1": 0.25, "q2": 0.5, "q3": 0.5}
    new = {"q0": 0.5, "q1": 0.5, "q2": 0.5, "q3": 0.75, "q9": 1.0}
    means = paired_means(base, new)
    assert (means.questions, means.base, means.new) == (4, pytest.approx(0.3125), pytest.approx(0.5625))
    assert means.p_value == pytest.approx(0.0143, abs=2e-4)
    assert paired_means(base, base).p_value == 1.0
    for name, fractions in (("sft", base), ("grpo", new)):
        run = tmp_path / name
        write_log(
            run, 0, [{"val/accuracy": 0.5, "val/sampled_accuracy": sum(fractions.values()) / len(fractions)}]
        )
        (run / "predictions").mkdir(parents=True)
        (run / "predictions" / "val-step000000.jsonl").write_text(
            "".join(
                json.dumps({"key": k, "correct": True, "sampled_correct": v}) + "\n"
                for k, v in fractions.items()
            )
        )
    main(["report", "compare", "--run", f"SFT={tmp_path / 'sft'}", "--run", f"GRPO={tmp_path / 'grpo'}"])
    out = capsys.readouterr().out
    assert "| sampled answers (mean) |" in out
    assert (
        "sampled answers, GRPO vs SFT, same 4 questions: 31.2% -> 56.2% (+25.0%); paired test p = 0.014\n"
        in out
    )


def test_p_values_below_a_thousandth_are_printed_as_a_bound() -> None:
    assert format_p_value(2 / 1024) == "p = 0.002"
    assert format_p_value(0.0143) == "p = 0.014" and format_p_value(0.26) == "p = 0.26"
    assert format_p_value(0.001) == "p = 0.001"
    assert format_p_value(0.000999) == "p < 0.001" and format_p_value(0.0) == "p < 0.001"
    assert format_p_value(2.9e-18) == "p < 0.001"
    # 30 vs 0 disagreements: p = 2 / 2^30, printed as a bound, never "p = 0.000".
    assert format_p_value(PairedComparison(40, 30, 0).p_value) == "p < 0.001"


def write_records(run_dir: Path, records: list[dict], step: int = 0) -> None:
    folder = run_dir / "predictions"
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records)
    (folder / f"val-step{step:06d}.jsonl").write_text(text)


def record(problem_id: str | None, key: str, correct: bool | None, scoring: str = "choice") -> dict:
    out = {"key": key, "correct": correct, "scoring": scoring}
    return out if problem_id is None else {**out, "problem_id": problem_id}


def test_questions_pair_on_problem_id_when_shard_keys_differ(tmp_path: Path, capsys) -> None:
    # The same 30 questions in two builds that keyed them differently (and in another order).
    base = [record(f"q{i}", f"old-{i:05d}", i < 5) for i in range(30)]
    new = [record(f"q{i}", f"new-{29 - i:05d}", True) for i in reversed(range(30))]
    for name, records in (("before", base), ("after", new)):
        write_log(tmp_path / name, 0, [{"val/accuracy": 0.5}])
        write_records(tmp_path / name, records)
    main(["report", "compare", "--run", f"A={tmp_path / 'before'}", "--run", f"B={tmp_path / 'after'}"])
    out = capsys.readouterr().out
    assert (
        "B vs A, same 30 questions: +83.3% (25 right only in B, 0 right only in A); exact McNemar p < 0.001"
        in out
    )
    assert "shard key" not in out and "WARNING" not in out


def test_a_problem_id_on_two_records_is_counted_named_and_left_out(tmp_path: Path, capsys) -> None:
    base = [record(f"q{i}", f"k{i}", False) for i in range(6)]
    # q1 twice (e.g. a build that wrote it under two keys), q2 three times.
    new = [record(f"q{i}", f"k{i}", True) for i in range(6)]
    new += [record("q1", "k1-dup", False), record("q2", "k2-dup", True), record("q2", "k2-dup2", True)]
    for name, records in (("before", base), ("after", new)):
        write_log(tmp_path / name, 0, [{"val/accuracy": 0.5}])
        write_records(tmp_path / name, records)
    main(["report", "compare", "--run", f"A={tmp_path / 'before'}", "--run", f"B={tmp_path / 'after'}"])
    out = capsys.readouterr().out
    assert (
        "WARNING: B has 2 problem_ids on more than one record ('q1' x2, 'q2' x3): its 5 records are left out"
        in out
    )
    assert "B vs A, same 4 questions: +100.0% (4 right only in B, 0 right only in A)" in out
    with pytest.raises(ValueError, match=r"more than one record: 'q1' x2, 'q2' x3"):
        last_predictions(tmp_path / "after")


def test_each_problem_type_is_compared_on_its_own(tmp_path: Path, capsys) -> None:
    base = [record("m0", "m0", True), record("m1", "m1", False), record("n0", "n0", False, "numeric")]
    base += [record("o0", "o0", None, "not_scored"), record("o1", "o1", None, "not_scored")]
    new = [record("m0", "m0", True), record("m1", "m1", True), record("n0", "n0", True, "numeric")]
    new += [record("o0", "o0", True, "judged"), record("o1", "o1", None, "not_scored")]
    logs = {
        "before": {
            "val/accuracy": 0.5,
            "val/numeric_accuracy": 0.0,
            "val/numeric_count": 1,
            "val/not_scored": 2,
        },
        "after": {
            "val/accuracy": 1.0,
            "val/numeric_accuracy": 1.0,
            "val/numeric_count": 1,
            "val/open_ended_accuracy": 1.0,
            "val/open_ended_judged": 1,
            "val/not_scored": 1,
        },
    }
    for name, records in (("before", base), ("after", new)):
        write_log(tmp_path / name, 0, [logs[name]])
        write_records(tmp_path / name, records)
    main(["report", "compare", "--run", f"A={tmp_path / 'before'}", "--run", f"B={tmp_path / 'after'}"])
    out = capsys.readouterr().out
    assert "| **multiple choice** | 50.0% | 100.0% |" in out
    assert "| numeric | 0.0% (n = 1) | 100.0% (n = 1) |" in out
    assert "| open-ended (judged) | - | 100.0% (n = 1) |" in out
    assert "| not scored | 2 not scored | 1 not scored |" in out
    assert "B vs A, same 2 questions: +50.0% (1 right only in B, 0 right only in A)" in out
    assert "B vs A, same 1 numeric questions: +100.0%" in out
    # Only B judged open-ended answers: nothing to pair, no line; unscored answers never count.
    assert "open-ended (judged) questions" not in out
    assert last_predictions(tmp_path / "after") == {"m0": True, "m1": True}


def test_frames_report_puts_tool_use_and_a_frame_sweep_on_one_axis(tmp_path: Path, capsys) -> None:
    tool, dense = tmp_path / "tool", tmp_path / "dense"
    write_log(
        tool,
        0,
        [{"step": 1, "val/accuracy": 0.62, "val/frames_per_answer": 31.5, "val/requests_per_answer": 1.02}],
    )
    write_log(
        dense,
        0,
        [
            {
                "step": 1,
                "val/accuracy": 0.55,
                "val/frames_16/accuracy": 0.30,
                "val/frames_64/accuracy": 0.41,
                "val/frames_256/accuracy": 0.55,
            }
        ],
    )
    out = tmp_path / "plots" / "frames.png"
    main(["report", "frames", "--run", f"tool use={tool}", "--run", f"dense={dense}", "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = out.with_suffix(".md").read_text()
    assert "| tool use | 31.5 | 62.0% | 62.0% | 1.02 |" in table
    assert [line.split("|")[2].strip() for line in table.splitlines() if "| dense |" in line] == [
        "16.0",
        "64.0",
        "256.0",
    ]
    with pytest.raises(SystemExit, match="no frames per answer"):
        write_log(tmp_path / "plain", 0, [{"step": 1, "val/accuracy": 0.5}])
        main(["report", "frames", "--run", f"plain={tmp_path / 'plain'}", "--out", str(out)])


def test_frames_report_averages_a_name_given_once_per_seed(tmp_path: Path) -> None:
    def sweep(folder: Path, at_16: float, at_256: float, counts: tuple[int, int] = (16, 256)) -> Path:
        write_log(
            folder,
            0,
            [
                {
                    "step": 1,
                    "val/accuracy": at_256,
                    f"val/frames_{counts[0]}/accuracy": at_16,
                    f"val/frames_{counts[1]}/accuracy": at_256,
                }
            ],
        )
        return folder

    tool = []
    for seed, (frames, accuracy) in enumerate([(30.0, 0.50), (34.0, 0.75)]):
        tool.append(tmp_path / f"tool{seed}")
        write_log(
            tool[-1],
            0,
            [
                {
                    "step": 1,
                    "val/accuracy": accuracy,
                    "val/frames_per_answer": frames,
                    "val/requests_per_answer": 1.0 + seed,
                }
            ],
        )
    dense = [sweep(tmp_path / "d0", 0.25, 0.25), sweep(tmp_path / "d1", 0.5, 0.375)]
    out = tmp_path / "frames.png"
    runs = [arg for folder in tool for arg in ("--run", f"tool={folder}")]
    runs += [arg for folder in dense for arg in ("--run", f"dense={folder}")]
    main(["report", "frames", *runs, "--chance", "0.25", "--out", str(out)])
    table = out.with_suffix(".md").read_text()
    assert "| tool | 32.0 | 62.5% | 50.0%, 75.0% | 1.50 |" in table
    assert "| dense | 16.0 | 37.5% | 25.0%, 50.0% | - |" in table
    assert "| dense | 256.0 | 31.2% | 25.0%, 37.5% | - |" in table
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A seed evaluated at other frame counts cannot be averaged with the rest: refused by name.
    odd = sweep(tmp_path / "d2", 0.5, 0.5, counts=(16, 64))
    with pytest.raises(SystemExit, match=r"dense=.*different frame counts"):
        main(["report", "frames", *runs, "--run", f"dense={odd}", "--out", str(out)])


def test_compare_shows_where_tool_answers_looked(tmp_path: Path, capsys) -> None:
    tool, dense = tmp_path / "tool", tmp_path / "dense"
    where = {"val/span_hit_rate": 0.25, "val/span_coverage": 0.3125}
    write_log(
        tool,
        0,
        [{"val/accuracy": 0.5, "val/frames_per_answer": 40.0, "val/requests_per_answer": 1.5, **where}],
    )
    write_log(dense, 0, [{"val/accuracy": 0.25}])
    main(["report", "compare", "--run", f"tool={tool}", "--run", f"dense={dense}"])
    table = capsys.readouterr().out
    assert "| requests covering half the answer's stretch | 25.0% | - |" in table
    assert "| share of the answer's stretch served (mean) | 31.2% | - |" in table


def test_span_hits_of_tool_runs_are_compared_question_by_question(tmp_path: Path, capsys) -> None:
    # Hits before/after on 12 questions: found only after on q0-q5 (6), only before on q6 (1);
    # exact McNemar: 2 * (C(7,0) + C(7,1)) / 2^7 = 16 / 128 = 0.125. q11 has no span_hit (a
    # malformed episode logs none) and is left out of the span pairing, not of the answers'.
    before = [{**record(f"q{i}", f"k{i}", True), "span_hit": i in (6, 7)} for i in range(11)]
    after = [{**record(f"q{i}", f"k{i}", True), "span_hit": i < 8 and i != 6} for i in range(11)]
    before.append({**record("q11", "k11", True), "span_hit": None})
    after.append(record("q11", "k11", True))
    for name, records in (("sft", before), ("grpo", after)):
        write_log(tmp_path / name, 0, [{"val/accuracy": 1.0}])
        write_records(tmp_path / name, records)
    main(["report", "compare", "--run", f"SFT={tmp_path / 'sft'}", "--run", f"GRPO={tmp_path / 'grpo'}"])
    out = capsys.readouterr().out
    assert "GRPO vs SFT, same 12 questions: +0.0%" in out
    assert (
        "- span hit, GRPO vs SFT, same 11 questions: +45.5% (6 found only by GRPO, 1 only by SFT); "
        "exact McNemar p = 0.12\n" in out
    )
    # Runs that requested nothing print no span line.
    write_records(tmp_path / "dense", [record(f"q{i}", f"k{i}", True) for i in range(12)])
    write_log(tmp_path / "dense", 0, [{"val/accuracy": 1.0}])
    main(["report", "compare", "--run", f"SFT={tmp_path / 'sft'}", "--run", f"D={tmp_path / 'dense'}"])
    assert "span hit" not in capsys.readouterr().out
