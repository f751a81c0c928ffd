"""Released LongVideo-Reason rows -> QARow: embedded options, answer forms, reject reasons."""

import pytest

from datamodules.released import RowRejected, normalise_released_row, split_embedded_options


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
