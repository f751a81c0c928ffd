"""Answer extraction and tolerant choice parsing (rewards/parsing.py)."""

import pytest

from rewards.parsing import (
    extract_answer,
    follows_format,
    parse_choice,
    reasoning_agrees,
    response_choice,
    stated_options,
)


@pytest.mark.parametrize(
    "text",
    [
        "B",
        "B.",
        "(B)",
        "[B]",
        "B)",
        "B: blue",
        "B) blue",
        "B. blue",
        "Option B",
        "option (B)",
        "The answer is B",
        "answer: b",
        " **B** ",
    ],
)
def test_common_letter_forms_are_accepted(text):
    assert parse_choice(text) == "B"


@pytest.mark.parametrize(
    "text", ["", "A or B", "B or C", "A and B", "Option A, option B", "E", "(E)", "none", "AB", "blue"]
)
def test_ambiguous_or_invalid_answers_are_rejected(text):
    assert parse_choice(text) is None


def test_letters_beyond_the_option_count_are_rejected():
    assert parse_choice("D", num_options=3) is None
    assert parse_choice("C", num_options=3) == "C"


def test_option_text_counts_only_when_unique():
    assert parse_choice("Blue.", options=["red", "blue", "green", "pink"]) == "B"
    assert parse_choice("blue", options=["blue", "blue", "green", "pink"]) is None


@pytest.mark.parametrize(
    ("response", "choice", "formatted"),
    [
        ("<think>red then blue</think>\n<answer>B</answer>", "B", True),
        ("<think>x</think> <answer>(C)</answer>", "C", True),
        ("<answer>B</answer>", "B", False),
        ("<think>x</think><answer>A</answer><answer>B</answer>", None, False),
        ("<think>x<think>y</think></think><answer>B</answer>", "B", False),
        ("no tags at all B", None, False),
        ("<think>日本語 ✓</think><answer>D</answer>", "D", True),
        ("<think>x</think><answer></answer>", None, True),
    ],
)
def test_response_parsing(response, choice, formatted):
    assert response_choice(response) == choice
    assert follows_format(response) is formatted


def test_extract_answer_strips_whitespace():
    assert extract_answer("<answer>\n B \n</answer>") == "B"


COLOURS = ["red", "green", "blue", "yellow"]


@pytest.mark.parametrize(
    ("response", "choice", "agrees"),
    [
        ("<think>It opens on a Blue background.</think><answer>C</answer>", "C", True),
        ("<think>It opens on a yellow background.</think><answer>B</answer>", "B", False),
        ("<think>Red first, then blue.</think><answer>A</answer>", "A", None),  # two options stated
        ("<think>At 00:00 the square is small.</think><answer>A</answer>", "A", None),  # none stated
        ("<think>reddish</think><answer>A</answer>", "A", None),  # whole words only
        ("<answer>C</answer> blue", "C", None),  # no reasoning block
        ("<think>blue</think><answer>?</answer>", None, None),  # no choice
    ],
)
def test_reasoning_agreement(response, choice, agrees):
    assert reasoning_agrees(response, choice, COLOURS) is agrees


def test_counts_in_reasoning_are_not_read_out_of_timestamps():
    options = ["0", "1", "2", "3"]
    assert stated_options("The background changes 2 times, at 00:09 and 00:20.", options) == [2]
    assert stated_options("The background stays red from 00:00 to 00:31.", options) == []
