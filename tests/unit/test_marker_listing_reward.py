"""The zoom task's listing reward (rewards/zoom.py) against the generator's ground truth and by hand."""

from __future__ import annotations

import doctest

import pytest

import rewards.zoom
from app.validation import _check_rewards
from datatools.zoom_task import MARKER_COLORS, ZoomConfig, make_row
from rewards.combine import RewardSpec, compute_rewards
from rewards.registry import get_reward
from rewards.zoom import listing_score, marker_listing

LISTED = "red none, green small at 00:14, yellow huge at 00:00, white small at 00:06"
REFERENCE = (
    f"The blue stretch runs from 00:00 to 00:16. Markers by colour: {LISTED}. "
    "In time order: yellow, white, green. First: yellow."
)


def test_doctests() -> None:
    result = doctest.testmod(rewards.zoom)
    assert result.attempted > 0 and result.failed == 0


def test_the_listing_read_from_each_row_is_the_generators_truth() -> None:
    """The parse of a row's reference reasoning equals its markers as the generator drew them, and
    the SFT trace's listing (times of the served frames) scores 1 against it."""
    for index in range(120):
        row = make_row(ZoomConfig(trace_requests="oracle"), "train", index)[0]
        drawn = {m["color"]: m["size"] for m in row.extra["zoom"]["markers"]}
        assert marker_listing(row.reasoning) == {c: drawn.get(c, "none") for c in MARKER_COLORS}
        assert listing_score(row.extra["tool_trace"]["final_reasoning"], row.reasoning) == 1.0


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        # Times are not compared: a served frame's time differs from the marker's first frame.
        (
            "Markers by colour: red none, green small at 00:15, yellow huge at 00:01, white small at 00:07.",
            1.0,
        ),
        (
            "Markers by colour: red none, green large at 00:14, yellow huge at 00:00, white small at 00:06.",
            0.75,
        ),
        (
            "Markers by colour: red small at 00:03, green none, yellow huge at 00:00, white small at 00:06.",
            0.5,
        ),
        ("Markers by colour: yellow huge at 00:00.", 0.25),  # the others not listed
        ("Markers by colour: Yellow HUGE at 00:00, red none.", 0.5),  # case is not a reading
        ("Markers by colour: yellow huge at 00:00, yellow small at 00:06, red none.", 0.25),  # yellow twice
        ("Markers by colour: red none, purple huge at 00:01, blue none.", 0.25),  # unknown colours ignored
        # The last listing counts (a reading revised after the frames came back).
        ("Markers by colour: red none. Markers by colour: green small at 00:14, white small at 00:06.", 0.5),
        ("<think>yellow huge, white small</think><answer>C</answer>", 0.0),  # no listing
        ("", 0.0),
        ("Markers by colour:", 0.0),  # no closing full stop: not a listing
    ],
)
def test_partial_credit_by_hand(completion: str, expected: float) -> None:
    assert listing_score(completion, REFERENCE) == expected


def test_a_row_without_a_reference_listing_scores_nothing() -> None:
    reward = get_reward("marker_listing")
    completion = "Markers by colour: red none."
    assert reward([completion, completion], reasoning=["Counted the cars.", None]) == [0.0, 0.0]
    assert reward([completion]) == [0.0]  # a caller without the field
    with pytest.raises(ValueError, match="'reasoning' has 2 values for 1"):
        reward([completion], reasoning=[REFERENCE, REFERENCE])


def test_weighted_beside_accuracy_with_the_rollouts_fields() -> None:
    completions = [
        f"<think>Markers by colour: {LISTED}.</think><answer>C</answer>",
        f"<think>Markers by colour: {LISTED.replace('small at 00:06', 'none')}.</think><answer>B</answer>",
    ]
    fields = {
        "key": ["a", "a"],
        "problem": ["Which colour first?"] * 2,
        "answer": ["C", "C"],
        "options": [["red", "green", "yellow", "white"]] * 2,
        "problem_type": ["multiple choice"] * 2,
        "category": ["Temporal"] * 2,
        "reasoning": [REFERENCE] * 2,
    }
    specs = [RewardSpec("accuracy", 0.9), RewardSpec("marker_listing", 0.3)]
    breakdown = compute_rewards(specs, completions, fields)
    assert breakdown.per_function["marker_listing"] == [1.0, 0.75]
    assert breakdown.total == pytest.approx([0.9 + 0.3, 0.3 * 0.75], rel=1e-15)


def test_a_config_may_name_the_reward() -> None:
    problems: list[str] = []
    _check_rewards([{"name": "accuracy", "weight": 0.9}, {"name": "marker_listing", "weight": 0.3}], problems)
    assert problems == []
    _check_rewards([{"name": "markers_listing", "weight": 0.3}], problems)
    assert problems and "marker_listing" in problems[0]  # the available names are listed
