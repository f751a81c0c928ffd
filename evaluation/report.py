"""The evaluation report of one validation: a JSON summary, a markdown table and a bar chart.

Built from the :class:`~evaluation.evaluator.ValidationResult` of each validation dataloader
(a frame-count sweep has several): per frame count, multiple-choice accuracy overall and per
category, the format rate, the number of unparseable answers and the constant-letter
baselines, which must sit beside any score on a skewed key (all over the multiple-choice
questions); then, when the evaluation had them, the numeric questions' accuracy, the
open-ended questions a judge scored, and how many questions were not scored.
:class:`callbacks.evaluation.EvaluationReport` writes them after every validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evaluation.evaluator import ValidationResult
from evaluation.metrics import UNCATEGORISED
from evaluation.tables import Column, Table, render_table

CATEGORY_PREFIX = "accuracy/"


def evaluation_summary(results: list[ValidationResult], model: str, step: int) -> dict[str, Any]:
    """The JSON report: one entry per frame count with every score the table shows."""
    evaluations = []
    for result in results:
        scores = result.scores
        categories = {
            key[len(CATEGORY_PREFIX) :]: {
                "accuracy": value,
                "count": int(scores[f"count/{key[len(CATEGORY_PREFIX) :]}"]),
            }
            for key, value in scores.items()
            if key.startswith(CATEGORY_PREFIX)
        }
        evaluations.append(
            {
                "frames": result.frames,
                # Multiple-choice questions (what "accuracy" and the baselines are over).
                "questions": int(scores["count"]),
                "all_questions": int(scores.get("questions", scores["count"])),
                "accuracy": scores["accuracy"],
                "per_category": categories,
                "sampled_accuracy": scores.get("sampled_accuracy"),
                "format_rate": scores["format_rate"],
                "reasoning_agreement": scores.get("reasoning_agreement"),
                "unparseable": int(scores.get("unparseable", 0)),
                "constant_letter_baselines": {
                    key.split("/", 1)[1]: value
                    for key, value in scores.items()
                    if key.startswith("baseline/")
                },
                "best_constant_letter": scores["constant_letter_baseline"],
                "numeric": _typed(scores, "numeric_accuracy", "numeric_count"),
                "open_ended_judged": _typed(scores, "open_ended_accuracy", "open_ended_judged"),
                "not_scored": int(scores.get("not_scored", 0)),
            }
        )
    return {"model": model, "step": step, "evaluations": evaluations}


def _typed(scores: dict[str, float], accuracy: str, count: str) -> dict[str, Any] | None:
    """``{"accuracy", "count"}`` of one other problem type, None when the evaluation had none."""
    if accuracy not in scores:
        return None
    return {"accuracy": scores[accuracy], "count": int(scores[count])}


def column_name(evaluation: dict[str, Any]) -> str:
    """How a table or chart names one evaluation: its frame count, if it had one."""
    return f"{evaluation['frames']} frames" if evaluation["frames"] else "accuracy"


def markdown_table(summary: dict[str, Any]) -> str:
    """Categories (with question counts) by frame count, then overall, the other problem types,
    format, unparseable, baselines (categories, overall and baselines over multiple choice)."""
    evaluations = summary["evaluations"]
    categories: list[str] = []
    for evaluation in evaluations:
        categories += [c for c in evaluation["per_category"] if c not in categories]
    categories.sort(key=lambda c: (c == UNCATEGORISED, c))
    columns = [Column("", "left"), Column("n"), *(Column(column_name(e)) for e in evaluations)]
    rows: list[tuple[str, ...]] = []
    for category in categories:
        counts = {e["per_category"][category]["count"] for e in evaluations if category in e["per_category"]}
        cells = [
            f"{e['per_category'][category]['accuracy']:.1%}" if category in e["per_category"] else "-"
            for e in evaluations
        ]
        rows.append((category, "/".join(map(str, sorted(counts))), *cells))
    questions = "/".join(str(n) for n in sorted({e["questions"] for e in evaluations}))
    mixed = any(e.get("all_questions", e["questions"]) > e["questions"] for e in evaluations)
    overall = "multiple choice" if mixed else "overall"
    rows.append((f"**{overall}**", questions, *(f"**{e['accuracy']:.1%}**" for e in evaluations)))
    for label, key in (("numeric", "numeric"), ("open-ended (judged)", "open_ended_judged")):
        typed = [e.get(key) for e in evaluations]
        if any(t is not None for t in typed):
            counts = "/".join(str(n) for n in sorted({t["count"] for t in typed if t is not None}))
            rows.append((label, counts, *(f"{t['accuracy']:.1%}" if t is not None else "-" for t in typed)))
    if any(e.get("not_scored") for e in evaluations):
        rows.append(("not scored", "", *(f"{e.get('not_scored', 0)} not scored" for e in evaluations)))

    def optional_rate_row(label: str, key: str) -> None:
        # Only when some evaluation measured it; "-" for those that did not.
        values = [e.get(key) for e in evaluations]
        if any(v is not None for v in values):
            rows.append((label, "", *(f"{v:.1%}" if v is not None else "-" for v in values)))

    optional_rate_row("sampled answers (mean)", "sampled_accuracy")
    rows.append(("format rate", "", *(f"{e['format_rate']:.1%}" for e in evaluations)))
    optional_rate_row("reasoning names the chosen option", "reasoning_agreement")
    rows.append(("unparseable answers", "", *(str(e["unparseable"]) for e in evaluations)))
    for letter in evaluations[0]["constant_letter_baselines"]:
        cells = [f"{e['constant_letter_baselines'].get(letter, 0.0):.1%}" for e in evaluations]
        rows.append((f"always {letter}", "", *cells))
    return render_table(Table(columns, rows)) + "\n"


def bar_chart(summary: dict[str, Any], out: Path) -> None:
    """Accuracy per category and overall, one bar per frame count, the best constant letter dashed."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    evaluations = summary["evaluations"]
    groups: list[str] = []
    for evaluation in evaluations:
        groups += [c for c in evaluation["per_category"] if c not in groups]
    groups.append("overall")
    width = 0.8 / len(evaluations)
    figure, axes = plt.subplots(figsize=(1.6 * len(groups) + 2, 4))
    for i, evaluation in enumerate(evaluations):
        values = [
            evaluation["accuracy"]
            if group == "overall"
            else evaluation["per_category"].get(group, {}).get("accuracy", 0.0)
            for group in groups
        ]
        positions = [g + (i - (len(evaluations) - 1) / 2) * width for g in range(len(groups))]
        axes.bar(positions, [100 * v for v in values], width, label=column_name(evaluation))
    baseline = max(e["best_constant_letter"] for e in evaluations)
    axes.axhline(100 * baseline, color="black", linestyle="--", linewidth=1, label="best constant letter")
    axes.set_xticks(range(len(groups)), groups)
    axes.set_ylabel("accuracy (%)")
    axes.set_ylim(0, 100)
    axes.set_title(f"{summary['model']} (step {summary['step']})", fontsize=9)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    plt.close(figure)
