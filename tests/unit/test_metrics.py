"""Multiple-choice scores: accuracy per category, format rate, constant-letter baseline."""

import pytest

from models.metrics import MultipleChoiceScores, format_accuracy_table


def test_scores_match_hand_counts():
    metric = MultipleChoiceScores()
    metric.update(
        ["A", "B", None, "C"],
        ["A", "C", "B", "C"],
        ["Temporal", "Temporal", "Plot", "Spatial"],
        [True, True, False, True],
    )
    metric.update(["B"], ["B"], [None], [False])
    scores = metric.compute()
    assert scores["accuracy"] == pytest.approx(3 / 5)
    assert scores["accuracy/Temporal"] == pytest.approx(1 / 2)
    assert scores["accuracy/Plot"] == 0.0 and scores["accuracy/Spatial"] == 1.0
    assert scores["accuracy/Other"] == 1.0
    assert scores["format_rate"] == pytest.approx(3 / 5)
    # Key letters: A, C, B, C, B -> the best constant letter (B or C) scores 2/5.
    assert scores["constant_letter_baseline"] == pytest.approx(2 / 5)
    assert "accuracy/Goal and Purpose" not in scores
    table = format_accuracy_table(scores)
    assert "Temporal" in table and "60.0%" in table and "constant letter" in table


def test_unparseable_answers_and_every_letters_baseline_are_counted():
    metric = MultipleChoiceScores()
    metric.update([None, "A", None, "B", "E"], ["B", "B", "A", "B", "E"], [None] * 5, [True] * 5)
    scores = metric.compute()
    assert scores["unparseable"] == 2
    # Key: B, B, A, B, E -> always-A 1/5, always-B 3/5, C and D 0, E 1/5 (listed: the key uses it).
    assert [scores[f"baseline/{x}"] for x in "ABCDE"] == pytest.approx([0.2, 0.6, 0.0, 0.0, 0.2])
    assert "baseline/F" not in scores and scores["constant_letter_baseline"] == pytest.approx(0.6)


def test_sampled_accuracy_is_the_mean_fraction_per_category():
    metric = MultipleChoiceScores()
    metric.update(["A", "B"], ["A", "A"], ["Plot", "Plot"], [True, True], sampled_fraction=[0.75, 0.25])
    metric.update(["C"], ["C"], ["Spatial"], [True], sampled_fraction=[0.0])
    scores = metric.compute()
    assert scores["sampled_accuracy"] == pytest.approx(1.0 / 3)
    assert scores["sampled_accuracy/Plot"] == pytest.approx(0.5) and scores["sampled_accuracy/Spatial"] == 0.0
    assert "sampled_accuracy" not in MultipleChoiceScores().compute()


def test_reasoning_agreement_counts_only_decided_questions():
    metric = MultipleChoiceScores()
    metric.update(
        ["A", "B", "C"], ["A", "A", "C"], ["Plot"] * 3, [True] * 3, reasoning_agreement=[True, False, None]
    )
    metric.update(["D"], ["D"], ["Spatial"], [True], reasoning_agreement=[True])
    scores = metric.compute()
    assert scores["reasoning_agreement"] == pytest.approx(2 / 3)
    assert scores["reasoning_decided"] == pytest.approx(3 / 4)
    assert "reasoning agrees" in format_accuracy_table(scores)
    assert "reasoning_agreement" not in MultipleChoiceScores().compute()
