"""`lvrl report`: curves and before/after tables read from a run's CSV logs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from app.cli import main
from app.commands.report import comparison_table, last_validation, metric_rows, metric_series, moving_average


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
