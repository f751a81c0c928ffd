"""bench/zoom_curve.py: a tool GRPO run's curve from its CSV log, checked on hand-computed logs."""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import pytest

from bench.zoom_curve import Curve, blocks_table, window_line


def write_log(path: Path, rows: list[dict[str, float]]) -> Path:
    text = io.StringIO()
    writer = csv.DictWriter(text, ["step", *sorted({k for row in rows for k in row} - {"step"})])
    writer.writeheader()
    writer.writerows(rows)
    path.write_bytes(gzip.compress(text.getvalue().encode()))
    return path


def step(i: int, hit: float, kl: float | None = None) -> dict[str, float]:
    row = {"step": i, "tool/span_hit_rate": hit, "rollout/accuracy": hit / 2, "rollout/format_rate": 1.0}
    row["tool/requests_per_episode"] = 2 * hit
    return row if kl is None else {**row, "train/ref_kl": kl}


def test_blocks_and_the_first_and_last_windows(tmp_path: Path) -> None:
    # 5 steps, blocks of 2: (0.1, 0.3) -> 0.2, (0.5, 0.5) -> 0.5, (0.9) -> 0.9.
    hits = [0.1, 0.3, 0.5, 0.5, 0.9]
    curve = Curve.read(write_log(tmp_path / "m.csv.gz", [step(i, h) for i, h in enumerate(hits)]))
    table = blocks_table(curve, 2)
    assert "KL" not in table  # no KL term in this run
    assert table.splitlines()[2:] == [
        "| 0-1 | 0.200 | 0.100 | 1.000 | 0.40 |",
        "| 2-3 | 0.500 | 0.250 | 1.000 | 1.00 |",
        "| 4-4 | 0.900 | 0.450 | 1.000 | 1.80 |",
    ]
    # Windows of 2: first (0.1, 0.3) mean 0.2, sd 0.1414; last (0.5, 0.9) mean 0.7, sd 0.2828.
    assert window_line(curve.span_hit, 2) == (
        "span hit of the sampled episodes: first 2 steps 0.200 (sd over steps 0.141), "
        "last 2 0.700 (0.283); difference +0.500"
    )
    assert window_line(curve.span_hit, 3) == (
        "5 steps logged: fewer than two windows of 3, no first/last comparison"
    )


def test_a_kl_column_when_the_run_has_a_kl_term(tmp_path: Path) -> None:
    rows = [step(0, 0.25, 0.0001), step(1, 0.25, 0.0003)]
    table = blocks_table(Curve.read(write_log(tmp_path / "m.csv.gz", rows)), 25)
    assert table.splitlines()[-1] == "| 0-1 | 0.250 | 0.125 | 1.000 | 0.50 | 0.00020 |"


def test_a_log_without_the_tool_metrics_is_refused(tmp_path: Path) -> None:
    log = write_log(tmp_path / "m.csv.gz", [{"step": 0, "rollout/accuracy": 0.5}])
    with pytest.raises(SystemExit, match="expected one tool/span_hit_rate"):
        Curve.read(log)
