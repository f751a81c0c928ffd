"""Reading the answer out of a model response.

The released scorer compares the ``<answer>`` text to the key verbatim, so ``B.`` scores 0.
Here the common ways of writing a choice are accepted, and anything ambiguous (two
different letters, two ``<answer>`` blocks) is rejected rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from core.qa import ANSWER_BLOCK, OPTION_LETTERS, extract_answer

_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_FORMAT = re.compile(rf"^\s*<think>.*?</think>\s*{ANSWER_BLOCK.pattern}\s*$", re.DOTALL)
_BARE_LETTER = re.compile(r"^[\(\[]?([A-J])[\)\]]?[.:)]?$")
_LETTER_THEN_TEXT = re.compile(r"^[\(\[]?([A-J])(?:[\)\]][.:]?|[.:])\s+\S")
_NAMED_LETTER = re.compile(
    r"\b(?:option|answer|choice)\s*(?:is\s*)?[:\-]?\s*[\(\[]?([A-J])[\)\]]?(?![A-Za-z])", re.I
)


def follows_format(response: str) -> bool:
    """Whether the whole response is ``<think>...</think>`` then ``<answer>...</answer>``.

    >>> follows_format("<think>r</think>\\n<answer>C</answer>")
    True
    >>> follows_format("C")
    False

    Stricter than the released regex, whose lazy groups also accept two answers or nested
    thinking: each of the four tags must occur exactly once.
    """
    if _FORMAT.match(response) is None:
        return False
    return all(response.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>"))


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().strip("\"'`*").strip()


def parse_choice(answer: str, num_options: int = 4, options: Sequence[str] = ()) -> str | None:
    """The option letter an answer text designates, or ``None`` if it designates none or several.

    Accepts "B", "B.", "(B)", "[B]", "B) text", "B: text", "Option B", "The answer is (B)", and
    the exact text of one option when ``options`` are given.

    >>> [parse_choice(t) for t in ["B", "B.", "(B)", "B) blue", "Option B", "the answer is b"]]
    ['B', 'B', 'B', 'B', 'B', 'B']
    >>> parse_choice("A or B") is None, parse_choice("E") is None, parse_choice("") is None
    (True, True, True)
    >>> parse_choice("blue", options=["red", "blue"])
    'B'
    """
    valid = OPTION_LETTERS[:num_options]
    text = _normalise(answer)
    if not text:
        return None
    for pattern in (_BARE_LETTER, _LETTER_THEN_TEXT):
        match = pattern.match(text)
        if match:
            return match.group(1) if match.group(1) in valid else None
    named = {m.upper() for m in _NAMED_LETTER.findall(text)}
    if len(named) == 1:
        letter = named.pop()
        return letter if letter in valid else None
    if named:
        return None
    folded = text.rstrip(".").casefold()
    matches = [OPTION_LETTERS[i] for i, option in enumerate(options) if option.strip().casefold() == folded]
    return matches[0] if len(matches) == 1 else None


def response_choice(response: str, num_options: int = 4, options: Sequence[str] = ()) -> str | None:
    """The choice letter of a full response (``None`` if there is no single, clear answer)."""
    answer = extract_answer(response)
    return None if answer is None else parse_choice(answer, num_options, options)


def stated_options(reasoning: str, options: Sequence[str]) -> list[int]:
    """Indices of the options whose text the reasoning states (whole words, any case).

    >>> stated_options("The background changes 2 times, at 00:09 and 00:20.", ["0", "1", "2", "3"])
    [2]
    >>> stated_options("It opens on a Blue background.", ["red", "green", "blue", "yellow"])
    [2]
    """
    folded = reasoning.casefold()
    stated = []
    for i, option in enumerate(options):
        text = option.strip().casefold()
        if text and re.search(rf"(?<!\w){re.escape(text)}(?!\w)", folded):
            stated.append(i)
    return stated


def reasoning_agrees(response: str, choice: str | None, options: Sequence[str]) -> bool | None:
    """Whether the ``<think>`` part names the option the answer picks.

    True when the one option the reasoning states is the chosen one, False when it states one
    other option; None when there is no single reasoning block or choice, or the reasoning
    states no option or several (free-form options rarely appear verbatim). RL rewards only
    the answer, so a policy can keep well-formed reasoning that no longer says what it
    answers; this makes that drift visible.

    >>> options = ["red", "green", "blue", "yellow"]
    >>> reasoning_agrees("<think>It opens on blue.</think><answer>C</answer>", "C", options)
    True
    >>> reasoning_agrees("<think>It opens on yellow.</think><answer>B</answer>", "B", options)
    False
    >>> reasoning_agrees("<think>Red, then blue.</think><answer>A</answer>", "A", options) is None
    True
    """
    blocks = _THINK_BLOCK.findall(response)
    if choice is None or len(blocks) != 1 or choice not in OPTION_LETTERS[: len(options)]:
        return None
    stated = stated_options(blocks[0], options)
    if len(stated) != 1:
        return None
    return OPTION_LETTERS[stated[0]] == choice
