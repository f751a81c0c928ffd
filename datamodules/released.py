"""Reading the released LongVideo-Reason JSONL rows into our normalised :class:`~datamodules.rows.QARow`.

A released row is ``{"problem_id", "data_type": "video", "videos": "<id>.mp4", "problem",
"problem_type", "reasoning", "answer": "<answer>X</answer>"}``. A multiple-choice question
may carry its options inside ``problem``, one per line (``A. red``, ``(B) blue``, ``C) ...``)
or inline (``... Options: (A) red (B) blue``); they are split out into ``options``, so every
prompt lists them the same way. A row that cannot become a usable sample raises
:class:`RowRejected` with a reason code (the ``lvrl data build`` rejects file counts them).
"""

from __future__ import annotations

import re
from typing import Any

from datamodules.rows import CATEGORIES, MULTIPLE_CHOICE, OPTION_LETTERS, MalformedRow, QARow, parse_row

# Reason codes of rows that are not written, in the order a row is checked.
MALFORMED = "malformed"
NOT_VIDEO = "not_video"
NO_ANSWER = "no_answer"
NO_OPTIONS = "no_options"
ANSWER_NOT_AN_OPTION = "answer_not_an_option"
DUPLICATE_ID = "duplicate_id"
MISSING_VIDEO = "missing_video"
UNDECODABLE = "undecodable"
REJECT_REASONS = (
    MALFORMED,
    NOT_VIDEO,
    NO_ANSWER,
    NO_OPTIONS,
    ANSWER_NOT_AN_OPTION,
    DUPLICATE_ID,
    MISSING_VIDEO,
    UNDECODABLE,
)

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# "A. text", "A) text", "(A) text", "[A] text", "A: text" at the start of a line.
_OPTION_LINE = re.compile(r"^\s*[\(\[]?([A-J])(?:[\)\]][.:]?|[.:])\s*(.+?)\s*$")
# An inline option marker: "(A)" anywhere, or "A." / "A)" / "A:" after whitespace.
_INLINE_MARKER = re.compile(r"(?:\(([A-J])\)|(?<![^\s])([A-J])[.):])\s+")
_OPTIONS_LABEL = re.compile(r"\s*(?:options|choices)\s*:?\s*$", re.IGNORECASE)
_CATEGORY_ALIASES = {c.casefold(): c for c in CATEGORIES} | {"goal": "Goal and Purpose"}


class RowRejected(ValueError):
    """A released row that will not be written; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _strip_label(question: str) -> str:
    return _OPTIONS_LABEL.sub("", question).strip()


def _options_from_lines(problem: str) -> tuple[str, tuple[str, ...]] | None:
    # The first block of consecutive lines lettered A, B, C, ...; lines after it (e.g. "Answer
    # with the letter.") stay with the question.
    lines = problem.strip().splitlines()
    options: list[str] = []
    first = end = None
    for i, line in enumerate(lines):
        match = _OPTION_LINE.match(line)
        if match and len(options) < len(OPTION_LETTERS) and match.group(1) == OPTION_LETTERS[len(options)]:
            first = i if first is None else first
            options.append(match.group(2))
        elif options:
            end = i
            break
    if len(options) < 2 or first is None:
        return None
    after = lines[end:] if end is not None else []
    return _strip_label("\n".join([*lines[:first], *after])), tuple(options)


def _options_inline(problem: str) -> tuple[str, tuple[str, ...]] | None:
    markers = [(m.start(), m.end(), m.group(1) or m.group(2)) for m in _INLINE_MARKER.finditer(problem)]
    # The last run of markers lettered A, B, C, ... in order is the option list.
    for first in range(len(markers) - 1, -1, -1):
        if markers[first][2] != "A":
            continue
        run = [markers[first]]
        for marker in markers[first + 1 :]:
            if marker[2] == OPTION_LETTERS[len(run)]:
                run.append(marker)
        if len(run) < 2:
            continue
        ends = [m[0] for m in run[1:]] + [len(problem)]
        options = tuple(
            problem[m[1] : end].strip().rstrip(",;").strip() for m, end in zip(run, ends, strict=True)
        )
        if all(options):
            return _strip_label(problem[: run[0][0]]), options
    return None


def split_embedded_options(problem: str) -> tuple[str, tuple[str, ...]]:
    """Split a multiple-choice ``problem`` into the question and its option texts.

    Options one per line win (text after the block stays with the question); otherwise the
    last inline run ``(A) .. (B) ..``. No options found: the problem unchanged and ``()``.

    >>> split_embedded_options("Which colour?\\nA. red\\nB. blue")
    ('Which colour?', ('red', 'blue'))
    >>> split_embedded_options("Which colour? Options: (A) red (B) blue (C) green")
    ('Which colour?', ('red', 'blue', 'green'))
    >>> split_embedded_options("Why did it fall?")
    ('Why did it fall?', ())
    """
    found = _options_from_lines(problem) or _options_inline(problem)
    if found is None or not found[0]:
        return problem.strip(), ()
    return found


def _field(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if isinstance(value, list) and len(value) == 1:  # some exports wrap the one video in a list
        value = value[0]
    if not isinstance(value, str) or not value.strip():
        raise RowRejected(MALFORMED, f"field {name!r} is missing or not a non-empty string")
    return value.strip()


def normalise_released_row(obj: Any) -> QARow:
    """The :class:`QARow` of a released JSONL row, options split out and the answer unwrapped.

    Raises :class:`RowRejected` (``malformed``, ``not_video``, ``no_answer``, ``no_options``,
    ``answer_not_an_option``) naming the problem. Fields we do not know are kept in ``extra``;
    an unknown ``category`` is kept as ``source_category`` and the row gets none.
    """
    if not isinstance(obj, dict):
        raise RowRejected(MALFORMED, f"a row must be a JSON object, got {type(obj).__name__}")
    problem_id = _field(obj, "problem_id")
    video = _field(obj, "videos")
    problem = _field(obj, "problem")
    problem_type = _field(obj, "problem_type").lower()
    data_type = obj.get("data_type", "video")
    if data_type != "video":
        raise RowRejected(NOT_VIDEO, f"data_type is {data_type!r}, not 'video'")
    raw_answer = obj.get("answer")
    if not isinstance(raw_answer, str) or not raw_answer.strip():
        raise RowRejected(NO_ANSWER, "no answer")
    tagged = _ANSWER_TAG.findall(raw_answer)
    if len(tagged) > 1:
        raise RowRejected(MALFORMED, f"answer {raw_answer!r} holds {len(tagged)} <answer> blocks")
    answer = (tagged[0] if tagged else raw_answer).strip()
    if not answer:
        raise RowRejected(NO_ANSWER, f"answer {raw_answer!r} is empty")
    reasoning = obj.get("reasoning") or ""
    if not isinstance(reasoning, str):
        raise RowRejected(MALFORMED, "field 'reasoning' is not a string")

    options: tuple[str, ...] = ()
    question = problem
    if problem_type == MULTIPLE_CHOICE:
        given = obj.get("options")
        if isinstance(given, list) and given:
            options = tuple(str(o).strip() for o in given)
        else:
            question, options = split_embedded_options(problem)
        if not options:
            raise RowRejected(
                NO_OPTIONS, "multiple-choice question with no options in 'problem' or 'options'"
            )
        answer = answer.rstrip(".").strip("()[] ")
        if answer not in OPTION_LETTERS[: len(options)]:
            letters = ", ".join(OPTION_LETTERS[: len(options)])
            raise RowRejected(ANSWER_NOT_AN_OPTION, f"answer {answer!r} is not one of the options {letters}")

    extra = {
        k: v
        for k, v in obj.items()
        if k not in {"problem_id", "data_type", "videos", "problem", "problem_type", "reasoning", "answer"}
        and k not in {"category", "options"}
    }
    raw_category = obj.get("category")
    category = _CATEGORY_ALIASES.get(raw_category.casefold()) if isinstance(raw_category, str) else None
    if raw_category is not None and category is None:
        extra["source_category"] = raw_category
    if question != problem:
        extra["source_problem"] = problem
    normalised = {
        "problem_id": problem_id,
        "videos": video,
        "problem": question,
        "problem_type": problem_type,
        "reasoning": reasoning.strip(),
        "answer": answer,
        "category": category,
        "options": list(options),
        **extra,
    }
    try:
        return parse_row(normalised)
    except MalformedRow as err:  # e.g. an empty option text
        raise RowRejected(MALFORMED, str(err)) from err
