"""Released LongVideo-Reason rows -> QARow: embedded options, answer forms, reject reasons."""

import time

import pytest

from datatools.released import RowRejected, TextLimits, normalise_released_row, split_embedded_options


@pytest.mark.parametrize(
    ("problem", "question", "options"),
    [
        ("Which colour?\nA. red\nB. blue\nC. green", "Which colour?", ("red", "blue", "green")),
        ("Which colour?\n(A) red\n(B) blue", "Which colour?", ("red", "blue")),
        ("Which colour?\nOptions:\nA) red\nB) blue", "Which colour?", ("red", "blue")),
        (
            "Which colour?\nA: red\nB: light blue, almost grey",
            "Which colour?",
            ("red", "light blue, almost grey"),
        ),
        ("Which colour? (A) red (B) blue (C) green", "Which colour?", ("red", "blue", "green")),
        (
            "Who is A. Smith? Choices: A. the cook B. the driver",
            "Who is A. Smith?",
            ("the cook", "the driver"),
        ),
        # An instruction after the block stays with the question.
        ("Why?\nA. x\nB. y\nAnswer with the letter.", "Why?\nAnswer with the letter.", ("x", "y")),
        # Not option lists: a lone letter, letters out of order.
        ("Is plan A better?", "Is plan A better?", ()),
        ("Pick\nB. x\nA. y", "Pick\nB. x\nA. y", ()),
    ],
)
def test_embedded_options_are_split_out(problem, question, options):
    assert split_embedded_options(problem) == (question, options)


def _released(**changes):
    row = {
        "problem_id": "q1",
        "data_type": "video",
        "videos": "v.mp4",
        "problem": "Which?\nA. x\nB. y\nC. z\nD. w",
        "problem_type": "multiple choice",
        "reasoning": " It is y. ",
        "answer": "<answer>B</answer>",
    }
    row.update(changes)
    return row


@pytest.mark.parametrize(
    "answer", ["<answer>B</answer>", "<answer> B. </answer>", "<answer>(B)</answer>", "B"]
)
def test_answer_forms_of_the_release_normalise_to_the_letter(answer):
    row = normalise_released_row(_released(answer=answer))
    assert row.answer == "B" and row.options == ("x", "y", "z", "w") and row.problem == "Which?"
    assert row.reasoning == "It is y." and row.extra["source_problem"].startswith("Which?\nA. x")


def test_given_options_and_categories_are_kept():
    row = normalise_released_row(_released(problem="Which?", options=["x", "y"], category="goal and purpose"))
    assert row.options == ("x", "y") and row.category == "Goal and Purpose"
    odd = normalise_released_row(_released(category="Counting", videos=["v.mp4"]))
    assert odd.category is None and odd.extra["source_category"] == "Counting" and odd.video == "v.mp4"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"answer": "<answer>E</answer>"}, "answer_not_an_option"),
        ({"answer": "<answer>B or C</answer>"}, "answer_not_an_option"),
        ({"answer": "<answer></answer>"}, "no_answer"),
        ({"answer": None}, "no_answer"),
        ({"answer": "<answer>A</answer><answer>B</answer>"}, "malformed"),
        ({"problem": "Which one?"}, "no_options"),
        ({"data_type": "image"}, "not_video"),
        ({"problem_id": ""}, "malformed"),
        ({"videos": 3}, "malformed"),
        ({"reasoning": ["a"]}, "malformed"),
    ],
)
def test_unusable_rows_are_rejected_with_a_reason(changes, reason):
    with pytest.raises(RowRejected) as caught:
        normalise_released_row(_released(**changes))
    assert caught.value.reason == reason and str(caught.value)


def test_open_ended_rows_keep_free_text_answers():
    row = normalise_released_row(
        _released(problem_type="Open-Ended", problem="What happens?", answer="<answer>It falls.</answer>")
    )
    assert row.problem_type == "open-ended" and row.answer == "It falls." and row.options == ()


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        # Wrong types are rejected, never converted: a null option is not the option "None".
        ({"problem": "Which?", "options": ["x", None]}, "malformed"),
        ({"problem": "Which?", "options": ["x", 3]}, "malformed"),
        ({"problem": "Which?", "options": ["x", ["y"]]}, "malformed"),
        ({"problem": "Which?", "options": "A. x B. y"}, "malformed"),
        ({"problem": "Which?", "options": {"A": "x"}}, "malformed"),
        ({"answer": 2}, "malformed"),
        ({"answer": ["<answer>B</answer>"]}, "malformed"),
        ({"reasoning": 0}, "malformed"),
        ({"reasoning": False}, "malformed"),
        ({"data_type": None}, "malformed"),
        ({"problem_id": ["q1"]}, "malformed"),  # only 'videos' may be a one-element list
        ({"problem_type": 1}, "malformed"),
        # Lengths.
        ({"problem": "Which?", "options": [f"o{i}" for i in range(11)]}, "too_long"),
        ({"problem": "Q" * 4_001 + "\nA. x\nB. y"}, "too_long"),
        ({"problem": "Which?\nA. " + "x" * 1_001 + "\nB. y"}, "too_long"),
        ({"reasoning": "r" * 20_001}, "too_long"),
        ({"problem_id": "i" * 1_001}, "too_long"),
        ({"problem": "(A) x " * 100_000}, "too_long"),  # refused before the option split reads it
    ],
)
def test_wrong_types_and_lengths_are_rejected(changes, reason):
    with pytest.raises(RowRejected) as caught:
        normalise_released_row(_released(**changes))
    assert caught.value.reason == reason and str(caught.value)


def test_limits_are_inclusive_and_configurable():
    limits = TextLimits(question_chars=10, reasoning_chars=5, option_chars=3, answer_chars=20)
    row = normalise_released_row(_released(problem="Q" * 10, options=["abc", "d"], reasoning="12345"), limits)
    assert row.problem == "Q" * 10 and row.options == ("abc", "d")
    with pytest.raises(RowRejected, match="reasoning has 6 characters; at most 5"):
        normalise_released_row(_released(problem="Q", options=["a", "b"], reasoning="123456"), limits)
    with pytest.raises(ValueError, match="positive"):
        TextLimits(question_chars=0)


def test_ten_options_are_split_and_an_eleventh_marker_does_not_crash():
    letters = "ABCDEFGHIJ"
    inline = "Which? " + " ".join(f"({letter}) {letter.lower()}" for letter in letters) + " (A) again"
    question, options = split_embedded_options(inline)
    assert question == "Which?" and options[:9] == tuple(letters.lower()[:9]) and len(options) == 10


@pytest.mark.parametrize(
    "problem",
    [
        "Q\nA." + " " * 200_000 + "x" + " " * 200_000 + "y\nB. z",
        "Q\n" + "\t" * 400_000 + "\nA. x\nB. y",
        "A. " * 130_000,
        "Q " + "(A) " * 100_000 + "(B) x",
    ],
)
def test_option_splitting_takes_linear_time_on_pathological_text(problem):
    # The earlier patterns backtracked quadratically (tens of minutes on these); now well under a second
    # (the bar is 100x that, so machine speed and load cannot change the verdict).
    start = time.perf_counter()
    split_embedded_options(problem)
    assert time.perf_counter() - start < 30
