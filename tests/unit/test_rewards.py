"""Reward functions, their registry and the weighted combination (rewards/), against hand-computed values."""

from __future__ import annotations

import doctest
import functools
import math
from types import ModuleType
from typing import Any

import pytest
from helpers.imports import assert_imports_none_of

import rewards.combine
import rewards.functions
import rewards.registry
from rewards.combine import (
    RewardBreakdown,
    RewardError,
    RewardSpec,
    check_specs,
    compute_rewards,
    default_reward_specs,
)
from rewards.functions import (
    accuracy_reward,
    choice_accuracy_reward,
    format_reward,
    normalize_text,
    numeric_accuracy_reward,
    parse_number,
)
from rewards.registry import _REGISTRY, available_rewards, get_reward, register

MC = "multiple choice"


def wrap(answer: str, think: str = "reasoning") -> str:
    """A well-formed completion with the given answer text."""
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


@pytest.fixture
def temporary_rewards() -> Any:
    """Names registered during a test are removed afterwards, so tests do not leak into each other."""
    before = dict(_REGISTRY)
    yield
    _REGISTRY.clear()
    _REGISTRY.update(before)


# --- doctests and package boundaries --------------------------------------------------------


@pytest.mark.parametrize(
    "module", [rewards.functions, rewards.registry, rewards.combine], ids=lambda m: m.__name__
)
def test_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0, f"{module.__name__} has no doctests"
    assert result.failed == 0


def test_rewards_package_stays_a_leaf() -> None:
    assert_imports_none_of(
        ["rewards.combine", "rewards.functions", "rewards.registry"],
        ["torch", "lightning", "models", "rollout", "callbacks", "parallel", "app"],
    )


# --- format ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>red then blue</think>\n<answer>B</answer>", 1.0),
        ("  <think>x</think> <answer>B</answer>\n", 1.0),
        ("<think>日本語 ✓ 🎬</think><answer>Ｄ</answer>", 1.0),
        ("<think>x</think><answer></answer>", 1.0),  # well formed; accuracy is what scores it 0
        ("B", 0.0),  # no tags
        ("", 0.0),
        ("<answer>B</answer>", 0.0),  # no thinking
        ("<think>x<think>y</think></think><answer>B</answer>", 0.0),  # nested thinking
        ("<think>x</think><answer>A</answer><answer>B</answer>", 0.0),  # two answers
        ("<think>x</think><answer>B</answer> and more", 0.0),  # text after the answer
        ("<answer>B</answer><think>x</think>", 0.0),  # wrong order
    ],
)
def test_format_reward(completion: str, expected: float) -> None:
    assert format_reward([completion]) == [expected]


def test_functions_ignore_fields_they_do_not_need() -> None:
    assert format_reward(["B"], answer=["B"], category=["Plot"], whatever=[object()]) == [0.0]
    fields = {"answer": ["B"], "problem_type": [MC], "category": ["Plot"], "options": [[]]}
    assert choice_accuracy_reward([wrap("B")], **fields) == [1.0]
    assert numeric_accuracy_reward([wrap("2")], **{**fields, "answer": ["2"]}) == [1.0]


def test_empty_batch() -> None:
    assert format_reward([]) == []
    assert accuracy_reward([], answer=[], problem_type=[]) == []


# --- multiple choice ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (wrap("B"), 1.0),
        (wrap("B."), 1.0),  # the released scorer gives 0 here
        (wrap("(B)"), 1.0),
        (wrap("Option B"), 1.0),
        (wrap("B) blue"), 1.0),
        (wrap("The answer is (B)."), 1.0),
        (wrap(" **B** "), 1.0),
        (wrap("Ｂ", think="日本語で考える"), 1.0),  # full-width letter, folded by NFKC
        (wrap("Option B — the red car"), 1.0),
        ("<answer>B</answer>", 1.0),  # accuracy does not judge the format; the format reward does
        (wrap("A"), 0.0),  # wrong letter
        (wrap("A or B"), 0.0),  # two letters
        (wrap("E"), 0.0),  # beyond the 4 default options
        (wrap(""), 0.0),  # empty answer
        (wrap("B ✓"), 0.0),  # not a form parse_choice accepts: no guess
        ("B", 0.0),  # no tags
        ("<think>x</think><answer>B</answer><answer>B</answer>", 0.0),  # two answers, even equal ones
        ("<think>x<answer>B</answer>", 1.0),  # unclosed thinking: one answer block, still read
    ],
)
def test_choice_accuracy_reward(completion: str, expected: float) -> None:
    assert choice_accuracy_reward([completion], answer=["B"]) == [expected]


def test_choice_accuracy_uses_the_options() -> None:
    options = [["red car", "blue car", "green car"]]
    assert choice_accuracy_reward([wrap("Blue car.")], answer=["B"], options=options) == [1.0]
    assert choice_accuracy_reward([wrap("red car")], answer=["B"], options=options) == [0.0]
    # Three options: D is out of range, so a "D" answer is wrong even though D is a letter.
    assert choice_accuracy_reward([wrap("D")], answer=["C"], options=options) == [0.0]
    # Empty options mean 4 options, or as many as the key's letter implies.
    assert choice_accuracy_reward([wrap("E")], answer=["E"], options=[[]]) == [1.0]
    assert choice_accuracy_reward([wrap("E")], answer=["B"], options=[[]]) == [0.0]


def test_choice_accuracy_per_completion_keys() -> None:
    completions = [wrap("A"), wrap("A"), wrap("(C)"), "no answer"]
    assert choice_accuracy_reward(completions, answer=["A", "B", "C", "C"]) == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(("key", "options"), [("blue", None), ("", None), ("D", ["x", "y", "z"])])
def test_choice_accuracy_rejects_malformed_keys(key: str, options: list[str] | None) -> None:
    with pytest.raises(ValueError, match="multiple-choice key"):
        choice_accuracy_reward([wrap("B")], answer=[key], options=[options])


def test_mismatched_field_length_in_a_direct_call() -> None:
    with pytest.raises(ValueError, match="'answer' has 1 values for 2 completions"):
        choice_accuracy_reward([wrap("B"), wrap("B")], answer=["B"])


# --- numbers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3.0),
        ("3.0", 3.0),
        (" 3 ", 3.0),
        ("3.", 3.0),
        (".5", 0.5),
        ("1,000", 1000.0),
        ("1,234,567.25", 1234567.25),
        ("-2.5", -2.5),
        ("\u22122.5", -2.5),  # typographic minus
        ("+7", 7.0),
        ("1e3", 1000.0),
        ("3 seconds", 3.0),  # units are ignored, not converted
        ("about 12 people.", 12.0),
        ("50%", 50.0),
        ("3 (that is, 3.0)", 3.0),  # one value written twice
        ("３", 3.0),  # full-width digit
        ("-0", 0.0),
        ("3 or 4", None),  # two different numbers
        ("3-4", None),
        ("between -2 and 2", None),
        ("1:30", None),
        ("1,2", None),  # list or decimal comma: ambiguous
        ("1,0000", None),  # irregular digit group
        ("3.5.2", None),
        ("three", None),
        ("", None),
        ("1e999", None),  # not finite
    ],
)
def test_parse_number(text: str, value: float | None) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("answer", "key", "expected"),
    [
        ("3", "3", 1.0),
        ("3.0", "3", 1.0),
        (" 3 ", "3", 1.0),
        ("3.", "3", 1.0),
        ("1,000", "1000", 1.0),
        ("1000", "1,000", 1.0),
        ("-2.5", "-2.5", 1.0),
        ("2.5", "-2.5", 0.0),  # sign matters
        ("3 seconds", "3", 1.0),
        ("3 or 4", "3", 0.0),  # ambiguous
        ("3 or 3.0", "3", 1.0),  # the same number twice is not ambiguous
        ("4", "3", 0.0),
        ("3.000001", "3", 1.0),  # relative error 3.3e-7, inside the default 1e-6
        ("3.00001", "3", 0.0),  # relative error 3.3e-6, outside it
        ("", "3", 0.0),
        ("three", "3", 0.0),
        ("0", "0", 1.0),
        ("0.0000001", "0", 0.0),  # a relative tolerance alone accepts only an exact 0
    ],
)
def test_numeric_accuracy_reward(answer: str, key: str, expected: float) -> None:
    assert numeric_accuracy_reward([wrap(answer)], answer=[key]) == [expected]


def test_numeric_accuracy_without_a_single_answer_block() -> None:
    completions = ["3", "<think>x</think><answer>3</answer><answer>3</answer>"]
    assert numeric_accuracy_reward(completions, answer=["3", "3"]) == [0.0, 0.0]


def test_numeric_tolerances_bind_with_partial() -> None:
    loose = functools.partial(numeric_accuracy_reward, rel_tol=1e-2)
    assert loose([wrap("99.5"), wrap("98")], answer=["100", "100"]) == [1.0, 0.0]
    near_zero = functools.partial(numeric_accuracy_reward, abs_tol=1e-3)
    assert near_zero([wrap("0.0001"), wrap("0.01")], answer=["0", "0"]) == [1.0, 0.0]


def test_numeric_accuracy_rejects_a_key_that_is_not_a_number() -> None:
    with pytest.raises(ValueError, match="numerical key '3 or 4'"):
        numeric_accuracy_reward([wrap("3")], answer=["3 or 4"])


# --- free text and dispatch -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("  The Red Car. ", "the red car"),
        ("**Red car**", "red car"),
        ("`red car`", "red car"),
        ('"red\n  car"!', "red car"),
        ("Café", "café"),
        ("ＲＥＤ", "red"),  # full-width letters
        ("U.S.A.", "u.s.a"),  # punctuation inside is kept
        ("...", ""),
    ],
)
def test_normalize_text(text: str, normalized: str) -> None:
    assert normalize_text(text) == normalized


def test_accuracy_reward_dispatches_on_problem_type() -> None:
    completions = [
        wrap("B."),  # multiple choice, right
        wrap("A"),  # multiple choice, wrong
        wrap("1,000 meters"),  # numerical, right
        wrap("3 or 4"),  # numerical, ambiguous
        wrap(" A red car. "),  # open-ended, exact after normalisation
        wrap("a crimson car"),  # open-ended paraphrase: 0 until the LLM judge exists
        wrap("Café"),  # open-ended, unicode
        wrap("B"),  # OCR: exact match, so a letter is just text here
        "a red car",  # open-ended without tags
    ]
    fields = {
        "answer": ["B", "B", "1000", "3", "a red car", "a red car", "CAFÉ", "b", "a red car"],
        "problem_type": [MC, "Multiple Choice", "numerical", "numerical"]
        + ["open-ended"] * 3
        + ["OCR", "open-ended"],
    }
    assert accuracy_reward(completions, **fields) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]


def test_accuracy_reward_open_ended_empty_answer_never_matches() -> None:
    assert accuracy_reward([wrap(""), wrap("!")], answer=["...", "!"], problem_type=["open-ended"] * 2) == [
        0.0,
        0.0,
    ]


def test_accuracy_reward_passes_options_and_tolerance_on() -> None:
    out = accuracy_reward(
        [wrap("blue"), wrap("99.5")],
        answer=["B", "100"],
        problem_type=[MC, "numerical"],
        options=[["red", "blue"], []],
        rel_tol=1e-2,
    )
    assert out == [1.0, 1.0]


# --- registry -------------------------------------------------------------------------------


def test_registry_has_the_builtin_rewards() -> None:
    assert {"format", "choice_accuracy", "numeric_accuracy", "accuracy"} <= set(available_rewards())
    assert get_reward("format") is format_reward
    assert get_reward("choice_accuracy") is choice_accuracy_reward
    assert get_reward("numeric_accuracy") is numeric_accuracy_reward
    assert get_reward("accuracy") is accuracy_reward
    assert available_rewards() == sorted(available_rewards())


def test_unknown_reward_name_lists_the_available_ones() -> None:
    with pytest.raises(KeyError) as info:
        get_reward("acuracy")
    message = info.value.args[0]
    assert "'acuracy'" in message
    for name in ("accuracy", "choice_accuracy", "format", "numeric_accuracy"):
        assert name in message


def test_register_a_custom_reward(temporary_rewards: None) -> None:
    @register("length_penalty")
    def length_penalty(completions: list[str], **_: Any) -> list[float]:
        return [-len(c) / 100 for c in completions]

    assert get_reward("length_penalty") is length_penalty
    assert "length_penalty" in available_rewards()
    breakdown = compute_rewards([RewardSpec("length_penalty", 2.0)], ["x" * 10], {})
    assert breakdown.total == pytest.approx([-0.2])


def test_register_refuses_to_override_another_function(temporary_rewards: None) -> None:
    def other(completions: list[str], **_: Any) -> list[float]:
        return [0.0 for _ in completions]

    with pytest.raises(ValueError, match="'format' is already registered"):
        register("format")(other)
    assert get_reward("format") is format_reward
    with pytest.raises(ValueError, match="non-empty name"):
        register(" ")


# --- combination ----------------------------------------------------------------------------


def test_default_specs_are_the_papers() -> None:
    assert default_reward_specs() == [RewardSpec("accuracy", 0.9), RewardSpec("format", 0.1)]


def test_weighted_total_by_hand() -> None:
    completions = [
        wrap("B"),  # accuracy 1, format 1 -> 0.9 + 0.1 = 1.0
        "<answer>B</answer>",  # accuracy 1, format 0 -> 0.9
        wrap("A"),  # accuracy 0, format 1 -> 0.1
        "B",  # accuracy 0, format 0 -> 0.0
        wrap("2.0"),  # numerical, accuracy 1, format 1 -> 1.0
    ]
    fields = {
        "answer": ["B", "B", "B", "B", "2"],
        "problem_type": [MC] * 4 + ["numerical"],
        "options": [[], [], [], [], []],
        "category": ["Plot", "Temporal", "Spatial", "Plot", "Temporal"],
    }
    breakdown = compute_rewards(default_reward_specs(), completions, fields)
    assert breakdown.total == pytest.approx([1.0, 0.9, 0.1, 0.0, 1.0])
    assert breakdown.per_function == {
        "accuracy": [1.0, 1.0, 0.0, 0.0, 1.0],
        "format": [1.0, 0.0, 1.0, 0.0, 1.0],
    }


def test_zero_and_negative_weights() -> None:
    specs = [RewardSpec("format", -0.5), RewardSpec("choice_accuracy", 0.0)]
    breakdown = compute_rewards(specs, [wrap("A"), "B"], {"answer": ["A", "B"]})
    assert breakdown.total == [-0.5, 0.0]
    assert breakdown.per_function["choice_accuracy"] == [1.0, 0.0]  # logged, not trained on


def test_spec_kwargs_are_bound() -> None:
    spec = RewardSpec("numeric_accuracy", 1.0, kwargs={"rel_tol": 1e-2})
    assert compute_rewards([spec], [wrap("99.5")], {"answer": ["100"]}).total == [1.0]


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="non-finite weight"):
        RewardSpec("format", math.nan)
    with pytest.raises(ValueError, match="non-empty name"):
        RewardSpec("", 1.0)
    with pytest.raises(RewardError, match="no reward functions"):
        check_specs([])
    with pytest.raises(RewardError, match="more than once: format"):
        check_specs([RewardSpec("format", 0.1), RewardSpec("format", 0.2)])
    with pytest.raises(RewardError, match=r"unknown reward function 'nope'.*accuracy"):
        check_specs([RewardSpec("nope", 1.0)])


def test_summary_for_logging() -> None:
    breakdown = RewardBreakdown(total=[1.0, 0.0, 0.5], per_function={"format": [1.0, 0.0, 1.0]})
    summary = breakdown.summary()
    assert summary["reward/total/mean"] == pytest.approx(0.5)
    assert summary["reward/total/std"] == pytest.approx(math.sqrt(1 / 6))
    assert summary["reward/format/mean"] == pytest.approx(2 / 3)
    assert summary["reward/format/std"] == pytest.approx(math.sqrt(2 / 9))
    assert RewardBreakdown([], {"format": []}).summary() == {}


# --- errors ---------------------------------------------------------------------------------


def test_a_raising_function_is_named_and_chained(temporary_rewards: None) -> None:
    @register("broken")
    def broken(completions: list[str], **_: Any) -> list[float]:
        raise ZeroDivisionError("boom")

    with pytest.raises(RewardError, match="'broken' raised ZeroDivisionError on completion 0: boom") as info:
        compute_rewards([RewardSpec("format", 0.1), RewardSpec("broken", 1.0)], ["x"], {})
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_the_sample_a_reward_function_fails_on_is_named(temporary_rewards: None) -> None:
    @register("picky")
    def picky(completions: list[str], **_: Any) -> list[float]:
        if any("bad" in c for c in completions):
            raise ValueError("cannot score this")
        return [1.0 for _ in completions]

    fields = {"key": ["k0", "k1", "k2"], "answer": ["A", "B", "C"]}
    with pytest.raises(RewardError, match=r"'picky' raised ValueError on completion 1 \(sample 'k1'\)"):
        compute_rewards([RewardSpec("picky", 1.0)], ["fine", "bad", "fine"], fields)


def test_a_malformed_key_surfaces_as_reward_error() -> None:
    message = "'accuracy' raised ValueError on completion 0: multiple-choice key"
    with pytest.raises(RewardError, match=message) as info:
        compute_rewards(default_reward_specs(), [wrap("B")], {"answer": ["blue"], "problem_type": [MC]})
    assert isinstance(info.value.__cause__, ValueError)


def test_a_missing_field_surfaces_as_reward_error() -> None:
    with pytest.raises(RewardError, match=r"'accuracy' raised TypeError.*problem_type"):
        compute_rewards(default_reward_specs(), [wrap("B")], {"answer": ["B"]})


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ([1.0], "returned 1 values for 2 completions"),
        ([1.0, 1.0, 1.0], "returned 3 values for 2 completions"),
        ([1.0, math.nan], "returned nan for completion 1"),
        ([math.inf, 0.0], "returned inf for completion 0"),
        ([1.0, "high"], "returned 'high' for completion 1"),
        (None, "returned NoneType"),
        ("10", "returned str"),
    ],
)
def test_bad_return_values_are_named(temporary_rewards: None, returned: Any, message: str) -> None:
    @register("bad")
    def bad(completions: list[str], **_: Any) -> Any:
        return returned

    with pytest.raises(RewardError, match=f"reward function 'bad' {message}"):
        compute_rewards([RewardSpec("bad", 1.0)], ["x", "y"], {})


def test_returned_ints_and_bools_are_floats(temporary_rewards: None) -> None:
    @register("ints")
    def ints(completions: list[str], **_: Any) -> Any:
        return [1, True]

    assert compute_rewards([RewardSpec("ints", 0.5)], ["x", "y"], {}).total == [0.5, 0.5]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"answer": ["B"], "problem_type": [MC, MC]}, "field 'answer' has 1 values for 2 completions"),
        ({"answer": ["B", "B"], "problem_type": [MC, MC, MC]}, "field 'problem_type' has 3 values"),
        ({"answer": "BB", "problem_type": [MC, MC]}, "field 'answer' must be a list"),
        ({"answer": ["B", "B"], "problem_type": [MC, MC], "category": None}, "field 'category' must be"),
    ],
)
def test_mismatched_fields_are_rejected_by_name(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(RewardError, match=message):
        compute_rewards(default_reward_specs(), [wrap("B"), wrap("B")], fields)


def test_specs_parse_from_yaml_with_jsonargparse() -> None:
    from jsonargparse import ArgumentParser

    class Consumer:
        def __init__(self, rewards: list[RewardSpec] | None = None) -> None:
            self.rewards = rewards

    parser = ArgumentParser()
    parser.add_class_arguments(Consumer, "consumer")
    config = parser.parse_string(
        "consumer:\n"
        "  rewards:\n"
        "  - {name: accuracy, weight: 0.9}\n"
        "  - {name: numeric_accuracy, weight: 0.1, kwargs: {rel_tol: 0.01}}\n"
    )
    assert "rel_tol: 0.01" in parser.dump(config)
    specs = parser.instantiate(config).consumer.rewards
    assert specs == [RewardSpec("accuracy", 0.9), RewardSpec("numeric_accuracy", 0.1, {"rel_tol": 0.01})]


@pytest.mark.parametrize(
    ("completion", "options", "expected"),
    [
        ("<think>The screen turns green.</think><answer>B</answer>", ["red", "green", "blue"], 1.0),
        ("<think>The screen turns green.</think><answer>green</answer>", ["red", "green", "blue"], 1.0),
        ("<think>The screen turns green.</think><answer>C</answer>", ["red", "green", "blue"], 0.0),
        ("<think>Red, then green.</think><answer>B</answer>", ["red", "green", "blue"], 0.0),  # two stated
        ("<think>No colour is named.</think><answer>B</answer>", ["red", "green", "blue"], 0.0),
        ("<think>green</think><answer>B</answer><answer>B</answer>", ["red", "green", "blue"], 0.0),
        ("<think>It is 3.</think><answer>3</answer>", None, 0.0),  # no options: constant 0
    ],
)
def test_reasoning_agreement_reward(completion: str, options: list[str] | None, expected: float) -> None:
    score = get_reward("reasoning_agreement")([completion], options=[options], answer=["B"])
    assert score == [expected]
