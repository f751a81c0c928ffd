"""Benchmark annotation files -> QARow: each format's conversion and every rejection, per entry.

The fixtures in tests/fixtures/benchmarks/ are small hand-written files in each benchmark's
published layout (Video-MME's parquet rows as JSON, LongVideoBench's lvb_val.json, an MLVU-Dev
task JSON, LVBench's video_info.meta.jsonl); the hostile cases change one field of a good entry.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import TESTS_DIR

from datatools.annotation_files import AnnotationFileError, read_entries
from datatools.benchmarks import (
    LONGVIDEOBENCH,
    LVBENCH,
    MLVU,
    VIDEOMME,
    Record,
    benchmark_records,
    normalise_longvideobench,
    normalise_mlvu,
    normalise_videomme,
)
from datatools.released import REJECT_REASONS, RowRejected, TextLimits

FIXTURES = TESTS_DIR / "fixtures" / "benchmarks"
FILES = {
    VIDEOMME: "videomme.json",
    LONGVIDEOBENCH: "lvb_val.json",
    MLVU: "mlvu_1_plotQA.json",
    LVBENCH: "lvbench_video_info.meta.jsonl",
}
LIMITS = TextLimits()


def _records(benchmark: str, path: Path | None = None) -> list[Record]:
    return list(benchmark_records(path or FIXTURES / FILES[benchmark], benchmark, LIMITS))


def _fixture(benchmark: str) -> list[Any]:
    text = (FIXTURES / FILES[benchmark]).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()] if benchmark == LVBENCH else json.loads(text)


# ---- Conversion of each format -----------------------------------------------------------------


def test_videomme_rows_keep_the_question_strip_option_letters_and_find_the_video_by_its_id():
    rows = [r.row for r in _records(VIDEOMME)]
    assert [r.problem_id for r in rows] == ["001-1", "001-2", "002-1"]
    first = rows[0]
    assert first.video == "fFjv93ACGo8.mp4" and first.problem.startswith("When demonstrating the Germany")
    assert first.options == ("Apples.", "Candles.", "Berries.", "The three kinds are of the same number.")
    assert first.answer == "C" and first.problem_type == "multiple choice" and first.reasoning == ""
    assert first.category is None and first.extra["source_category"] == "Counting Problem"
    assert first.extra["benchmark"] == VIDEOMME
    assert first.extra["source"] == {
        "video_id": "001",
        "duration": "short",
        "domain": "Knowledge",
        "sub_category": "Humanity & History",
        "url": "https://www.youtube.com/watch?v=fFjv93ACGo8",
    }
    assert [r.answer for r in rows] == ["C", "A", "B"]


def test_longvideobench_rows_take_the_letter_of_the_correct_choice_index():
    rows = [r.row for r in _records(LONGVIDEOBENCH)]
    assert [(r.problem_id, r.video, r.answer) for r in rows] == [
        ("86CxyhFV9MI_0", "86CxyhFV9MI.mp4", "A"),
        ("86CxyhFV9MI_1", "86CxyhFV9MI.mp4", "D"),
        ("uK8X6S1JwQo_0", "uK8X6S1JwQo.mp4", "B"),
    ]
    assert len(rows[0].options) == 5 and rows[1].options[3] == "A book"
    assert [r.extra["source_category"] for r in rows] == ["TOS", "E3E", "O2E"]
    source = rows[0].extra["source"]
    assert source["duration_group"] == 600 and source["level"] == "L1-Perception"
    assert "correct_choice" not in source and "candidates" not in source


def test_mlvu_rows_find_the_letter_of_the_answer_text_and_get_a_stable_id():
    records = _records(MLVU)
    rows = [r.row for r in records]
    assert [(r.video, r.answer) for r in rows] == [
        ("movie101_66.mp4", "A"),
        ("movie101_66.mp4", "B"),
        ("movie101_8.mp4", "C"),
    ]
    assert rows[1].options == ("To hide", "To find his friend", "To catch a rabbit", "To pick berries")
    assert re.fullmatch(r"plotQA/movie101_66\.mp4/[0-9a-f]{12}", rows[0].problem_id)
    assert len({r.problem_id for r in rows}) == 3  # one video, two questions: two ids
    assert [r.row for r in _records(MLVU)] == rows  # the same ids on every reading
    assert rows[0].extra["source_category"] == "plotQA" and rows[0].extra["source"] == {"duration": 246}
    # An export that carries an id keeps it.
    entry = {**_fixture(MLVU)[0], "question_id": "PQA_0"}
    assert normalise_mlvu(entry, LIMITS).problem_id == "PQA_0"


def test_lvbench_rows_are_the_questions_of_each_video_line_with_their_options_split_out():
    records = _records(LVBENCH)
    assert [r.number for r in records] == [1, 2, 3]  # questions counted over the file
    rows = [r.row for r in records]
    assert [(r.problem_id, r.video, r.answer) for r in rows] == [
        ("5", "7Ldmdtg0rQk.mp4", "A"),
        ("6", "7Ldmdtg0rQk.mp4", "C"),
        ("140", "Xe2xQ9dJ3Lg.mp4", "D"),  # a numeric uid is its decimal text
    ]
    assert rows[0].problem == "What is the score when the first goal is scored?"
    assert rows[0].options == ("1-0", "0-1", "2-0", "1-1")
    assert rows[0].extra["source_problem"].endswith("(D) 1-1")
    assert rows[1].extra["source_category"] == ["reasoning", "event understanding"]
    assert rows[1].extra["source"] == {"time_reference": "65:02-65:30"}
    assert rows[1].extra["source_video"]["key"] == "7Ldmdtg0rQk"
    assert rows[1].extra["source_video"]["type"] == "sport" and "qa" not in rows[1].extra["source_video"]


def test_a_row_goes_to_a_shard_and_back_unchanged():
    from datamodules.rows import parse_row

    for benchmark in FILES:
        for record in _records(benchmark):
            assert record.row is not None
            assert parse_row(json.loads(json.dumps(record.row.to_json()))) == record.row


def test_video_mme_options_without_letters_are_kept_and_json_lines_are_read_too(tmp_path):
    entries = _fixture(VIDEOMME)
    entries[0]["options"] = ["Apples.", "Candles.", "Berries."]
    jsonl = tmp_path / "videomme.jsonl"
    jsonl.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    records = _records(VIDEOMME, jsonl)
    assert records[0].row is not None and records[0].row.options == ("Apples.", "Candles.", "Berries.")
    assert [r.row.problem_id for r in records if r.row] == ["001-1", "001-2", "002-1"]


# ---- Rejections of one entry --------------------------------------------------------------------


def _set(entry: dict, path: tuple, value: Any) -> dict:
    """A copy of ``entry`` with the field at ``path`` set to ``value`` (deleted for :data:`DELETE`)."""
    changed = copy.deepcopy(entry)
    target = changed
    for step in path[:-1]:
        target = target[step]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return changed


DELETE = object()
HUGE = "x" * 5_000

REJECTIONS = [
    # Video-MME
    (VIDEOMME, ("question_id",), DELETE, "malformed"),
    (VIDEOMME, ("question_id",), 7, "malformed"),
    (VIDEOMME, ("videoID",), None, "malformed"),
    (VIDEOMME, ("question",), ["Which?"], "malformed"),
    (VIDEOMME, ("question",), HUGE, "too_long"),
    (VIDEOMME, ("options",), DELETE, "no_options"),
    (VIDEOMME, ("options",), [], "no_options"),
    (VIDEOMME, ("options",), ["A. only one"], "no_options"),
    (VIDEOMME, ("options",), "A. x B. y", "malformed"),
    (VIDEOMME, ("options",), ["A. x", None], "malformed"),
    (VIDEOMME, ("options",), ["A. x", "C. y"], "malformed"),  # letters out of order
    (VIDEOMME, ("options",), ["A. x", "y"], "malformed"),  # lettered and not
    (VIDEOMME, ("options",), ["A. x", "B."], "malformed"),  # a letter and no text
    (VIDEOMME, ("options",), [f"{chr(65 + i)}. o" for i in range(11)], "too_long"),
    (VIDEOMME, ("options", 1), "B. " + HUGE, "too_long"),
    (VIDEOMME, ("answer",), DELETE, "no_answer"),
    (VIDEOMME, ("answer",), " ", "no_answer"),
    (VIDEOMME, ("answer",), 2, "malformed"),
    (VIDEOMME, ("answer",), "E", "answer_not_an_option"),
    (VIDEOMME, ("answer",), "AB", "answer_not_an_option"),
    (VIDEOMME, ("answer",), "Berries.", "answer_not_an_option"),
    (VIDEOMME, ("task_type",), 3, "malformed"),
    # LongVideoBench
    (LONGVIDEOBENCH, ("id",), DELETE, "malformed"),
    (LONGVIDEOBENCH, ("video_path",), {"file": "a.mp4"}, "malformed"),
    (LONGVIDEOBENCH, ("candidates",), DELETE, "no_options"),
    (LONGVIDEOBENCH, ("candidates",), ["a", 2], "malformed"),
    (LONGVIDEOBENCH, ("correct_choice",), DELETE, "no_answer"),  # lvb_test_wo_gt.json
    (LONGVIDEOBENCH, ("correct_choice",), "0", "malformed"),
    (LONGVIDEOBENCH, ("correct_choice",), 1.0, "malformed"),
    (LONGVIDEOBENCH, ("correct_choice",), True, "malformed"),
    (LONGVIDEOBENCH, ("correct_choice",), 5, "answer_not_an_option"),  # five candidates
    (LONGVIDEOBENCH, ("correct_choice",), -1, "answer_not_an_option"),
    (LONGVIDEOBENCH, ("question_category",), ["TOS"], "malformed"),
    # MLVU
    (MLVU, ("video",), "", "malformed"),
    (MLVU, ("candidates",), None, "no_options"),
    (MLVU, ("answer",), DELETE, "no_answer"),
    (MLVU, ("answer",), 0, "malformed"),
    (MLVU, ("answer",), "yellow", "answer_not_an_option"),  # not the text of a candidate
    (MLVU, ("answer",), "A", "answer_not_an_option"),  # a letter is not the text either
    (MLVU, ("candidates",), ["Yellow", "Red", "Yellow"], "answer_not_an_option"),  # which Yellow?
    (MLVU, ("question_type",), {"task": "plotQA"}, "malformed"),
]


@pytest.mark.parametrize(("benchmark", "path", "value", "reason"), REJECTIONS)
def test_a_bad_field_rejects_its_entry_with_a_named_reason(benchmark, path, value, reason):
    normalise = {VIDEOMME: normalise_videomme, LONGVIDEOBENCH: normalise_longvideobench, MLVU: normalise_mlvu}
    entry = _set(_fixture(benchmark)[0], path, value)
    with pytest.raises(RowRejected) as rejected:
        normalise[benchmark](entry, LIMITS)
    assert rejected.value.reason == reason and reason in REJECT_REASONS
    assert len(str(rejected.value)) < 400  # a message names the problem, never echoes a huge value


LVBENCH_REJECTIONS = [
    (("qa", 0, "uid"), DELETE, "malformed"),
    (("qa", 0, "uid"), True, "malformed"),
    (("qa", 0, "question"), "What is the score?", "no_options"),
    (("qa", 0, "question"), "Score?\n(A) 1-0\n(B) " + HUGE, "too_long"),
    (("qa", 0, "question"), "x" * 20_000, "too_long"),
    (("qa", 0, "answer"), "E", "answer_not_an_option"),
    (("qa", 0, "answer"), None, "no_answer"),
    (("qa", 0, "question_type"), "reasoning", "malformed"),
    (("qa", 0), "not a question", "malformed"),
]


@pytest.mark.parametrize(("path", "value", "reason"), LVBENCH_REJECTIONS)
def test_a_bad_lvbench_question_rejects_that_question_only(tmp_path, path, value, reason):
    videos = _fixture(LVBENCH)
    videos[0] = _set(videos[0], path, value)
    jsonl = tmp_path / "video_info.meta.jsonl"
    jsonl.write_text("".join(json.dumps(v) + "\n" for v in videos), encoding="utf-8")
    records = _records(LVBENCH, jsonl)
    assert [r.error.reason if r.error else "row" for r in records] == [reason, "row", "row"]
    assert records[0].video == "7Ldmdtg0rQk.mp4" and str(records[0].error).startswith("line 1, question 1:")


def test_a_bad_lvbench_video_line_is_one_rejected_record(tmp_path):
    good = json.dumps(_fixture(LVBENCH)[1])
    lines = [
        "{not json",
        json.dumps({"key": "k", "qa": []}),
        json.dumps({"key": "k", "qa": {"uid": 1}}),
        json.dumps({"qa": _fixture(LVBENCH)[0]["qa"]}),
        json.dumps({"key": ["k"], "qa": _fixture(LVBENCH)[0]["qa"]}),
        json.dumps([1, 2]),
        good,
    ]
    jsonl = tmp_path / "video_info.meta.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    records = _records(LVBENCH, jsonl)
    assert [r.number for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert [r.error.reason if r.error else "row" for r in records] == ["malformed"] * 6 + ["row"]
    assert str(records[1].error).startswith("line 2: field 'qa' must be a non-empty list")
    assert records[1].video == "k" and records[6].row is not None and records[6].row.problem_id == "140"


# ---- Reading the files: JSON lists judged entry by entry ---------------------------------------


def _json_list(tmp_path: Path, entries: list[bytes]) -> Path:
    path = tmp_path / "entries.json"
    path.write_bytes(b"[\n" + b",\n".join(entries) + b"\n]\n")
    return path


def test_a_json_list_is_judged_entry_by_entry_like_jsonl_lines(tmp_path):
    good = json.dumps(_fixture(MLVU)[0]).encode()
    path = _json_list(
        tmp_path,
        [
            good,
            good.replace(b'"duration": 246', b'"duration": NaN'),
            good.replace(b'"duration": 246', b'"duration": 1e999'),
            good.replace(b'"duration": 246', b'"duration": 246, "duration": 247'),
            good.replace(b'"duration": 246', b'"duration": ' + b"9" * 5_000),
            good.replace(b"Yellow", b"Yel\\u0000low", 1),
            good.replace(b"Yellow", b"Yel\\ud800low", 1),
            good.replace(b"Yellow", b"Yel\xfflow", 1),
            good.replace(b'"duration": 246', b'"duration": ' + b"[" * 40 + b"]" * 40),
            good.replace(b'"duration": 246', b'"notes": "' + b"n" * 2_000_000 + b'"'),
            b"17",
        ],
    )
    entries = list(read_entries(path, LIMITS.line_bytes))
    assert [e.number for e in entries] == list(range(1, 12)) and all(e.in_list for e in entries)
    reasons = [e.error.reason if e.error else "ok" for e in entries]
    assert reasons == ["ok"] + ["malformed"] * 6 + ["not_utf8", "malformed", "too_long", "ok"]
    assert "appears twice" in str(entries[3].error) and "nested more than 32" in str(entries[8].error)
    # ... and through the normaliser: one row, each entry one record.
    records = _records(MLVU, path)
    assert [r.error.reason if r.error else "row" for r in records] == ["row", *reasons[1:-1], "malformed"]
    assert records[0].row is not None


def test_a_byte_order_mark_and_whitespace_may_precede_the_list(tmp_path):
    path = tmp_path / "lvb_val.json"
    path.write_bytes(b"\xef\xbb\xbf \n\t" + (FIXTURES / FILES[LONGVIDEOBENCH]).read_bytes())
    assert [r.row.problem_id for r in _records(LONGVIDEOBENCH, path) if r.row] == [
        "86CxyhFV9MI_0",
        "86CxyhFV9MI_1",
        "uK8X6S1JwQo_0",
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[{}, {]", "not a JSON list"),
        (b"[1, 2] [3]", "not a JSON list"),
        (b"[" * 100_000, "nested too deep"),
        (b"PAR1\x00\x00PAR1", "Parquet"),
    ],
)
def test_a_file_that_is_not_entries_at_all_is_refused_as_a_whole(tmp_path, data, message):
    path = tmp_path / "annotations.json"
    path.write_bytes(data)
    with pytest.raises(AnnotationFileError, match=message):
        _records(VIDEOMME, path)


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown benchmark format"):
        _records("kinetics", FIXTURES / FILES[MLVU])
