"""Reading the released LongVideo-Reason JSONL rows into our normalised :class:`~datamodules.rows.QARow`.

A released row is ``{"problem_id", "data_type": "video", "videos": "<id>.mp4", "problem",
"problem_type", "reasoning", "answer": "<answer>X</answer>"}``. A multiple-choice question
may carry its options inside ``problem``, one per line (``A. red``, ``(B) blue``, ``C) ...``)
or inline (``... Options: (A) red (B) blue``); they are split out into ``options``, so every
prompt lists them the same way. A row that cannot become a usable sample raises
:class:`RowRejected` with a reason code (the ``lvrl data build`` rejects file counts them).
Every field is type-checked (nothing is converted but an integer ``problem_id``, taken as its
decimal text: a number, list or null where a string belongs is ``malformed``), a one-letter
answer is read in either case, and the texts are bounded by :class:`TextLimits` (``too_long``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.qa import CATEGORIES, MULTIPLE_CHOICE, OPTION_LETTERS, answer_blocks
from datamodules.rows import MalformedRow, QARow, parse_row

# Reason codes of rows that are not written, in the order a row is checked.
TOO_LONG = "too_long"
NOT_UTF8 = "not_utf8"
MALFORMED = "malformed"
NOT_VIDEO = "not_video"
NO_ANSWER = "no_answer"
NO_OPTIONS = "no_options"
ANSWER_NOT_AN_OPTION = "answer_not_an_option"
DUPLICATE_ID = "duplicate_id"
OUTSIDE_ROOT = "outside_root"
MISSING_VIDEO = "missing_video"
UNSUPPORTED_CONTAINER = "unsupported_container"
VIDEO_TOO_LARGE = "video_too_large"
UNDECODABLE = "undecodable"
VIDEO_TOO_LONG = "video_too_long"
REJECT_REASONS = (
    TOO_LONG,
    NOT_UTF8,
    MALFORMED,
    NOT_VIDEO,
    NO_ANSWER,
    NO_OPTIONS,
    ANSWER_NOT_AN_OPTION,
    DUPLICATE_ID,
    OUTSIDE_ROOT,
    MISSING_VIDEO,
    UNSUPPORTED_CONTAINER,
    VIDEO_TOO_LARGE,
    UNDECODABLE,
    VIDEO_TOO_LONG,
)


@dataclass(frozen=True)
class TextLimits:
    """Most characters (bytes for a line) a released row may hold; longer ones are ``too_long``.

    Generous for the real data (questions of a few hundred characters, reasoning of a few
    thousand): they exist so that one pathological row cannot stall tokenisation or exhaust
    memory later. At most ``len(OPTION_LETTERS)`` (10) options, the letters A-J.
    """

    line_bytes: int = 1 << 20
    question_chars: int = 4_000
    """The question without its options."""
    reasoning_chars: int = 20_000
    option_chars: int = 1_000
    """Each option's text."""
    answer_chars: int = 4_000
    """The unwrapped answer (open-ended answers are free text)."""
    id_chars: int = 1_000
    """``problem_id`` and ``videos``."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TextLimits.{name}={value!r} must be a positive integer")

    @property
    def problem_chars(self) -> int:
        """The raw ``problem``: the question plus up to 10 options with their letters and separators."""
        return self.question_chars + len(OPTION_LETTERS) * (self.option_chars + 8)


# The option regexes are written so that matching costs linear time on any text (no nested
# or adjacent quantifiers that can backtrack over the same whitespace).
# "A. text", "A) text", "(A) text", "[A] text", "A: text" at the start of a line (the text follows).
_OPTION_LINE = re.compile(r"\s*[\(\[]?([A-J])(?:[\)\]][.:]?|[.:])")
# An inline option marker: "(A)" anywhere, or "A." / "A)" / "A:" after whitespace.
_INLINE_MARKER = re.compile(r"(?:\(([A-J])\)|(?<![^\s])([A-J])[.):])\s+")
_CATEGORY_ALIASES = {c.casefold(): c for c in CATEGORIES} | {"goal": "Goal and Purpose"}


class RowRejected(ValueError):
    """A released row that will not be written; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _strip_label(question: str) -> str:
    """The question without a trailing "Options:" / "choices" label."""
    text = question.rstrip()
    text = text.removesuffix(":").rstrip()
    for label in ("options", "choices"):
        if text[-len(label) :].lower() == label:
            return text[: -len(label)].strip()
    return question.strip()


def _options_from_lines(problem: str) -> tuple[str, tuple[str, ...]] | None:
    # The first block of consecutive lines lettered A, B, C, ...; lines after it (e.g. "Answer
    # with the letter.") stay with the question.
    lines = problem.strip().splitlines()
    options: list[str] = []
    first = end = None
    for i, line in enumerate(lines):
        match = _OPTION_LINE.match(line)
        expected = OPTION_LETTERS[len(options)] if len(options) < len(OPTION_LETTERS) else None
        text = line[match.end() :].strip() if match and match.group(1) == expected else ""
        if text:
            first = i if first is None else first
            options.append(text)
        elif options:
            end = i
            break
    if len(options) < 2 or first is None:
        return None
    after = lines[end:] if end is not None else []
    return _strip_label("\n".join([*lines[:first], *after])), tuple(options)


def _options_inline(problem: str) -> tuple[str, tuple[str, ...]] | None:
    markers = [(m.start(), m.end(), m.group(1) or m.group(2)) for m in _INLINE_MARKER.finditer(problem)]
    # following[i][letter]: the first marker at or after i with that letter (so a run costs at
    # most 10 look-ups, not a scan of every later marker).
    following: list[dict[str, int]] = [{}] * (len(markers) + 1)
    for i in range(len(markers) - 1, -1, -1):
        following[i] = {**following[i + 1], markers[i][2]: i}
    # The last run of markers lettered A, B, C, ... in order is the option list.
    for first in range(len(markers) - 1, -1, -1):
        if markers[first][2] != "A":
            continue
        run = [markers[first]]
        position = first
        for letter in OPTION_LETTERS[1:]:
            found = following[position + 1].get(letter)
            if found is None:
                break
            run.append(markers[found])
            position = found
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


def kind_of(value: Any) -> str:
    """What a JSON value is, for a message (never the value itself: it may be huge)."""
    if value is None:
        return "null or nothing"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else "a string"
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )


def _field(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if name == "videos" and isinstance(value, list) and len(value) == 1:
        value = value[0]  # some exports wrap the one video in a list
    if not isinstance(value, str) or not value.strip():
        raise RowRejected(MALFORMED, f"field {name!r} must be a non-empty string, got {kind_of(value)}")
    return value.strip()


def _identifier(value: Any) -> str:
    """A row's ``problem_id``: a non-empty string, or an integer as its decimal text (NVlabs'
    LongVideo-Reason generation script writes integers); anything else is ``malformed``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise RowRejected(
            MALFORMED, f"field 'problem_id' must be a non-empty string or an integer, got {kind_of(value)}"
        )
    return value.strip()


def _given_options(obj: dict[str, Any]) -> tuple[str, ...] | None:
    """The ``options`` list of a row, or ``None`` when there is none (absent, null or empty)."""
    given = obj.get("options")
    if given is None or given == []:
        return None
    if not isinstance(given, list):
        raise RowRejected(MALFORMED, f"field 'options' must be a list of strings, got {kind_of(given)}")
    for i, option in enumerate(given):
        if not isinstance(option, str) or not option.strip():
            raise RowRejected(MALFORMED, f"option {i} must be a non-empty string, got {kind_of(option)}")
    if len(given) > len(OPTION_LETTERS):
        raise RowRejected(TOO_LONG, f"{len(given)} options; at most {len(OPTION_LETTERS)} (A-J)")
    return tuple(o.strip() for o in given)


def check_lengths(row: QARow, limits: TextLimits) -> None:
    """Raise :class:`RowRejected` (``too_long``) if a text of ``row`` is longer than ``limits`` allow."""
    texts = [
        ("problem_id", row.problem_id, limits.id_chars),
        ("videos", row.video, limits.id_chars),
        ("question", row.problem, limits.question_chars),
        ("reasoning", row.reasoning, limits.reasoning_chars),
        ("answer", row.answer, limits.answer_chars),
        *((f"option {OPTION_LETTERS[i]}", o, limits.option_chars) for i, o in enumerate(row.options)),
    ]
    for name, text, limit in texts:
        if len(text) > limit:
            raise RowRejected(TOO_LONG, f"the {name} has {len(text):,} characters; at most {limit:,}")


def normalise_released_row(obj: Any, limits: TextLimits | None = None) -> QARow:
    """The :class:`QARow` of a released JSONL row, options split out and the answer unwrapped.

    Raises :class:`RowRejected` (``malformed``, ``not_video``, ``no_answer``, ``no_options``,
    ``answer_not_an_option``, ``too_long``) naming the problem. Fields we do not know are kept
    in ``extra``; an unknown ``category`` is kept as ``source_category`` and the row gets none.
    """
    limits = limits or TextLimits()
    if not isinstance(obj, dict):
        raise RowRejected(MALFORMED, f"a row must be a JSON object, got {kind_of(obj)}")
    problem_id = _identifier(obj.get("problem_id"))
    video = _field(obj, "videos")
    problem = _field(obj, "problem")
    problem_type = _field(obj, "problem_type").lower()
    if len(problem) > limits.problem_chars:  # before the option split reads it
        raise RowRejected(
            TOO_LONG, f"the problem has {len(problem):,} characters; at most {limits.problem_chars:,}"
        )
    data_type = obj.get("data_type", "video")
    if not isinstance(data_type, str):
        raise RowRejected(MALFORMED, f"field 'data_type' must be a string, got {kind_of(data_type)}")
    if data_type != "video":
        raise RowRejected(NOT_VIDEO, f"data_type is {data_type[:60]!r}, not 'video'")
    raw_answer = obj.get("answer")
    if raw_answer is not None and not isinstance(raw_answer, str):
        # A bare number is not taken as its decimal text: the release writes "<answer>3</answer>".
        raise RowRejected(MALFORMED, f"field 'answer' must be a string, got {kind_of(raw_answer)}")
    if raw_answer is None or not raw_answer.strip():
        raise RowRejected(NO_ANSWER, "no answer")
    tagged = answer_blocks(raw_answer)
    if len(tagged) > 1:
        raise RowRejected(MALFORMED, f"answer {raw_answer[:100]!r} holds {len(tagged)} <answer> blocks")
    answer = (tagged[0] if tagged else raw_answer).strip()
    if not answer:
        raise RowRejected(NO_ANSWER, f"answer {raw_answer[:100]!r} is empty")
    reasoning = obj.get("reasoning")
    if reasoning is None:
        reasoning = ""
    if not isinstance(reasoning, str):
        raise RowRejected(MALFORMED, f"field 'reasoning' must be a string, got {kind_of(reasoning)}")

    options: tuple[str, ...] = ()
    question = problem
    given = _given_options(obj)
    if problem_type == MULTIPLE_CHOICE:
        if given is not None:
            options = given
        else:
            question, options = split_embedded_options(problem)
        if not options:
            raise RowRejected(
                NO_OPTIONS, "multiple-choice question with no options in 'problem' or 'options'"
            )
        answer = answer.rstrip(".").strip("()[] ")
        if len(answer) == 1 and answer.upper() in OPTION_LETTERS[: len(options)]:
            answer = answer.upper()  # "b" is B
        if answer not in OPTION_LETTERS[: len(options)]:
            letters = ", ".join(OPTION_LETTERS[: len(options)])
            raise RowRejected(
                ANSWER_NOT_AN_OPTION, f"answer {answer[:100]!r} is not one of the options {letters}"
            )

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
        row = parse_row(normalised)
    except MalformedRow as err:  # e.g. an empty option text
        raise RowRejected(MALFORMED, str(err)) from err
    check_lengths(row, limits)
    return row
