"""Summarise finished runs from their CSV logs: a training-curve plot and a before/after accuracy table.

``lvrl report curve --run runs/demo/grpo --metric reward/total_mean --out reward.png`` plots a
logged metric against the training step (raw values faint, a moving average on top);
``lvrl report compare --run SFT=runs/demo/sft-eval --run GRPO=runs/demo/grpo-eval`` prints the
last validation accuracy of each run per category, side by side (markdown, so it pastes into
a README or an issue), and, when the runs wrote per-question predictions, a paired comparison
of each run with the first one: the questions only one of them answers correctly and an exact
McNemar test, which says whether a difference is more than the luck of a small eval set (for
tool-use runs, the same for the span hit: the questions whose requests found the answer's
stretch).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from evaluation.tables import Column, Table, render_table

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

    frames = commands.add_parser(
        "frames",
        help="validation accuracy against frames seen per answer, for several runs (markdown + PNG)",
        description=(
            "Accuracy against the frames a model saw per answer: a tool-use evaluation gives one point "
            "(val/frames_per_answer: the overview plus the frames served), a frame-count sweep one "
            "point per count (val/frames_N/accuracy). Points of different runs at one frame count are "
            "drawn side by side; the table gives the exact counts."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    frames.add_argument(
        "--run",
        dest="columns",
        action="append",
        required=True,
        metavar="NAME=DIR",
        help=(
            "a series: its name and the evaluation folder; repeat. A name given several times "
            "(one folder per seed) is plotted as the mean over its folders, bars from lowest to highest"
        ),
    )
    frames.add_argument(
        "--out", type=Path, required=True, help="PNG file to write (the table goes beside it, .md)"
    )
    frames.add_argument(
        "--chance",
        type=float,
        metavar="ACCURACY",
        help="draw the accuracy of guessing as a dashed line (0.25 for four options)",
    )
    frames.set_defaults(run=run_frames)


def read_text(path: Path) -> str:
    """A text file's contents, gunzipped when its name ends with ``.gz`` (how saved results keep
    their logs and predictions small)."""
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    """Rows of every CSV log in ``run_dir`` (``csv/version_N/metrics.csv``, or ``metrics.csv.gz``),
    oldest run first."""
    logs = run_dir.glob("csv/version_*/metrics.csv*")
    paths = [p for p in logs if p.name in ("metrics.csv", "metrics.csv.gz")]
    if not paths:
        raise FileNotFoundError(f"no CSV logs under {run_dir}/csv (was the run made with a CSVLogger?)")

    def version(path: Path) -> int:
        match = re.fullmatch(r"version_(\d+)", path.parent.name)
        return int(match.group(1)) if match else -1

    rows: list[dict[str, str]] = []
    for path in sorted(paths, key=version):
        rows += list(csv.DictReader(io.StringIO(read_text(path))))
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


OTHER_TYPE_KEYS = ("val/numeric_accuracy", "val/open_ended_accuracy", "val/not_scored")


def typed_rows(columns: dict[str, dict[str, float]]) -> list[tuple[str, ...]]:
    """Rows of the problem types that are not multiple choice, each cell with its question count."""
    rows: list[tuple[str, ...]] = []
    for label, accuracy, count in (
        ("numeric", "val/numeric_accuracy", "val/numeric_count"),
        ("open-ended (judged)", "val/open_ended_accuracy", "val/open_ended_judged"),
    ):
        if any(accuracy in scores for scores in columns.values()):
            cells = [
                f"{scores[accuracy]:.1%} (n = {int(scores.get(count, 0))})" if accuracy in scores else "-"
                for scores in columns.values()
            ]
            rows.append((label, *cells))
    if any("val/not_scored" in scores for scores in columns.values()):
        cells = [f"{int(scores.get('val/not_scored', 0))} not scored" for scores in columns.values()]
        rows.append(("not scored", *cells))
    return rows


def comparison_table(columns: dict[str, dict[str, float]]) -> str:
    """Markdown table: one row per category plus overall (multiple choice), the other problem
    types with their counts, format rate and the constant-letter baseline."""
    categories = sorted(
        {
            k[len(CATEGORY_PREFIX) :]
            for scores in columns.values()
            for k in scores
            if k.startswith(CATEGORY_PREFIX)
        }
    )

    def row(label: str, key: str) -> tuple[str, ...]:
        return (label, *(f"{scores[key]:.1%}" if key in scores else "-" for scores in columns.values()))

    rows = [row(c, f"{CATEGORY_PREFIX}{c}") for c in categories]
    mixed = any(
        scores.get("val/questions", 0) > scores.get("val/count", math.inf) for scores in columns.values()
    )
    mixed = mixed or any(key in scores for scores in columns.values() for key in OTHER_TYPE_KEYS)
    rows.append(row("**multiple choice**" if mixed else "**overall**", "val/accuracy"))
    rows += typed_rows(columns)
    if any("val/sampled_accuracy" in scores for scores in columns.values()):
        rows.append(row("sampled answers (mean)", "val/sampled_accuracy"))
    rows.append(row("format rate", "val/format_rate"))
    if any("val/reasoning_agreement" in scores for scores in columns.values()):
        rows.append(row("reasoning names the chosen option", "val/reasoning_agreement"))
    if any("val/frames_per_answer" in scores for scores in columns.values()):
        rows.append(number_row(columns, "frame requests per answer", "val/requests_per_answer"))
        rows.append(number_row(columns, "frames seen per answer", "val/frames_per_answer"))
    if any("val/span_hit_rate" in scores for scores in columns.values()):
        rows.append(row("requests covering half the answer's stretch", "val/span_hit_rate"))
        rows.append(row("share of the answer's stretch served (mean)", "val/span_coverage"))
    rows.append(row("constant-letter baseline", "val/constant_letter_baseline"))
    return render_table(Table([Column("", "left"), *(Column(name) for name in columns)], rows))


def number_row(columns: dict[str, dict[str, float]], label: str, key: str) -> tuple[str, ...]:
    return (label, *(f"{scores[key]:.2f}" if key in scores else "-" for scores in columns.values()))


def last_records(run_dir: Path) -> list[dict] | None:
    """Every record of the run's last validation, None if it wrote none.

    Files are ``predictions/val-step{N}[-rank{R}].jsonl``, or the same gzip-compressed
    (``.jsonl.gz``: how saved results keep them small); the highest step wins and its rank files
    are merged (the extra files of a frame-count sweep, ``-frames{F}``, are not read).
    """
    steps: dict[int, list[Path]] = {}
    for path in (run_dir / "predictions").glob("val-step*.jsonl*"):
        match = re.fullmatch(r"val-step(\d+)(-rank\d+)?\.jsonl(\.gz)?", path.name)
        if match:
            steps.setdefault(int(match.group(1)), []).append(path)
    if not steps:
        return None
    records: list[dict] = []
    for path in sorted(steps[max(steps)]):
        records += [json.loads(line) for line in read_text(path).splitlines() if line.strip()]
    return records


@dataclass(frozen=True)
class QuestionIndex:
    """A run's records by question id, with what could not be indexed."""

    by_id: dict[str, dict]
    duplicated: dict[str, int]
    """Ids held by more than one record (each such record is left out), with their counts."""


def index_records(records: list[dict], id_field: str) -> QuestionIndex:
    """``{record[id_field]: record}``; an id on two records is ambiguous, so neither is kept."""
    counts = Counter(str(r[id_field]) for r in records)
    by_id = {str(r[id_field]): r for r in records if counts[str(r[id_field])] == 1}
    return QuestionIndex(by_id, {k: n for k, n in counts.items() if n > 1})


def pairing_field(*runs: list[dict]) -> str:
    """``problem_id`` when every record has one, else ``key`` (records written before it existed)."""
    return "problem_id" if all("problem_id" in r for records in runs for r in records) else "key"


def last_predictions(run_dir: Path) -> dict[str, bool] | None:
    """``{question id: greedy answer right}`` of the run's last scored multiple-choice answers.

    Questions are identified by ``problem_id`` (``key`` in records written before it was
    recorded); an id held by two records raises ``ValueError``.
    """
    records = last_records(run_dir)
    if records is None:
        return None
    index = index_records(records, pairing_field(records))
    if index.duplicated:
        raise ValueError(f"{run_dir}: question ids on more than one record: {_shown(index.duplicated)}")
    return {k: bool(r["correct"]) for k, r in index.by_id.items() if _scoring(r) == "choice"}


def _scoring(record: dict) -> str:
    # Records written before scoring by problem type were all scored as letters.
    return str(record.get("scoring", "choice"))


def _shown(duplicated: dict[str, int], limit: int = 5) -> str:
    items = [f"{k!r} x{n}" for k, n in sorted(duplicated.items())[:limit]]
    return ", ".join(items) + (", ..." if len(duplicated) > limit else "")


def format_p_value(p_value: float) -> str:
    """``p < 0.001`` below 0.001, else two significant digits (``p = 0.003``, ``p = 0.26``).

    >>> format_p_value(2.9e-18), format_p_value(0.0031), format_p_value(0.2614), format_p_value(1.0)
    ('p < 0.001', 'p = 0.0031', 'p = 0.26', 'p = 1')
    """
    return "p < 0.001" if p_value < 0.001 else f"p = {p_value:.2g}"


@dataclass(frozen=True)
class PairedMeans:
    """Per-question sampled accuracy (fraction of k samples right) of two runs on the same questions."""

    questions: int
    base: float
    new: float
    p_value: float
    """Two-sided paired test of the per-question differences (normal approximation: z = mean / s.e.)."""


def paired_means(base: dict[str, float], new: dict[str, float]) -> PairedMeans:
    """Compare per-question fractions on the questions both runs have."""
    shared = sorted(base.keys() & new.keys())
    n = len(shared)
    differences = [new[k] - base[k] for k in shared]
    mean = sum(differences) / max(n, 1)
    variance = sum((d - mean) ** 2 for d in differences) / max(n - 1, 1)
    if n < 2 or variance == 0:
        p_value = 1.0 if mean == 0 else 0.0
    else:
        z = mean / math.sqrt(variance / n)
        p_value = math.erfc(abs(z) / math.sqrt(2))
    base_mean = sum(base[k] for k in shared) / max(n, 1)
    return PairedMeans(n, base_mean, base_mean + mean, p_value)


@dataclass(frozen=True)
class PairedComparison:
    """Two evaluations of the same questions, question by question."""

    questions: int
    only_new: int
    """Questions the new run answers correctly and the baseline does not."""
    only_base: int
    """Questions the baseline answers correctly and the new run does not."""

    @property
    def change(self) -> float:
        """Accuracy of the new run minus the baseline's, as a fraction."""
        return (self.only_new - self.only_base) / max(1, self.questions)

    @property
    def p_value(self) -> float:
        """Exact two-sided McNemar test: the chance of a split at least this uneven if the
        two runs were equally good (each disagreement a fair coin)."""
        disagreements = self.only_new + self.only_base
        smaller = min(self.only_new, self.only_base)
        tail = sum(math.comb(disagreements, k) for k in range(smaller + 1)) / 2**disagreements
        return min(1.0, 2 * tail)


def paired_comparison(base: dict[str, bool], new: dict[str, bool]) -> PairedComparison:
    """Compare on the questions both runs answered."""
    shared = base.keys() & new.keys()
    return PairedComparison(
        questions=len(shared),
        only_new=sum(new[k] and not base[k] for k in shared),
        only_base=sum(base[k] and not new[k] for k in shared),
    )


SCORING_LABELS = {"choice": "multiple choice", "numeric": "numeric", "judged": "open-ended (judged)"}


def paired_lines(records: dict[str, list[dict] | None]) -> list[str]:
    """Markdown bullets per run after the first, compared with the first on shared questions.

    Questions are paired on ``problem_id`` (on ``key`` when a run's records predate it, which
    is said), per scoring: multiple-choice, numeric and judged open-ended answers each get an
    exact McNemar test of the greedy answers; when both runs sampled, the sampled accuracy of
    the multiple-choice questions gets a paired test; when both runs requested frames, whether the
    requests found the answer's stretch (``span_hit``) gets an exact McNemar test too. An id held
    by two records of one run cannot be paired: those records are left out, counted and named.
    """
    (base_name, base), *others = records.items()
    lines = []
    for name, new in others:
        if base is None or new is None:
            missing = base_name if base is None else name
            lines.append(f"- {name} vs {base_name}: no per-question predictions for {missing}")
            continue
        field = pairing_field(base, new)
        if field == "key":
            lines.append(
                f"- {name} vs {base_name}: paired on the shard key (records without problem_id, written "
                "by an older version); a rebuilt shard set may key questions differently"
            )
        indexes = {base_name: index_records(base, field), name: index_records(new, field)}
        for run, index in indexes.items():
            if index.duplicated:
                dropped = sum(index.duplicated.values())
                lines.append(
                    f"- WARNING: {run} has {len(index.duplicated)} {field}s on more than one record "
                    f"({_shown(index.duplicated)}): its {dropped} records are left out of the pairing"
                )
        old_by_id, new_by_id = indexes[base_name].by_id, indexes[name].by_id
        for scoring, label in SCORING_LABELS.items():
            old_scored = {k: bool(r["correct"]) for k, r in old_by_id.items() if _scoring(r) == scoring}
            new_scored = {k: bool(r["correct"]) for k, r in new_by_id.items() if _scoring(r) == scoring}
            if not old_scored or not new_scored:
                continue
            paired = paired_comparison(old_scored, new_scored)
            questions = "questions" if scoring == "choice" else f"{label} questions"
            lines.append(
                f"- {name} vs {base_name}, same {paired.questions} {questions}: {paired.change:+.1%} "
                f"({paired.only_new} right only in {name}, {paired.only_base} right only in {base_name}); "
                f"exact McNemar {format_p_value(paired.p_value)}"
            )
        hits_base = {k: bool(r["span_hit"]) for k, r in old_by_id.items() if r.get("span_hit") is not None}
        hits_new = {k: bool(r["span_hit"]) for k, r in new_by_id.items() if r.get("span_hit") is not None}
        if hits_base and hits_new:  # tool-use runs: did the requests find the answer's stretch?
            paired = paired_comparison(hits_base, hits_new)
            lines.append(
                f"- span hit, {name} vs {base_name}, same {paired.questions} questions: "
                f"{paired.change:+.1%} ({paired.only_new} found only by {name}, {paired.only_base} "
                f"only by {base_name}); exact McNemar {format_p_value(paired.p_value)}"
            )
        sampled_base = {k: r["sampled_correct"] for k, r in old_by_id.items() if "sampled_correct" in r}
        sampled_new = {k: r["sampled_correct"] for k, r in new_by_id.items() if "sampled_correct" in r}
        if sampled_base and sampled_new:
            means = paired_means(sampled_base, sampled_new)
            lines.append(
                f"- sampled answers, {name} vs {base_name}, same {means.questions} questions: "
                f"{means.base:.1%} -> {means.new:.1%} ({means.new - means.base:+.1%}); paired test "
                f"{format_p_value(means.p_value)}"
            )
    return lines


def run_compare(args: argparse.Namespace) -> None:
    columns, predictions = {}, {}
    for spec in args.columns:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"--run takes NAME=DIR, got {spec!r}")
        columns[name] = last_validation(metric_rows(Path(folder)))
        predictions[name] = last_records(Path(folder))
    table = comparison_table(columns)
    if len(columns) > 1:
        table += "\n\n" + "\n".join(paired_lines(predictions))
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")


SWEEP_ACCURACY = re.compile(r"val/frames_(\d+)/accuracy")
# (frames seen per answer, accuracy, requests per answer: None for a frame-count sweep)
Point = tuple[float, float, float | None]


def frames_points(scores: dict[str, float]) -> list[Point]:
    """``(frames seen per answer, accuracy, requests per answer)`` of one evaluation's metrics.

    >>> frames_points({"val/accuracy": 0.5, "val/frames_per_answer": 31.5, "val/requests_per_answer": 1.0})
    [(31.5, 0.5, 1.0)]
    >>> frames_points({"val/accuracy": 0.7, "val/frames_16/accuracy": 0.3, "val/frames_256/accuracy": 0.7})
    [(16.0, 0.3, None), (256.0, 0.7, None)]
    """
    if "val/frames_per_answer" in scores:
        return [
            (scores["val/frames_per_answer"], scores["val/accuracy"], scores.get("val/requests_per_answer"))
        ]
    sweep = [
        (float(m.group(1)), value) for key, value in scores.items() if (m := SWEEP_ACCURACY.fullmatch(key))
    ]
    return [(frames, accuracy, None) for frames, accuracy in sorted(sweep)]


def mean_points(name: str, runs: list[list[Point]]) -> list[tuple[Point, list[float]]]:
    """One series' points averaged over its runs (seeds), each with the runs' accuracies.

    A tool-use point averages frames, accuracy and requests; a sweep's points pair up by frame
    count, which must be the same in every run (averaging 64 frames with 256 would plot neither).

    >>> mean_points("tool", [[(30.0, 0.5, 1.0)], [(32.0, 0.7, 1.2)]])
    [((31.0, 0.6, 1.1), [0.5, 0.7])]
    """
    shapes = {tuple(f if r is None else "tool" for f, _, r in points) for points in runs}
    if len(shapes) != 1:
        raise SystemExit(f"--run {name}=...: its folders measured different frame counts: {sorted(shapes)}")
    averaged = []
    for at in zip(*runs, strict=True):
        accuracies = [accuracy for _, accuracy, _ in at]
        requests = [r for _, _, r in at if r is not None]
        point = (
            sum(f for f, _, _ in at) / len(at),
            sum(accuracies) / len(at),
            sum(requests) / len(requests) if requests else None,
        )
        averaged.append((point, accuracies))
    return averaged


def spread_sideways(series_frames: list[list[float]], step: float = 0.06) -> list[list[float]]:
    """Where points of different series sit at (nearly) one frame count, their plotted x is
    spread by factors of ``2 ** step`` around it, in series order, so that no point hides
    another (tool-use runs all see ~32 frames); the table keeps the true counts.

    >>> spread_sideways([[32.0], [32.0], [16.0, 256.0]], step=1.0)
    [[22.627416997969522], [45.254833995939045], [16.0, 256.0]]
    >>> spread_sideways([[32.0, 33.0], [64.0]])  # close points of one series stay where they are
    [[32.0, 33.0], [64.0]]
    """
    placed = [list(frames) for frames in series_frames]
    points = sorted(
        (math.log2(x), i, j) for i, frames in enumerate(series_frames) for j, x in enumerate(frames)
    )
    clusters: list[list[tuple[float, int, int]]] = []
    for point in points:
        if clusters and point[0] - clusters[-1][-1][0] < step:
            clusters[-1].append(point)
        else:
            clusters.append([point])
    for cluster in clusters:
        if len({i for _, i, _ in cluster}) < 2:
            continue
        centre = sum(log_x for log_x, _, _ in cluster) / len(cluster)
        for rank, (_, i, j) in enumerate(sorted(cluster, key=lambda point: point[1])):
            placed[i][j] = 2 ** (centre + step * (rank - (len(cluster) - 1) / 2))
    return placed


def run_frames(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[list[Point]]] = {}
    for spec in args.columns:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"--run takes NAME=DIR, got {spec!r}")
        points = frames_points(last_validation(metric_rows(Path(folder))))
        if not points:
            raise SystemExit(
                f"{folder}: no frames per answer: evaluate with val_tool_use or a val_num_frames sweep"
            )
        series.setdefault(name, []).append(points)
    figure, axis = plt.subplots(figsize=(6, 4))
    rows = []
    averages = {name: mean_points(name, runs) for name, runs in series.items()}
    plotted = spread_sideways([[f for (f, _, _), _ in averaged] for averaged in averages.values()])
    for (name, averaged), frames in zip(averages.items(), plotted, strict=True):
        runs = series[name]
        accuracy = [a for (_, a, _), _ in averaged]
        below = [a - min(each) for (_, a, _), each in averaged]
        above = [max(each) - a for (_, a, _), each in averaged]
        label = name if len(runs) == 1 else f"{name} (mean of {len(runs)})"
        bars = [below, above] if len(runs) > 1 else None
        axis.errorbar(frames, accuracy, yerr=bars, marker="o", capsize=3, label=label)
        for (seen, mean, requests), each in averaged:
            asked = "-" if requests is None else f"{requests:.2f}"
            per_run = ", ".join(f"{a:.1%}" for a in each)
            rows.append((name, f"{seen:.1f}", f"{mean:.1%}", per_run, asked))
    if args.chance is not None:
        axis.axhline(args.chance, color="grey", linestyle="--", linewidth=1, label="chance")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("frames seen per answer")
    axis.set_ylabel("held-out accuracy")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120)
    columns = [
        Column("run", "left"),
        Column("frames seen"),
        Column("accuracy"),
        Column("per folder"),
        Column("requests"),
    ]
    table = render_table(Table(columns, rows))
    args.out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
