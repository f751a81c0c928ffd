"""The built-in reward functions: pure, one score in [0, 1] per completion, registered by name.

Every function has the signature ``fn(completions, **sample_fields) -> list[float]``. The
sample fields are per-completion lists as long as ``completions`` (``answer``, ``options``,
``problem_type``, ``category``, ...); each function takes the ones it needs and ignores the
rest, so the caller can pass every field to every function.

Where we depart from the release: its accuracy reward compares the ``<answer>`` text to the
key verbatim (``B.`` scores 0). Here choice letters are parsed tolerantly
(:func:`rewards.parsing.parse_choice`), numbers are compared as numbers, and free text is
compared after normalisation. Anything ambiguous (two ``<answer>`` blocks, two letters, two
different numbers) scores 0 rather than being guessed.

A malformed *key* (a multiple-choice key that is not an option letter, a numerical key that
is not one number) raises ``ValueError``: it is a data bug, and scoring it 0 would hide it.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from core.qa import MULTIPLE_CHOICE, OPTION_LETTERS
from rewards.parsing import extract_answer, follows_format, parse_choice, reasoning_agrees, response_choice
from rewards.registry import register

DEFAULT_NUM_OPTIONS = 4
"""Options assumed for a multiple-choice sample whose ``options`` field is empty (the
released rows embed the options in the question text, and the prompt says A, B, C or D)."""

NUMERICAL = "numerical"

_NUMBER = re.compile(
    r"""
    (?<![\w.])(?<!\d,)                  # start: not inside a word, a decimal or a digit group
    (?P<sign>[-+])?
    (?P<body>
        (?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?   # 1,000.5 / 12 / 3.25
        | \.\d+                                # .5
    )
    (?P<exponent>[eE][-+]?\d+)?
    (?![.,]?\d)                         # end: no digits follow ("1,2", "3.5.2", "1,0000" are no number)
    """,
    re.VERBOSE,
)
# The typographic minus sign (not dashes, which more often join ranges or clauses).
_MINUS_SIGNS = str.maketrans({"\u2212": "-"})
# Markdown emphasis and code marks around an answer are not part of it.
_EXTRA_EDGE_CHARS = frozenset("`*_~")


def per_sample(name: str, values: Sequence[Any] | None, n: int) -> Sequence[Any]:
    """The per-completion list of a field, or ``n`` ``None``s when the caller did not give it."""
    if values is None:
        return [None] * n
    if len(values) != n:
        raise ValueError(f"field {name!r} has {len(values)} values for {n} completions")
    return values


# --- format ---------------------------------------------------------------------------------


@register("format")
def format_reward(completions: Sequence[str], **_: Any) -> list[float]:
    """1.0 when the completion is exactly ``<think>...</think>`` then ``<answer>...</answer>``.

    Each of the four tags must occur once (stricter than the released regex, see
    :func:`rewards.parsing.follows_format`); whitespace around and between the blocks is fine.

    >>> format_reward([
    ...     "<think>red, then blue</think>\\n<answer>B</answer>",
    ...     "B",
    ...     "<think>x</think><answer>A</answer><answer>B</answer>",
    ... ])
    [1.0, 0.0, 0.0]
    """
    return [1.0 if follows_format(completion) else 0.0 for completion in completions]


@register("reasoning_agreement")
def reasoning_agreement_reward(
    completions: Sequence[str], *, options: Sequence[Sequence[str] | None] | None = None, **_: Any
) -> list[float]:
    """1.0 when the ``<think>`` part states exactly one option and the answer picks that option.

    The outcome reward alone lets the answer drift away from the reasoning (the demo's GRPO
    raised accuracy while the share of answers whose reasoning names them fell); weighted beside
    it, this keeps them together. 0.0 when the reasoning states another option, none or several,
    or the sample has no listed options (:func:`rewards.parsing.reasoning_agrees`): a constant
    within such a group, so it moves no advantage there.

    >>> options = [["red", "green", "blue", "yellow"]] * 3
    >>> reasoning_agreement_reward([
    ...     "<think>It opens on blue.</think><answer>C</answer>",
    ...     "<think>It opens on blue.</think><answer>A</answer>",
    ...     "<think>Red, then blue.</think><answer>C</answer>",
    ... ], options=options)
    [1.0, 0.0, 0.0]
    """
    option_lists = per_sample("options", options, len(completions))
    scores = []
    for completion, listed in zip(completions, option_lists, strict=True):
        listed = list(listed or [])
        choice = response_choice(completion, len(listed) or DEFAULT_NUM_OPTIONS, listed) if listed else None
        scores.append(1.0 if listed and reasoning_agrees(completion, choice, listed) else 0.0)
    return scores


# --- multiple choice ------------------------------------------------------------------------


def _choice_key(key: str, options: Sequence[str] | None) -> tuple[str, int]:
    """The key letter and the number of options it is chosen from; raises on a malformed key."""
    letter = key.strip().upper()
    if len(letter) != 1 or letter not in OPTION_LETTERS:
        raise ValueError(f"multiple-choice key {key!r} is not an option letter {OPTION_LETTERS[0]}-J")
    position = OPTION_LETTERS.index(letter) + 1
    if options:
        if position > len(options):
            raise ValueError(f"multiple-choice key {key!r} is beyond the {len(options)} options given")
        return letter, len(options)
    # Options embedded in the question text: the key itself proves at least that many exist.
    return letter, max(DEFAULT_NUM_OPTIONS, position)


def _choice_score(completion: str, key: str, options: Sequence[str] | None) -> float:
    letter, num_options = _choice_key(key, options)
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    # NFKC folds full-width letters ("Ｂ", common after CJK reasoning) into ASCII ones.
    answer = unicodedata.normalize("NFKC", answer)
    return 1.0 if parse_choice(answer, num_options, options or ()) == letter else 0.0


@register("choice_accuracy")
def choice_accuracy_reward(
    completions: Sequence[str],
    *,
    answer: Sequence[str],
    options: Sequence[Sequence[str] | None] | None = None,
    **_: Any,
) -> list[float]:
    """1.0 when the ``<answer>`` block designates the key's option letter, else 0.0.

    The letter is parsed tolerantly ("B", "B.", "(B)", "B) text", "Option B", a full-width
    "Ｂ", or the exact text of one option); no answer block, two blocks, two letters or a letter beyond the
    options score 0. Without ``options`` a sample is taken to have
    :data:`DEFAULT_NUM_OPTIONS` options (more if the key is a later letter).

    >>> choice_accuracy_reward(
    ...     ["<answer>B.</answer>", "<answer>(B)</answer>", "<answer>A or B</answer>", "B"],
    ...     answer=["B", "B", "B", "B"],
    ... )
    [1.0, 1.0, 0.0, 0.0]
    >>> choice_accuracy_reward(["<answer>blue</answer>"], answer=["B"], options=[["red", "blue"]])
    [1.0]
    """
    n = len(completions)
    keys = per_sample("answer", answer, n)
    option_lists = per_sample("options", options, n)
    return [_choice_score(c, k, o) for c, k, o in zip(completions, keys, option_lists, strict=True)]


# --- numerical ------------------------------------------------------------------------------


def parse_number(text: str) -> float | None:
    """The one number a text states, or ``None`` if it states none or two different ones.

    Accepted: integers, decimals ("3.0", "3.", ".5"), signs (ASCII or typographic minus),
    thousands separators in groups of three ("1,000"), exponents ("1e3"). Words and units
    around the number are ignored ("3 seconds", "about 3", "50%" -> 50), without any unit
    conversion. The same value written twice counts once ("3 (3.0)"). Rejected: two different
    numbers ("3 or 4", "3-4", "1:30"), irregular digit groups ("1,2", "1,0000"), numbers
    spelled in words, and digits inside words ("mp4").

    >>> [parse_number(t) for t in ["3", " 3.0 ", "3.", "1,000", "-2.5", "\\u22122.5", "3 seconds"]]
    [3.0, 3.0, 3.0, 1000.0, -2.5, -2.5, 3.0]
    >>> [parse_number(t) for t in ["3 or 4", "1,2", "three", "", "3 = 3.0"]]
    [None, None, None, None, 3.0]
    """
    text = unicodedata.normalize("NFKC", text).translate(_MINUS_SIGNS)
    values: set[float] = set()
    for match in _NUMBER.finditer(text):
        value = float(match["body"].replace(",", "") + (match["exponent"] or ""))
        if match["sign"] == "-":
            value = -value
        if not math.isfinite(value):  # "1e999": no answer is that large
            return None
        values.add(value + 0.0)  # + 0.0 folds -0.0 into 0.0
    return values.pop() if len(values) == 1 else None


def _numeric_key(key: str) -> float:
    value = parse_number(key)
    if value is None:
        raise ValueError(f"numerical key {key!r} is not a single number")
    return value


def _numeric_score(completion: str, key: str, rel_tol: float, abs_tol: float) -> float:
    expected = _numeric_key(key)
    answer = extract_answer(completion)
    value = None if answer is None else parse_number(answer)
    if value is None:
        return 0.0
    return 1.0 if math.isclose(value, expected, rel_tol=rel_tol, abs_tol=abs_tol) else 0.0


@register("numeric_accuracy")
def numeric_accuracy_reward(
    completions: Sequence[str],
    *,
    answer: Sequence[str],
    rel_tol: float = 1e-6,
    abs_tol: float = 0.0,
    **_: Any,
) -> list[float]:
    """1.0 when the ``<answer>`` block states one number close to the key, else 0.0.

    Numbers are read by :func:`parse_number` (so "1,000", "3 seconds" and "3." are read, and
    "3 or 4" is not). Close means ``math.isclose(value, key, rel_tol=rel_tol,
    abs_tol=abs_tol)``; ``abs_tol`` matters only for a key of 0, which a relative tolerance
    alone accepts only exactly. Bind other tolerances with ``functools.partial``.

    >>> numeric_accuracy_reward(
    ...     ["<answer>1,000</answer>", "<answer>999.5</answer>", "<answer>3 or 1000</answer>"],
    ...     answer=["1000", "1000", "1000"],
    ... )
    [1.0, 0.0, 0.0]
    >>> import functools
    >>> functools.partial(numeric_accuracy_reward, rel_tol=1e-3)(["<answer>999.5</answer>"], answer=["1000"])
    [1.0]
    """
    n = len(completions)
    keys = per_sample("answer", answer, n)
    return [_numeric_score(c, k, rel_tol, abs_tol) for c, k in zip(completions, keys, strict=True)]


# --- free text and dispatch -----------------------------------------------------------------


def _is_edge_char(char: str) -> bool:
    return char.isspace() or unicodedata.category(char).startswith("P") or char in _EXTRA_EDGE_CHARS


def normalize_text(text: str) -> str:
    """Text for exact matching: NFKC, casefolded, runs of whitespace as one space, and
    punctuation, whitespace and markdown marks stripped from both ends (not from inside).

    >>> normalize_text("  **The Red   Car.** ")
    'the red car'
    >>> normalize_text("Straße!") == normalize_text("STRASSE")
    True
    """
    text = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    start, end = 0, len(text)
    while start < end and _is_edge_char(text[start]):
        start += 1
    while end > start and _is_edge_char(text[end - 1]):
        end -= 1
    return text[start:end]


def _exact_score(completion: str, key: str) -> float:
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    normalized = normalize_text(answer)
    # An empty answer never matches, even a key that normalises to nothing.
    return 1.0 if normalized and normalized == normalize_text(key) else 0.0


def _problem_kind(problem_type: str | None) -> str:
    # "Multiple Choice", "multiple-choice" and "multiple_choice" all mean the released type.
    return re.sub(r"[\s_-]+", " ", (problem_type or "").strip().casefold())


OPEN_ENDED = "open-ended"


def answer_kind(problem_type: str | None) -> str:
    """How an answer to a row of this ``problem_type`` is scored: :data:`MULTIPLE_CHOICE`,
    :data:`NUMERICAL` (also ``"numeric"``) or :data:`OPEN_ENDED` (every other type).

    >>> [answer_kind(t) for t in ["Multiple-Choice", "numeric", "numerical", "OCR", None]]
    ['multiple choice', 'numerical', 'numerical', 'open-ended', 'open-ended']
    """
    kind = _problem_kind(problem_type)
    if kind == MULTIPLE_CHOICE:
        return MULTIPLE_CHOICE
    return NUMERICAL if kind in (NUMERICAL, "numeric") else OPEN_ENDED


@register("accuracy")
def accuracy_reward(
    completions: Sequence[str],
    *,
    answer: Sequence[str],
    problem_type: Sequence[str],
    options: Sequence[Sequence[str] | None] | None = None,
    rel_tol: float = 1e-6,
    abs_tol: float = 0.0,
    **_: Any,
) -> list[float]:
    """Accuracy by problem type, per completion: the reward of the paper's 0.9 weight.

    - ``"multiple choice"``: as :func:`choice_accuracy_reward`;
    - ``"numerical"`` (or ``"numeric"``): as :func:`numeric_accuracy_reward`;
    - anything else (``"open-ended"``, ``"OCR"``, ...): exact match of :func:`normalize_text`
      of the answer and of the key.

    Note: exact match is a stand-in for open-ended answers. The paper has an LLM judge decide
    whether the answer means the same as the reference; that judge is a separate reward (a
    later issue), and until it exists a correct paraphrase scores 0 here.

    >>> accuracy_reward(
    ...     ["<answer>(C)</answer>", "<answer>2.50 m</answer>", "<answer> A red car. </answer>",
    ...      "<answer>a blue car</answer>"],
    ...     answer=["C", "2.5", "a red car", "a red car"],
    ...     problem_type=["multiple choice", "numerical", "open-ended", "open-ended"],
    ... )
    [1.0, 1.0, 1.0, 0.0]
    """
    n = len(completions)
    keys = per_sample("answer", answer, n)
    kinds = per_sample("problem_type", problem_type, n)
    option_lists = per_sample("options", options, n)
    scores = []
    for completion, key, kind, sample_options in zip(completions, keys, kinds, option_lists, strict=True):
        kind = answer_kind(kind)
        if kind == MULTIPLE_CHOICE:
            scores.append(_choice_score(completion, key, sample_options))
        elif kind == NUMERICAL:
            scores.append(_numeric_score(completion, key, rel_tol, abs_tol))
        else:
            scores.append(_exact_score(completion, key))
    return scores


@register("frame_requests")
def frame_requests_reward(
    completions: Sequence[str], *, frame_requests: Sequence[int] | None = None, **_: Any
) -> list[float]:
    """The number of frame requests the episode made (0 for a single-turn rollout): with a
    negative weight, a cost per request (``- {name: frame_requests, weight: -0.05}``), so that
    the model looks only where it needs to.

    >>> frame_requests_reward(["a", "b"], frame_requests=[0, 2])
    [0.0, 2.0]
    """
    if frame_requests is None:
        return [0.0 for _ in completions]
    return [float(count) for count in frame_requests]
