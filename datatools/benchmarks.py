"""The published annotations of four long-video benchmarks as normalised multiple-choice :class:`QARow` s.

``lvrl data build --format F`` reads one annotation file of benchmark ``F`` (Parquet, a JSON
list or JSONL: :mod:`datatools.annotation_files`); every question becomes a row like a converted
LongVideo-Reason one, or a named rejection. What each format reads, as its authors publish it:

- ``videomme`` (lmms-lab/Video-MME ``videomme/test-00000-of-00001.parquet``, or its rows as JSON
  or JSONL): ``question_id``, ``videoID`` (the video is ``<videoID>.mp4``, or ``.MP4`` / ``.mkv``:
  :func:`datatools.ingest.video_otherwise_named`), ``question``, ``options`` (``["A. ...",
  "B. ...", ...]``; the letters are stripped), ``answer`` (a letter), ``task_type``.
- ``longvideobench`` (``lvb_val.json``, a JSON list, or ``validation-00000-of-00001.parquet``):
  ``id``, ``video_path``, ``question``, ``candidates`` (in the Parquet file ``option0`` ..
  ``option4``, padded with ``"N/A"``), ``correct_choice`` (0-based index), ``question_category``.
- ``mlvu`` (MLVU-Dev ``json/<n>_<task>.json``, a JSON list per task): ``video``, ``question``,
  ``candidates``, ``answer`` (the *text* of the right candidate, which must match exactly one),
  ``question_type``. The entries carry no id: the row's id is
  ``<question_type>/<video>/<12 hex digits of the SHA-256 of the question>`` (``question_id`` is
  used instead where an export has one), so a repeated question on one video is a duplicate.
- ``lvbench`` (THUDM/LVBench ``video_info.meta.jsonl``, one video per line): ``key`` (the video
  is ``<key>.mp4``) and ``qa``, a list of ``{uid, question, answer, question_type,
  time_reference}``; the options are lines ``(A) ...`` inside ``question``; ``uid`` may be a
  number (the benchmark's scorer keys answers by ``str(uid)``, so the id is its decimal text).
  Each question is one record; a video line that cannot be read is one rejected record.

Every row is ``multiple choice`` with the option texts, the answer letter and no reasoning.
``category`` stays ``None``: :data:`~core.qa.CATEGORIES` are LongVideo-Reason's four reasoning
types, and no benchmark's task taxonomy maps onto them without guessing (a guessed mapping would
mix unlike questions in per-category accuracy). The benchmark's own label goes to
``extra["source_category"]`` (a string; LVBench's list of question types as a list), its name to
``extra["benchmark"]``, the entry's other fields to ``extra["source"]`` (LVBench's video-level
fields to ``extra["source_video"]``), and a question that held its options to
``extra["source_problem"]``. The video name is resolved under ``--videos-root`` by
:func:`datatools.ingest.locate_video`, like a released row's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.qa import MULTIPLE_CHOICE, OPTION_LETTERS
from datamodules.rows import MalformedRow, QARow, parse_row
from datatools.annotation_files import Entry, read_entries
from datatools.released import (
    ANSWER_NOT_AN_OPTION,
    MALFORMED,
    NO_ANSWER,
    NO_OPTIONS,
    TOO_LONG,
    RowRejected,
    TextLimits,
    check_lengths,
    kind_of,
    split_embedded_options,
)

LONGVIDEO_REASON = "longvideo_reason"
VIDEOMME = "videomme"
LONGVIDEOBENCH = "longvideobench"
MLVU = "mlvu"
LVBENCH = "lvbench"
BENCHMARKS = (VIDEOMME, LONGVIDEOBENCH, MLVU, LVBENCH)
FORMATS = (LONGVIDEO_REASON, *BENCHMARKS)
"""What ``lvrl data build --format`` accepts; ``longvideo_reason`` is :mod:`datatools.released`."""
MIN_OPTIONS = 2
_ID_HEX = 12
# An option's own letter: "A. text", "A) text", "(A) text", "A: text" (whitespace or the end after it).
_LETTERED = re.compile(r"\s*\(?([A-J])[.):](?:\s+|$)")


@dataclass(frozen=True)
class Record:
    """One question of an annotation file: its row, or why it has none."""

    number: int
    """Its place in the file: the JSONL line or JSON-list position of its entry; for LVBench, the
    question's 1-based count over the file (a video line that cannot be read counts one)."""
    row: QARow | None
    error: RowRejected | None = None
    problem_id: Any = None
    """The entry's id field as given (for the rejects file), when the row has none."""
    video: Any = None
    """The entry's video field as given, when the row has none."""


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RowRejected(MALFORMED, f"{what} must be a JSON object, got {kind_of(value)}")
    return value


def _text(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value.strip():
        raise RowRejected(MALFORMED, f"field {name!r} must be a non-empty string, got {kind_of(value)}")
    return value.strip()


def _label(obj: dict[str, Any], name: str) -> str | None:
    """An optional text field: absent or null is ``None``; other than a non-empty string, ``malformed``."""
    return None if obj.get(name) is None else _text(obj, name)


def _candidates(obj: dict[str, Any], name: str) -> tuple[str, ...]:
    value = obj.get(name)
    if value is None or value == []:
        raise RowRejected(NO_OPTIONS, f"no options in field {name!r}")
    if not isinstance(value, list):
        raise RowRejected(MALFORMED, f"field {name!r} must be a list of strings, got {kind_of(value)}")
    if len(value) > len(OPTION_LETTERS):
        raise RowRejected(TOO_LONG, f"{len(value)} options; at most {len(OPTION_LETTERS)} (A-J)")
    for i, option in enumerate(value):
        if not isinstance(option, str) or not option.strip():
            message = f"option {i} of {name!r} must be a non-empty string, got {kind_of(option)}"
            raise RowRejected(MALFORMED, message)
    if len(value) < MIN_OPTIONS:
        message = f"one option in field {name!r}; a question needs at least {MIN_OPTIONS}"
        raise RowRejected(NO_OPTIONS, message)
    return tuple(option.strip() for option in value)


def _without_letters(options: tuple[str, ...]) -> tuple[str, ...]:
    """The option texts without their letters, when every option is lettered A, B, C, ... in order.

    Options with no letter are kept as they are; a mix, or letters out of order, is ``malformed``
    (which text belongs to which letter would be a guess).
    """
    matches = [_LETTERED.match(option) for option in options]
    if not any(matches):
        return options
    texts = []
    for i, (option, match) in enumerate(zip(options, matches, strict=True)):
        expected = OPTION_LETTERS[i]
        if match is None or match.group(1) != expected:
            found = f"lettered {match.group(1)}" if match else "not lettered"
            raise RowRejected(MALFORMED, f"option {i} is {found}; the options must be lettered A, B, C, ...")
        text = option[match.end() :].strip()
        if not text:
            raise RowRejected(MALFORMED, f"option {expected} has its letter and no text")
        texts.append(text)
    return tuple(texts)


def _letter(obj: dict[str, Any], name: str, count: int) -> str:
    """The answer letter among the first ``count``; ``A``, ``A.``, ``(A)`` all read as ``A``."""
    value = obj.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise RowRejected(NO_ANSWER, f"no answer in field {name!r}")
    if not isinstance(value, str):
        raise RowRejected(MALFORMED, f"field {name!r} must be an option letter, got {kind_of(value)}")
    letter = value.strip().rstrip(".").strip("()[] ")
    letters = OPTION_LETTERS[:count]
    if len(letter) != 1 or letter not in letters:
        raise RowRejected(
            ANSWER_NOT_AN_OPTION, f"answer {value[:100]!r} is not one of the options {', '.join(letters)}"
        )
    return letter


def _rest(obj: dict[str, Any], used: set[str]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key not in used}


def _row(
    benchmark: str,
    *,
    problem_id: str,
    video: str,
    question: str,
    options: tuple[str, ...],
    letter: str,
    label: Any,
    limits: TextLimits,
    **extra: Any,
) -> QARow:
    normalised = {
        "problem_id": problem_id,
        "videos": video,
        "problem": question,
        "problem_type": MULTIPLE_CHOICE,
        "reasoning": "",
        "answer": letter,
        "category": None,
        "options": list(options),
        "benchmark": benchmark,
        "source_category": label,
        **extra,
    }
    try:
        row = parse_row(normalised)
    except MalformedRow as err:  # kept as a last check; the fields above are already validated
        raise RowRejected(MALFORMED, str(err)) from err
    check_lengths(row, limits)
    return row


def normalise_videomme(entry: Any, limits: TextLimits) -> QARow:
    """The row of one Video-MME question (a row of its parquet file)."""
    obj = _object(entry, "an entry")
    problem_id = _text(obj, "question_id")
    stem = _text(obj, "videoID")
    question = _text(obj, "question")
    options = _without_letters(_candidates(obj, "options"))
    letter = _letter(obj, "answer", len(options))
    label = _label(obj, "task_type")
    used = {"question_id", "videoID", "question", "options", "answer", "task_type"}
    return _row(
        VIDEOMME,
        problem_id=problem_id,
        video=f"{stem}.mp4",
        question=question,
        options=options,
        letter=letter,
        label=label,
        limits=limits,
        source=_rest(obj, used),
    )


PADDED_OPTIONS = tuple(f"option{i}" for i in range(5))
"""LongVideoBench's Parquet layout: the candidates as five columns, padded with ``"N/A"``."""
NOT_AN_OPTION = "N/A"


def _padded_candidates(obj: dict[str, Any]) -> tuple[str, ...]:
    """The candidates of a Parquet row: ``option0`` on, up to the first ``"N/A"`` (as lmms-eval
    reads them); a real candidate after a padding one is ``malformed`` (which letter is which?)."""
    values = [obj.get(name) for name in PADDED_OPTIONS]
    count = next((i for i, value in enumerate(values) if value == NOT_AN_OPTION), len(values))
    if any(value not in (NOT_AN_OPTION, None) for value in values[count:]):
        raise RowRejected(MALFORMED, f"a candidate follows the '{NOT_AN_OPTION}' padding of option{count}")
    return _candidates({"candidates": values[:count]}, "candidates")


def normalise_longvideobench(entry: Any, limits: TextLimits) -> QARow:
    """The row of one LongVideoBench question: an entry of ``lvb_val.json`` (``candidates``), or a
    row of ``validation-00000-of-00001.parquet`` (``option0`` .. ``option4``, padded with "N/A")."""
    obj = _object(entry, "an entry")
    problem_id = _text(obj, "id")
    video = _text(obj, "video_path")
    question = _text(obj, "question")
    padded = "candidates" not in obj and PADDED_OPTIONS[0] in obj
    options = _padded_candidates(obj) if padded else _candidates(obj, "candidates")
    choice = obj.get("correct_choice")
    if choice is None:  # e.g. lvb_test_wo_gt.json, which publishes no answers
        raise RowRejected(NO_ANSWER, "no 'correct_choice'")
    if isinstance(choice, bool) or not isinstance(choice, int):
        shown = repr(choice) if isinstance(choice, float) else kind_of(choice)
        raise RowRejected(MALFORMED, f"field 'correct_choice' must be an integer index, got {shown}")
    if not 0 <= choice < len(options):
        last = len(options) - 1
        message = f"correct_choice {choice} is not an index of the {len(options)} candidates (0-{last})"
        raise RowRejected(ANSWER_NOT_AN_OPTION, message)
    label = _label(obj, "question_category")
    used = {"id", "video_path", "question", "candidates", "correct_choice", "question_category"}
    used |= set(PADDED_OPTIONS) if padded else set()
    return _row(
        LONGVIDEOBENCH,
        problem_id=problem_id,
        video=video,
        question=question,
        options=options,
        letter=OPTION_LETTERS[choice],
        label=label,
        limits=limits,
        source=_rest(obj, used),
    )


def _mlvu_id(obj: dict[str, Any], video: str, question: str, label: str | None) -> str:
    if obj.get("question_id") is not None:
        return _text(obj, "question_id")
    digest = hashlib.sha256(question.encode("utf-8")).hexdigest()[:_ID_HEX]
    return f"{label or MLVU}/{video}/{digest}"


def normalise_mlvu(entry: Any, limits: TextLimits) -> QARow:
    """The row of one MLVU multiple-choice question (an entry of a task's JSON list)."""
    obj = _object(entry, "an entry")
    video = _text(obj, "video")
    question = _text(obj, "question")
    options = _candidates(obj, "candidates")
    answer = obj.get("answer")
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise RowRejected(NO_ANSWER, "no answer in field 'answer'")
    if not isinstance(answer, str):
        raise RowRejected(MALFORMED, f"field 'answer' must be a candidate's text, got {kind_of(answer)}")
    matches = [i for i, option in enumerate(options) if option == answer.strip()]
    if len(matches) != 1:
        # No match, or two equal candidates: which letter is right would be a guess.
        found = "none" if not matches else ", ".join(OPTION_LETTERS[i] for i in matches)
        message = f"answer {answer[:100]!r} must be the text of exactly one candidate; it matches {found}"
        raise RowRejected(ANSWER_NOT_AN_OPTION, message)
    label = _label(obj, "question_type")
    used = {"video", "question", "candidates", "answer", "question_type", "question_id"}
    return _row(
        MLVU,
        problem_id=_mlvu_id(obj, video, question, label),
        video=video,
        question=question,
        options=options,
        letter=OPTION_LETTERS[matches[0]],
        label=label,
        limits=limits,
        source=_rest(obj, used),
    )


def _question_types(obj: dict[str, Any]) -> list[str] | None:
    value = obj.get("question_type")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise RowRejected(MALFORMED, f"field 'question_type' must be a list of strings, got {kind_of(value)}")
    return [t.strip() for t in value]


def _uid(obj: dict[str, Any]) -> str:
    value = obj.get("uid")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # as LVBench's own scorer keys it
    return _text(obj, "uid")


def normalise_lvbench_question(
    question_entry: Any, key: str, video_fields: dict[str, Any], limits: TextLimits
) -> QARow:
    """The row of one LVBench question of the video ``key`` (one item of its ``qa`` list)."""
    obj = _object(question_entry, "a question")
    problem_id = _uid(obj)
    problem = _text(obj, "question")
    if len(problem) > limits.problem_chars:  # before the option split reads it
        raise RowRejected(
            TOO_LONG, f"the question has {len(problem):,} characters; at most {limits.problem_chars:,}"
        )
    question, options = split_embedded_options(problem)
    if not options:
        raise RowRejected(NO_OPTIONS, "no lettered options '(A) ...' in the question")
    letter = _letter(obj, "answer", len(options))
    label = _question_types(obj)
    return _row(
        LVBENCH,
        problem_id=problem_id,
        video=f"{key}.mp4",
        question=question,
        options=options,
        letter=letter,
        label=label,
        limits=limits,
        source=_rest(obj, {"uid", "question", "answer", "question_type"}),
        source_video=video_fields,
        source_problem=problem,
    )


def _field_of(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else None


def _lvbench_records(entries: Iterator[Entry], limits: TextLimits) -> Iterator[Record]:
    number = 0
    for entry in entries:
        if entry.error is not None:
            number += 1
            yield Record(number, None, RowRejected(entry.error.reason, f"{entry.where}: {entry.error}"))
            continue
        try:
            video_entry = _object(entry.value, "a video entry")
            key = _text(video_entry, "key")
            questions = video_entry.get("qa")
            if not isinstance(questions, list) or not questions:
                raise RowRejected(
                    MALFORMED, f"field 'qa' must be a non-empty list of questions, got {kind_of(questions)}"
                )
        except RowRejected as err:
            number += 1
            located = RowRejected(err.reason, f"{entry.where}: {err}")
            yield Record(number, None, located, None, _field_of(entry.value, "key"))
            continue
        video_fields = _rest(video_entry, {"qa"})
        for index, question_entry in enumerate(questions, start=1):
            number += 1
            try:
                yield Record(number, normalise_lvbench_question(question_entry, key, video_fields, limits))
            except RowRejected as err:
                located = RowRejected(err.reason, f"{entry.where}, question {index}: {err}")
                yield Record(number, None, located, _field_of(question_entry, "uid"), f"{key}.mp4")


_SINGLE: dict[str, tuple[Callable[[Any, TextLimits], QARow], str, str]] = {
    VIDEOMME: (normalise_videomme, "question_id", "videoID"),
    LONGVIDEOBENCH: (normalise_longvideobench, "id", "video_path"),
    MLVU: (normalise_mlvu, "question_id", "video"),
}
"""Formats with one question per entry: the normaliser, and the id and video fields for the rejects file."""


def benchmark_records(path: Path, benchmark: str, limits: TextLimits) -> Iterator[Record]:
    """Every question of a benchmark's annotation file as a :class:`Record`, in file order.

    Nothing in an entry stops the iteration; a file that cannot be read as entries at all
    raises :class:`~datatools.annotation_files.AnnotationFileError` before the first record.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark format {benchmark!r}; one of {', '.join(BENCHMARKS)}")
    entries = read_entries(path, limits.line_bytes)
    if benchmark == LVBENCH:
        yield from _lvbench_records(entries, limits)
        return
    normalise, id_field, video_field = _SINGLE[benchmark]
    for entry in entries:
        if entry.error is not None:
            yield Record(entry.number, None, entry.error)
            continue
        try:
            yield Record(entry.number, normalise(entry.value, limits))
        except RowRejected as err:
            hints = _field_of(entry.value, id_field), _field_of(entry.value, video_field)
            yield Record(entry.number, None, err, *hints)
