"""Scoring a validation answer the way its problem type allows (the rules of :mod:`rewards`).

Multiple-choice answers are read as a letter (:func:`rewards.parsing.response_choice`),
numeric ones as a number and compared with the key as the ``numeric_accuracy`` reward does,
and open-ended ones are asked of an LLM judge (:class:`rewards.judge.JudgeClient`, the client
of the ``judged_accuracy`` reward) when one is configured. What cannot be scored (an
open-ended answer without a judge, a judgement that failed, a numeric key that is not one
number) is counted as :data:`~evaluation.metrics.NOT_SCORED`, never as wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.qa import MULTIPLE_CHOICE
from evaluation.metrics import CHOICE, JUDGED, NOT_SCORED, NUMERIC
from rewards.functions import NUMERICAL, answer_kind, numeric_accuracy_reward, parse_number
from rewards.judge import JudgeClient
from rewards.parsing import extract_answer, response_choice

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AnswerScore:
    """One greedy answer, scored."""

    scoring: str
    """:data:`~evaluation.metrics.CHOICE`, ``NUMERIC``, ``JUDGED`` or ``NOT_SCORED``."""
    predicted: str | float | None
    """The letter, the number or the answer text read out of the response (None: none)."""
    correct: bool | None
    """The verdict; None when not scored."""
    note: str = ""
    """Why a row was not scored, or the judge's reply."""


def score_answers(
    completions: Sequence[str], metas: Sequence[dict[str, Any]], judge: JudgeClient | None = None
) -> list[AnswerScore]:
    """Score each completion against its row's key (``metas`` as the collator writes them).

    Open-ended answers of the whole batch go to ``judge`` together (it asks concurrently); an
    open-ended response without a single ``<answer>`` block is wrong without asking, as in
    the ``judged_accuracy`` reward.
    """
    scores: list[AnswerScore | None] = []
    to_judge: list[int] = []
    for i, (completion, meta) in enumerate(zip(completions, metas, strict=True)):
        kind = answer_kind(meta.get("problem_type"))
        if kind == MULTIPLE_CHOICE:
            options = meta["options"]
            letter = response_choice(completion, len(options) or 4, options)
            scores.append(AnswerScore(CHOICE, letter, letter == meta["answer"]))
        elif kind == NUMERICAL:
            scores.append(_numeric(completion, meta))
        else:
            text = extract_answer(completion)
            if judge is None:
                scores.append(AnswerScore(NOT_SCORED, text, None, "open-ended, no judge configured"))
            elif not text:
                scores.append(AnswerScore(JUDGED, text, False, "no single <answer> block"))
            else:
                scores.append(None)
                to_judge.append(i)
    if to_judge:
        assert judge is not None
        items = [
            (str(metas[i].get("problem", "")), metas[i]["answer"], extract_answer(completions[i]) or "")
            for i in to_judge
        ]
        judgements = judge.judge(items, [str(metas[i]["key"]) for i in to_judge])
        for i, (_, _, text), judgement in zip(to_judge, items, judgements, strict=True):
            scores[i] = (
                AnswerScore(JUDGED, text, judgement.score == 1.0, judgement.detail)
                if judgement.ok
                else AnswerScore(NOT_SCORED, text, None, f"judgement failed: {judgement.detail}")
            )
    return [score for score in scores if score is not None]


def _numeric(completion: str, meta: dict[str, Any]) -> AnswerScore:
    text = extract_answer(completion)
    value = None if text is None else parse_number(text)
    try:
        (reward,) = numeric_accuracy_reward([completion], answer=[meta["answer"]])
    except ValueError as err:  # the key is not one number: a data bug, reported, not scored
        log.warning("sample %r: numeric row not scored: %s", meta.get("key"), err)
        return AnswerScore(NOT_SCORED, value, None, str(err))
    return AnswerScore(NUMERIC, value, reward == 1.0)
