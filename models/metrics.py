"""Multiple-choice evaluation metrics (torchmetrics, so they sync across data-parallel ranks)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

from datamodules.rows import CATEGORIES, OPTION_LETTERS

UNCATEGORISED = "Other"


class MultipleChoiceScores(Metric):
    """Accuracy overall and per category, format rate, unparseable answers, constant-letter baselines.

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
        self.add_state("well_formed", default=torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")
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
        sampled_fraction: Sequence[float] | None = None,
        reasoning_agreement: Sequence[bool | None] | None = None,
    ) -> None:
        """Add questions: greedy choice, key, category, format; optionally the right fraction of
        samples and whether each reasoning names the chosen option (None: undecided)."""
        fractions = sampled_fraction if sampled_fraction is not None else [None] * len(answers)
        agreements = reasoning_agreement if reasoning_agreement is not None else [None] * len(answers)
        for pred, answer, category, formed, fraction, agrees in zip(
            predicted, answers, categories, well_formed, fractions, agreements, strict=True
        ):
            if agrees is not None:
                self.decided += 1
                self.agreeing += int(agrees)
            index = (
                self.categories.index(category) if category in self.categories else len(self.categories) - 1
            )
            self.total[index] += 1
            self.correct[index] += int(pred is not None and pred == answer)
            self.well_formed[index] += int(formed)
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
            "format_rate": float(self.well_formed.sum()) / max(total, 1),
            "constant_letter_baseline": float(self.key_letters.max()) / max(total, 1),
            "count": float(total),
            "unparseable": float(self.unparsed.sum()),
        }
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


def format_accuracy_table(scores: dict[str, float], title: str = "Validation") -> str:
    """A plain-text table of per-category accuracy, the overall score and the baseline."""
    rows = [
        (k.split("/", 1)[1], v, int(scores.get(f"count/{k.split('/', 1)[1]}", 0)))
        for k, v in scores.items()
        if k.startswith("accuracy/")
    ]
    width = max([len("category"), *(len(name) for name, _, _ in rows)])
    lines = [title, f"{'category':<{width}}  {'n':>5}  accuracy", "-" * (width + 17)]
    lines += [f"{name:<{width}}  {n:>5}  {acc:8.1%}" for name, acc, n in rows]
    lines.append("-" * (width + 17))
    lines.append(f"{'overall':<{width}}  {int(scores['count']):>5}  {scores['accuracy']:8.1%}")
    if "sampled_accuracy" in scores:
        lines.append(f"{'sampled (mean)':<{width}}  {'':>5}  {scores['sampled_accuracy']:8.1%}")
    lines.append(f"{'format rate':<{width}}  {'':>5}  {scores['format_rate']:8.1%}")
    if "reasoning_agreement" in scores:
        lines.append(f"{'reasoning agrees':<{width}}  {'':>5}  {scores['reasoning_agreement']:8.1%}")
    lines.append(f"{'unparseable':<{width}}  {int(scores.get('unparseable', 0)):>5}")
    lines.append(f"{'constant letter':<{width}}  {'':>5}  {scores['constant_letter_baseline']:8.1%}")
    return "\n".join(lines)
