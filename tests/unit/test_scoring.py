"""Validation answers scored by problem type: letters, numbers, the judge, or counted as not scored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evaluation.metrics import CHOICE, JUDGED, NOT_SCORED, NUMERIC, MultipleChoiceScores
from evaluation.scoring import score_answers
from rewards.judge import JudgeClient, JudgeSettings

SERVER = Path(__file__).resolve().parents[1] / "helpers" / "judge_server.py"


def meta(problem_type: str, answer: str, key: str, options: list[str] | None = None) -> dict:
    return {
        "key": key,
        "problem_id": key,
        "problem": "What is shown?",
        "problem_type": problem_type,
        "answer": answer,
        "options": options or [],
        "category": None,
    }


ROWS = [
    (meta("multiple choice", "B", "mc-right", ["red", "blue"]), "<think>x</think><answer>(B)</answer>"),
    (meta("Multiple-Choice", "A", "mc-wrong"), "<answer>C</answer>"),
    (meta("numerical", "1000", "num-right"), "<answer>1,000 frames</answer>"),
    (meta("numeric", "2.5", "num-wrong"), "<answer>3 or 2.5</answer>"),
    (meta("numerical", "about three", "num-bad-key"), "<answer>3</answer>"),
    (meta("open-ended", "a red car", "open-right"), "<answer>A red car, parked.</answer>"),
    (meta("OCR", "STOP", "open-wrong"), "<answer>GO</answer>"),
    (meta("open-ended", "a red car", "open-no-answer"), "a red car"),
]


def test_without_a_judge_open_ended_rows_are_not_scored() -> None:
    scored = score_answers([c for _, c in ROWS], [m for m, _ in ROWS])
    assert [(s.scoring, s.predicted, s.correct) for s in scored] == [
        (CHOICE, "B", True),
        (CHOICE, "C", False),
        (NUMERIC, 1000.0, True),
        (NUMERIC, None, False),  # two different numbers: no answer, as in the reward
        (NOT_SCORED, 3.0, None),  # the key is no number: a data bug, not a wrong answer
        (NOT_SCORED, "A red car, parked.", None),
        (NOT_SCORED, "GO", None),
        (NOT_SCORED, None, None),
    ]
    assert "not a single number" in scored[4].note and "no judge" in scored[5].note


@pytest.fixture()
def judge() -> JudgeClient:
    process = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
        yield JudgeClient(JudgeSettings(f"http://127.0.0.1:{port}/v1", "judge", timeout_s=10, max_retries=0))
    finally:
        process.kill()
        process.wait()


def test_a_configured_judge_scores_open_ended_rows_and_the_metric_counts_each_type(judge) -> None:
    rows = [*ROWS, (meta("open-ended", "a cat", "open-failed"), "<answer>a cat, GARBAGE</answer>")]
    scored = score_answers([c for _, c in rows], [m for m, _ in rows], judge)
    by_key = {m["key"]: s for (m, _), s in zip(rows, scored, strict=True)}
    assert (by_key["open-right"].scoring, by_key["open-right"].correct) == (JUDGED, True)
    assert (by_key["open-wrong"].scoring, by_key["open-wrong"].correct) == (JUDGED, False)
    # No <answer> block: wrong without asking (the judge saw only the two answers above and GARBAGE).
    assert (by_key["open-no-answer"].scoring, by_key["open-no-answer"].correct) == (JUDGED, False)
    # A reply that is no verdict is a failed judgement: not scored, and the record says why.
    assert by_key["open-failed"].scoring == NOT_SCORED and "judgement failed" in by_key["open-failed"].note
    assert judge.requests == 3
    metric = MultipleChoiceScores()
    metric.update(
        [s.predicted if s.scoring == CHOICE else None for s in scored],
        [m["answer"] for m, _ in rows],
        [None] * len(rows),
        [True] * len(rows),
        scoring=[s.scoring for s in scored],
        correct=[s.correct for s in scored],
    )
    scores = metric.compute()
    assert (scores["count"], scores["accuracy"], scores["constant_letter_baseline"]) == (2, 0.5, 0.5)
    assert (scores["numeric_count"], scores["numeric_accuracy"]) == (2, 0.5)
    assert scores["open_ended_judged"] == 3 and scores["open_ended_accuracy"] == pytest.approx(1 / 3)
    assert scores["not_scored"] == 2 and scores["questions"] == 9
