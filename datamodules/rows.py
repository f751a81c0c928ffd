"""The question/answer row: one video QA sample as stored in a shard's ``<key>.json``.

Field names follow the released LongVideo-Reason JSONL rows (``problem_id``, ``data_type``,
``videos``, ``problem``, ``problem_type``, ``reasoning``, ``answer`` written as
``<answer>X</answer>``) plus two of ours: ``category`` (one of :data:`CATEGORIES`) and
``options`` (the option texts of a multiple-choice question, without letters; the letters
are implied: A, B, C, ...). Anything else in the JSON is kept in :attr:`QARow.extra`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from core.qa import CATEGORIES, MULTIPLE_CHOICE, OPTION_LETTERS, unwrap_answer

__all__ = ["CATEGORIES", "MULTIPLE_CHOICE", "OPTION_LETTERS", "MalformedRow", "QARow", "parse_row"]

_KNOWN_FIELDS = {
    "problem_id",
    "data_type",
    "videos",
    "problem",
    "problem_type",
    "reasoning",
    "answer",
    "category",
    "options",
}


class MalformedRow(ValueError):
    """A row that cannot be used; the message says which field is wrong and why."""


@dataclass(frozen=True)
class QARow:
    problem_id: str
    video: str
    """File name of the video (the released ``videos`` field)."""
    problem: str
    """The question; for multiple choice, without the options when ``options`` is given."""
    problem_type: str
    reasoning: str
    """Chain-of-thought text (no ``<think>`` tags)."""
    answer: str
    """The bare answer: an option letter for multiple choice, free text otherwise."""
    category: str | None = None
    options: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_multiple_choice(self) -> bool:
        return self.problem_type == MULTIPLE_CHOICE

    @property
    def relevant_span_s(self) -> tuple[float, float] | None:
        """The stretch of the video (seconds) that holds the answer, when the data says so
        (``extra["relevant_span_s"]``; the zoom task's rows before that key: its ``span_s``).
        Tool-use evaluations report how much of it the answer's requests covered."""
        span = self.extra.get("relevant_span_s")
        if span is None and isinstance(self.extra.get("zoom"), dict):
            span = self.extra["zoom"].get("span_s")
        if not (isinstance(span, list | tuple) and len(span) == 2):
            return None
        try:
            start, end = float(span[0]), float(span[1])
        except (TypeError, ValueError):
            return None
        return (start, end) if 0 <= start < end < float("inf") else None

    @property
    def answer_index(self) -> int:
        """Index of the correct option (multiple choice only)."""
        return OPTION_LETTERS.index(self.answer)

    def to_json(self) -> dict[str, Any]:
        """The row in the released field layout, plus ``category`` and ``options``."""
        out = {
            "problem_id": self.problem_id,
            "data_type": "video",
            "videos": self.video,
            "problem": self.problem,
            "problem_type": self.problem_type,
            "reasoning": self.reasoning,
            "answer": f"<answer>{self.answer}</answer>",
            "category": self.category,
            "options": list(self.options),
        }
        out.update(self.extra)
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _require_str(obj: dict[str, Any], name: str, *, allow_empty: bool = False) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise MalformedRow(f"field {name!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise MalformedRow(f"field {name!r} is empty")
    return value


def parse_row(obj: Any) -> QARow:
    """Validate a decoded JSON object and return a :class:`QARow`.

    Raises :class:`MalformedRow` naming the offending field. The answer may be given either
    bare (``"B"``) or in the released ``<answer>B</answer>`` form.

    >>> parse_row({"problem_id": "q1", "videos": "v.mp4", "problem": "Which?", "reasoning": "r",
    ...            "problem_type": "multiple choice", "options": ["x", "y"],
    ...            "answer": "<answer>B</answer>"}).answer
    'B'
    """
    if not isinstance(obj, dict):
        raise MalformedRow(f"a row must be a JSON object, got {type(obj).__name__}")
    problem_id = _require_str(obj, "problem_id")
    video = _require_str(obj, "videos")
    problem = _require_str(obj, "problem")
    problem_type = _require_str(obj, "problem_type")
    reasoning = _require_str(obj, "reasoning", allow_empty=True)
    answer = _require_str(obj, "answer")
    answer = unwrap_answer(answer).strip()
    if not answer:
        raise MalformedRow("field 'answer' is empty")

    category = obj.get("category")
    if category is not None and category not in CATEGORIES:
        raise MalformedRow(f"field 'category' is {category!r}; expected one of {CATEGORIES}")

    raw_options = obj.get("options") or []
    if not isinstance(raw_options, list) or not all(isinstance(o, str) and o.strip() for o in raw_options):
        raise MalformedRow("field 'options' must be a list of non-empty strings")
    options = tuple(raw_options)
    if problem_type == MULTIPLE_CHOICE and options:
        if len(options) > len(OPTION_LETTERS):
            raise MalformedRow(f"{len(options)} options; at most {len(OPTION_LETTERS)} are supported")
        valid_letters = OPTION_LETTERS[: len(options)]
        if len(answer) != 1 or answer not in valid_letters:
            raise MalformedRow(f"answer {answer!r} is not one of the option letters {tuple(valid_letters)}")

    extra = {k: v for k, v in obj.items() if k not in _KNOWN_FIELDS}
    return QARow(problem_id, video, problem, problem_type, reasoning, answer, category, options, extra)
