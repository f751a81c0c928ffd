"""The question/answer vocabulary shared by the data, the rewards and evaluation: the reasoning
categories, option letters, and the ``<answer>...</answer>`` block with the one pattern that reads
it. Rows of the released data write their key as ``<answer>X</answer>`` and a model's response
puts its answer in the same tags; both are read here, so the two cannot drift apart.
"""

from __future__ import annotations

import re

CATEGORIES: tuple[str, ...] = ("Temporal", "Goal and Purpose", "Spatial", "Plot")
"""LongVideo-Reason's four reasoning categories."""
OPTION_LETTERS = "ABCDEFGHIJ"
"""Letters of multiple-choice options, in order (at most ten options)."""
MULTIPLE_CHOICE = "multiple choice"
"""The ``problem_type`` of a multiple-choice question."""

ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
"""An ``<answer>`` block; its group is the text inside (the shortest span, so two blocks stay two)."""


def answer_blocks(text: str) -> list[str]:
    """The text inside every ``<answer>`` block of ``text``, in order, unstripped.

    >>> answer_blocks("<answer> A </answer> then <answer>B</answer>"), answer_blocks("B")
    ([' A ', 'B'], [])
    """
    return ANSWER_BLOCK.findall(text)


def extract_answer(response: str) -> str | None:
    """Text of the single ``<answer>`` block, or ``None`` when there is none or more than one.

    >>> extract_answer("<think>x</think><answer> B. </answer>")
    'B.'
    >>> extract_answer("<answer>A</answer><answer>B</answer>") is None
    True
    """
    blocks = answer_blocks(response)
    if len(blocks) != 1:
        return None
    return blocks[0].strip()


def unwrap_answer(text: str) -> str:
    """The text inside when the whole of ``text`` (surrounding whitespace aside) is one
    ``<answer>...</answer>`` span, else ``text`` unchanged.

    >>> unwrap_answer(" <answer>B</answer>\\n"), unwrap_answer("B"), unwrap_answer("x <answer>B</answer>")
    ('B', 'B', 'x <answer>B</answer>')
    """
    whole = ANSWER_BLOCK.fullmatch(text.strip())
    return whole.group(1) if whole else text
