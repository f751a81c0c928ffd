"""The question/answer vocabulary shared by the data, the rewards and evaluation."""

from __future__ import annotations

CATEGORIES: tuple[str, ...] = ("Temporal", "Goal and Purpose", "Spatial", "Plot")
"""LongVideo-Reason's four reasoning categories."""
OPTION_LETTERS = "ABCDEFGHIJ"
"""Letters of multiple-choice options, in order (at most ten options)."""
MULTIPLE_CHOICE = "multiple choice"
"""The ``problem_type`` of a multiple-choice question."""
