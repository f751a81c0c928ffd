"""Multiple-choice scores: accuracy per category, format rate, constant-letter baseline."""

import pytest
import torch

from evaluation.metrics import MultipleChoiceScores, format_accuracy_table


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


def test_only_multiple_choice_rows_enter_accuracy_and_the_baselines():
    # Two multiple-choice rows (key B, B), two numeric, one judged, one open-ended unscored.
    metric = MultipleChoiceScores()
    metric.update(
        ["B", None, None, None, None, "A"],
        ["B", "3", "2.5", "a red car", "a cat", "B"],
        ["Plot", "Plot", None, "Spatial", None, "Spatial"],
        [True, True, False, True, True, True],
        scoring=["choice", "numeric", "numeric", "judged", "not_scored", "choice"],
        correct=[None, True, False, True, None, None],
    )
    scores = metric.compute()
    assert scores["count"] == 2 and scores["questions"] == 6
    assert scores["accuracy"] == 0.5 and scores["accuracy/Plot"] == 1.0 and scores["accuracy/Spatial"] == 0.0
    assert scores["count/Plot"] == 1 and "accuracy/Other" not in scores
    # The numeric keys "3" and "2.5" are no letters: always-B is right on both MC rows.
    assert scores["baseline/B"] == 1.0 and scores["constant_letter_baseline"] == 1.0
    assert scores["unparseable"] == 0  # an unscored or numeric row has no letter to parse
    assert (scores["numeric_accuracy"], scores["numeric_count"]) == (0.5, 2)
    assert (scores["open_ended_accuracy"], scores["open_ended_judged"]) == (1.0, 1)
    assert scores["not_scored"] == 1
    assert scores["format_rate"] == 5 / 6  # over every row
    rows = [" ".join(line.split()) for line in format_accuracy_table(scores).splitlines()]
    assert "multiple choice 2 50.0%" in rows and "numeric 2 50.0%" in rows
    assert "open-ended (judged) 1 100.0%" in rows and "not scored 1" in rows
    assert not any(row.startswith("overall") for row in rows)  # "overall" would claim every row


def test_a_scored_row_needs_its_verdict_and_a_known_scoring():
    with pytest.raises(ValueError, match="needs its verdict"):
        MultipleChoiceScores().update(["A"], ["3"], [None], [True], scoring=["numeric"])
    with pytest.raises(ValueError, match="unknown scoring 'regex'"):
        MultipleChoiceScores().update(["A"], ["A"], [None], [True], scoring=["regex"], correct=[True])


def test_states_are_sum_reduced_tensors_so_ranks_merge():
    # Two "ranks" merged as torchmetrics' sync does (each state reduced with its own function).
    ranks = [MultipleChoiceScores(), MultipleChoiceScores()]
    ranks[0].update(["A", None], ["A", "7"], [None, None], [True, True], scoring=["choice", "numeric"],
                    correct=[None, True])  # fmt: skip
    ranks[1].update(["C", None], ["B", "x"], [None, None], [True, False], scoring=["choice", "not_scored"])
    merged = MultipleChoiceScores()
    for name, reduce in merged._reductions.items():
        assert reduce is not None and reduce.__name__ == "dim_zero_sum", name
        assert isinstance(getattr(ranks[0], name), torch.Tensor), name
        setattr(merged, name, getattr(ranks[0], name) + getattr(ranks[1], name))
    merged._update_count = 1
    scores = merged.compute()
    assert (scores["count"], scores["accuracy"], scores["questions"]) == (2, 0.5, 4)
    assert (scores["numeric_count"], scores["numeric_accuracy"], scores["not_scored"]) == (1, 1.0, 1)
    assert scores["format_rate"] == 3 / 4
