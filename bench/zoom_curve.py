"""A tool GRPO run's learning curve on the zoom task, from its CSV log: the sampled episodes' span
hit rate, accuracy, format rate and requests per episode in blocks of steps (and the KL to the
start, when the run has a KL term), and the comparison the GRPO recipes are judged by: the mean
span hit of the last ``--window`` steps against the first ``--window`` (each step's rate is over
its 64 episodes, so the spread of the per-step values is what one step's sample of episodes
gives).

Usage: python bench/zoom_curve.py METRICS [--block 25] [--window 50] [--out FILE.md]

``METRICS`` is a ``metrics.csv`` (or ``.csv.gz``, as saved results keep it) or a CSV logger's
folder of ``version_N`` attempts (a run and its resumptions: :func:`bench.grpo_runs.column`).
The markdown starts with the command, commit, machine and date that wrote it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grpo_runs import column, markdown
from evaluation.provenance import provenance

SPAN_HIT, ACCURACY = "tool/span_hit_rate", "rollout/accuracy"
FORMAT, REQUESTS, KL = "rollout/format_rate", "tool/requests_per_episode", "train/ref_kl"


@dataclass(frozen=True)
class Curve:
    """Per-step values of one run (step order; KL empty for a run without a KL term)."""

    span_hit: list[float]
    accuracy: list[float]
    format_rate: list[float]
    requests: list[float]
    kl: list[float]

    @classmethod
    def read(cls, metrics: Path) -> Curve:
        curve = cls(*(column(metrics, name) for name in (SPAN_HIT, ACCURACY, FORMAT, REQUESTS, KL)))
        per_step = (curve.span_hit, curve.accuracy, curve.format_rate, curve.requests)
        if not curve.span_hit or len({len(values) for values in per_step}) != 1:
            raise SystemExit(
                f"{metrics}: expected one {SPAN_HIT}, {ACCURACY}, {FORMAT} and {REQUESTS} per step"
            )
        return curve


def blocks_table(curve: Curve, block: int) -> str:
    """Means over consecutive blocks of ``block`` steps (the last block may be shorter)."""
    with_kl = bool(curve.kl) and any(curve.kl)
    header = ["steps", "span hit (sampled)", "accuracy (sampled)", "format rate", "requests / episode"]
    header += ["KL to the start"] if with_kl else []
    rows = []
    for first in range(0, len(curve.span_hit), block):
        last = min(first + block, len(curve.span_hit))
        row = [f"{first}-{last - 1}"]
        row += [f"{statistics.mean(values[first:last]):.3f}" for values in (curve.span_hit, curve.accuracy)]
        row.append(f"{statistics.mean(curve.format_rate[first:last]):.3f}")
        row.append(f"{statistics.mean(curve.requests[first:last]):.2f}")
        if with_kl:
            row.append(f"{statistics.mean(curve.kl[first:last]):.5f}")
        rows.append(row)
    return markdown(header, rows)


def window_line(values: list[float], window: int) -> str:
    """The first ``window`` steps' mean against the last ``window``'s, with their spreads over
    steps; a run shorter than two windows is said to be."""
    if len(values) < 2 * window:
        return f"{len(values)} steps logged: fewer than two windows of {window}, no first/last comparison"
    first, last = values[:window], values[-window:]
    return (
        f"span hit of the sampled episodes: first {window} steps {statistics.mean(first):.3f} "
        f"(sd over steps {statistics.stdev(first):.3f}), last {window} {statistics.mean(last):.3f} "
        f"({statistics.stdev(last):.3f}); difference {statistics.mean(last) - statistics.mean(first):+.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path, help="metrics.csv(.gz) or a CSV logger's folder")
    parser.add_argument("--block", type=int, default=25, help="steps per row of the table")
    parser.add_argument("--window", type=int, default=50, help="steps at each end compared")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args()
    if args.block < 1 or args.window < 1:
        parser.error("--block and --window take a positive number of steps")
    curve = Curve.read(args.metrics)
    origin = provenance(["python", "bench/zoom_curve.py", *sys.argv[1:]])
    text = "\n\n".join(
        [
            f"Written by `{origin['command']}` at {origin['commit']} on {origin['date']} "
            f"({origin['machine']['cpu']}, {origin['machine']['cores']} cores).",
            f"{len(curve.span_hit)} steps logged.",
            blocks_table(curve, args.block),
            window_line(curve.span_hit, args.window),
        ]
    )
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
