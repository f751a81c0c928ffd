"""Summarise finished runs from their CSV logs: a training-curve plot and a before/after accuracy table.

``lvrl report curve --run runs/demo/grpo --metric reward/total_mean --out reward.png`` plots a
logged metric against the training step (raw values faint, a moving average on top);
``lvrl report compare --run SFT=runs/demo/sft-eval --run GRPO=runs/demo/grpo-eval`` prints the
last validation accuracy of each run per category, side by side (markdown, so it pastes into
a README or an issue).
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

CATEGORY_PREFIX = "val/accuracy/"


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``report`` sub-commands to ``parser``."""
    commands = parser.add_subparsers(dest="report_command", required=True)
    curve = commands.add_parser(
        "curve",
        help="plot logged metrics of a run against the training step (PNG)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    curve.add_argument(
        "--run", dest="run_dir", type=Path, required=True, help="run folder (trainer.default_root_dir)"
    )
    curve.add_argument(
        "--metric", action="append", required=True, help="metric name as logged; repeat for several"
    )
    curve.add_argument("--smooth", type=int, default=10, help="moving-average window, in logged points")
    curve.add_argument("--out", type=Path, required=True, help="PNG file to write")
    curve.set_defaults(run=run_curve)

    compare = commands.add_parser(
        "compare",
        help="per-category validation accuracy of several runs, side by side (markdown)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    compare.add_argument(
        "--run",
        dest="columns",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help="a column: its name and the run folder whose last validation is shown; repeat",
    )
    compare.add_argument("--out", type=Path, help="also write the table to this markdown file")
    compare.set_defaults(run=run_compare)


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    """Rows of every CSV log in ``run_dir`` (``csv/version_N/metrics.csv``), oldest run first."""
    paths = list(run_dir.glob("csv/version_*/metrics.csv"))
    if not paths:
        raise FileNotFoundError(f"no CSV logs under {run_dir}/csv (was the run made with a CSVLogger?)")

    def version(path: Path) -> int:
        match = re.fullmatch(r"version_(\d+)", path.parent.name)
        return int(match.group(1)) if match else -1

    rows: list[dict[str, str]] = []
    for path in sorted(paths, key=version):
        with path.open() as f:
            rows += list(csv.DictReader(f))
    return rows


def metric_series(rows: list[dict[str, str]], metric: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of a metric; the step is ``train/global_step`` when logged, else ``step``."""
    steps, values = [], []
    for row in rows:
        if not row.get(metric):
            continue
        step = row.get("train/global_step") or row.get("step") or len(steps)
        steps.append(float(step))
        values.append(float(row[metric]))
    if not values:
        known = sorted({k for row in rows for k, v in row.items() if v})
        raise KeyError(f"metric {metric!r} was never logged; logged metrics: {', '.join(known)}")
    return steps, values


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` points (the first points average what exists so far)."""
    window = max(1, window)
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def run_curve(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = metric_rows(args.run_dir)
    figure, axes = plt.subplots(figsize=(7, 4))
    for metric in args.metric:
        steps, values = metric_series(rows, metric)
        (line,) = axes.plot(steps, values, alpha=0.25, linewidth=1)
        axes.plot(
            steps,
            moving_average(values, args.smooth),
            color=line.get_color(),
            linewidth=2,
            label=f"{metric} (mean of {args.smooth})",
        )
    axes.set_xlabel("training step")
    axes.set_title(str(args.run_dir))
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


def last_validation(rows: list[dict[str, str]]) -> dict[str, float]:
    """The metrics of the last row that holds ``val/accuracy``."""
    for row in reversed(rows):
        if row.get("val/accuracy"):
            return {k: float(v) for k, v in row.items() if k.startswith("val/") and v}
    raise KeyError("no validation results (val/accuracy) in the logs")


def comparison_table(columns: dict[str, dict[str, float]]) -> str:
    """Markdown table: one row per category plus overall, format rate and the constant-letter baseline."""
    categories = sorted(
        {
            k[len(CATEGORY_PREFIX) :]
            for scores in columns.values()
            for k in scores
            if k.startswith(CATEGORY_PREFIX)
        }
    )
    lines = ["| | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]

    def row(label: str, key: str) -> str:
        cells = [f"{scores[key]:.1%}" if key in scores else "-" for scores in columns.values()]
        return f"| {label} | " + " | ".join(cells) + " |"

    lines += [row(c, f"{CATEGORY_PREFIX}{c}") for c in categories]
    lines.append(row("**overall**", "val/accuracy"))
    lines.append(row("format rate", "val/format_rate"))
    lines.append(row("constant-letter baseline", "val/constant_letter_baseline"))
    return "\n".join(lines)


def run_compare(args: argparse.Namespace) -> None:
    columns = {}
    for spec in args.columns:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"--run takes NAME=DIR, got {spec!r}")
        columns[name] = last_validation(metric_rows(Path(folder)))
    table = comparison_table(columns)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")
