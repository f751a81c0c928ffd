"""Evaluation metrics by problem type (torchmetrics, so they sync across data-parallel ranks).

Every question is scored the way its problem type allows (:data:`SCORINGS`): multiple-choice
rows by their letter, numeric rows as numbers, open-ended rows by an LLM judge when one is
configured, and otherwise counted as not scored. Accuracy, the constant-letter baselines and
the other multiple-choice scores count multiple-choice rows only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

from core.qa import CATEGORIES, OPTION_LETTERS
from evaluation.tables import RULE, Column, Table, render_table

UNCATEGORISED = "Other"

CHOICE = "choice"
"""A multiple-choice row, scored by the letter its answer designates."""
NUMERIC = "numeric"
"""A numerical row, scored as a number (:func:`rewards.functions.numeric_accuracy_reward`)."""
JUDGED = "judged"
"""An open-ended row a judge model scored (:class:`rewards.judge.JudgeClient`)."""
NOT_SCORED = "not_scored"
"""A row nothing could score: open-ended without a judge, a failed judgement, a malformed key."""
SCORINGS = (CHOICE, NUMERIC, JUDGED, NOT_SCORED)


class MultipleChoiceScores(Metric):
    """Accuracy overall and per category, format rate, unparseable answers, constant-letter baselines.

    ``accuracy`` and everything below except ``format_rate`` count multiple-choice rows
    (scoring :data:`CHOICE`) only: an open-ended or numeric answer is no letter and its key no
    option, so it would be always wrong and skew the baselines. The others are counted apart:
    ``numeric_accuracy`` over ``numeric_count`` numeric rows, ``open_ended_accuracy`` over the
    ``open_ended_judged`` open-ended rows a judge scored, and ``not_scored`` rows (open-ended
    without a judge, failed judgements, malformed numeric keys); ``questions`` counts all rows
    and ``format_rate`` is over all of them. ``count`` is the number of multiple-choice rows.

    ``baseline/X`` is the accuracy of always answering letter X, and
    ``constant_letter_baseline`` the best of them: an answer key can be skewed (always "B"
    scores 44.1% on LongVideo-Reason's eval split), so a score means little without them.
    ``unparseable`` counts responses with no single clear choice (they score 0). When sampled
    answers are given too, ``sampled_accuracy`` is the fraction of them that are right (the
    mean of per-question fractions: what RL optimises, measured on held-out questions).
    When reasoning checks are given (:func:`rewards.parsing.reasoning_agrees`),
    ``reasoning_agreement`` is the fraction of decided ones whose reasoning names the chosen
    option, and ``reasoning_decided`` the fraction of questions that could be decided.
    """

    full_state_update = False

    def __init__(
        self, categories: Sequence[str] = CATEGORIES, num_letters: int = len(OPTION_LETTERS)
    ) -> None:
        super().__init__()
        self.categories = [*categories, UNCATEGORISED]
        self.num_letters = num_letters
        n = len(self.categories)
        self.add_state("correct", default=torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")
        # Scalars over all rows, whatever their type; each a sum over ranks.
        for name in ("questions", "well_formed", "numeric_correct", "numeric_total", "judged_correct"):
            self.add_state(name, default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        for name in ("judged_total", "not_scored"):
            self.add_state(name, default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("unparsed", default=torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("sampled_right", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("sampled_questions", default=torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("agreeing", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("decided", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state(
            "key_letters", default=torch.zeros(num_letters, dtype=torch.long), dist_reduce_fx="sum"
        )

    def update(  # type: ignore[override]
        self,
        predicted: Sequence[str | None],
        answers: Sequence[str],
        categories: Sequence[str | None],
        well_formed: Sequence[bool],
        sampled_fraction: Sequence[float | None] | None = None,
        reasoning_agreement: Sequence[bool | None] | None = None,
        scoring: Sequence[str] | None = None,
        correct: Sequence[bool | None] | None = None,
    ) -> None:
        """Add questions: greedy choice, key, category, format; optionally the right fraction of
        samples and whether each reasoning names the chosen option (None: undecided).

        ``scoring`` (default: all :data:`CHOICE`) says how each row is scored; a
        :data:`NUMERIC` or :data:`JUDGED` row takes its verdict from ``correct``, and its
        ``predicted``, fraction and reasoning check are ignored.
        """
        n = len(answers)
        fractions = sampled_fraction if sampled_fraction is not None else [None] * n
        agreements = reasoning_agreement if reasoning_agreement is not None else [None] * n
        scorings = scoring if scoring is not None else [CHOICE] * n
        verdicts = correct if correct is not None else [None] * n
        columns = (predicted, answers, categories, well_formed, fractions, agreements, scorings, verdicts)
        rows = zip(*columns, strict=True)
        for pred, answer, category, formed, fraction, agrees, how, verdict in rows:
            self.questions += 1
            self.well_formed += int(formed)
            if how in (NUMERIC, JUDGED):
                if verdict is None:
                    raise ValueError(f"a {how} row needs its verdict in `correct`")
                if how == NUMERIC:
                    self.numeric_correct += int(verdict)
                    self.numeric_total += 1
                else:
                    self.judged_correct += int(verdict)
                    self.judged_total += 1
                continue
            if how == NOT_SCORED:
                self.not_scored += 1
                continue
            if how != CHOICE:
                raise ValueError(f"unknown scoring {how!r}; expected one of {SCORINGS}")
            if agrees is not None:
                self.decided += 1
                self.agreeing += int(agrees)
            index = (
                self.categories.index(category) if category in self.categories else len(self.categories) - 1
            )
            self.total[index] += 1
            self.correct[index] += int(pred is not None and pred == answer)
            self.unparsed[index] += int(pred is None)
            if fraction is not None:
                self.sampled_right[index] += float(fraction)
                self.sampled_questions[index] += 1
            if answer in OPTION_LETTERS[: self.num_letters]:
                self.key_letters[OPTION_LETTERS.index(answer)] += 1

    def compute(self) -> dict[str, float]:  # type: ignore[override]
        total = int(self.total.sum())
        scores: dict[str, float] = {
            "accuracy": float(self.correct.sum()) / max(total, 1),
            "format_rate": float(self.well_formed) / max(int(self.questions), 1),
            "constant_letter_baseline": float(self.key_letters.max()) / max(total, 1),
            "count": float(total),
            "questions": float(self.questions),
            "unparseable": float(self.unparsed.sum()),
        }
        # The other problem types, only when the evaluation had them.
        if int(self.numeric_total):
            scores["numeric_accuracy"] = float(self.numeric_correct) / int(self.numeric_total)
            scores["numeric_count"] = float(self.numeric_total)
        if int(self.judged_total):
            scores["open_ended_accuracy"] = float(self.judged_correct) / int(self.judged_total)
            scores["open_ended_judged"] = float(self.judged_total)
        if int(self.not_scored):
            scores["not_scored"] = float(self.not_scored)
        # Letters A-D always (the usual four options), further ones when the key uses them.
        used = [i for i in range(self.num_letters) if int(self.key_letters[i])]
        for i in range(max(4, used[-1] + 1 if used else 0)):
            scores[f"baseline/{OPTION_LETTERS[i]}"] = float(self.key_letters[i]) / max(total, 1)
        sampled = int(self.sampled_questions.sum())
        if sampled:
            scores["sampled_accuracy"] = float(self.sampled_right.sum()) / sampled
        if int(self.decided):
            scores["reasoning_agreement"] = float(self.agreeing) / int(self.decided)
            scores["reasoning_decided"] = float(self.decided) / max(total, 1)
        for i, category in enumerate(self.categories):
            if int(self.total[i]):
                scores[f"accuracy/{category}"] = float(self.correct[i]) / int(self.total[i])
                scores[f"count/{category}"] = float(self.total[i])
            if int(self.sampled_questions[i]):
                scores[f"sampled_accuracy/{category}"] = float(self.sampled_right[i]) / int(
                    self.sampled_questions[i]
                )
        return scores


def other_types_present(scores: dict[str, float]) -> bool:
    """Whether an evaluation had rows that are not multiple choice (so "overall" needs a qualifier)."""
    return int(scores.get("questions", scores["count"])) > int(scores["count"])


def format_accuracy_table(scores: dict[str, float], title: str = "Validation") -> str:
    """A plain-text table of per-category accuracy, the overall score and the baseline.

    The categories, "overall" and the baselines are over multiple-choice rows; when there were
    other rows, "overall" reads "multiple choice" and the numeric, judged and unscored rows
    follow with their own counts.
    """
    rows = [
        (k.split("/", 1)[1], v, int(scores.get(f"count/{k.split('/', 1)[1]}", 0)))
        for k, v in scores.items()
        if k.startswith("accuracy/")
    ]
    overall = "multiple choice" if other_types_present(scores) else "overall"
    labels = ["category", overall, *(name for name, _, _ in rows)]
    if "open_ended_accuracy" in scores:
        labels.append("open-ended (judged)")
    # The label column fits the categories and problem types; the fixed labels below may overflow it.
    columns = [Column("category", "left", max(len(label) for label in labels)), Column("n", width=5)]
    columns.append(Column("accuracy", width=8))
    lines: list[tuple[str, ...]] = [RULE, *((name, str(n), f"{acc:.1%}") for name, acc, n in rows), RULE]
    lines.append((overall, str(int(scores["count"])), f"{scores['accuracy']:.1%}"))
    if "numeric_accuracy" in scores:
        lines.append(("numeric", str(int(scores["numeric_count"])), f"{scores['numeric_accuracy']:.1%}"))
    if "open_ended_accuracy" in scores:
        count = str(int(scores["open_ended_judged"]))
        lines.append(("open-ended (judged)", count, f"{scores['open_ended_accuracy']:.1%}"))
    if "not_scored" in scores:
        lines.append(("not scored", str(int(scores["not_scored"]))))
    if "sampled_accuracy" in scores:
        lines.append(("sampled (mean)", "", f"{scores['sampled_accuracy']:.1%}"))
    lines.append(("format rate", "", f"{scores['format_rate']:.1%}"))
    if "reasoning_agreement" in scores:
        lines.append(("reasoning agrees", "", f"{scores['reasoning_agreement']:.1%}"))
    lines.append(("unparseable", str(int(scores.get("unparseable", 0)))))
    lines.append(("constant letter", "", f"{scores['constant_letter_baseline']:.1%}"))
    return render_table(Table(columns, lines, title=title), style="text")
