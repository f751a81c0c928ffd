"""The build's row reader on random bytes and random JSON: it never raises, each row gets one fate.

Fixed seeds, in-process, no videos: a row that passes the text checks reaches the path check
and, with an empty videos folder, ends as ``missing_video`` (or ``outside_root``, or
``unsupported_container``) - a fate like any other.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

import pytest

from datatools.jsonl_rows import Line, decode_line, read_lines
from datatools.released import REJECT_REASONS, RowRejected, TextLimits
from datatools.released_build import BuildSettings, Candidate, Reject, _count_rows, read_rows

_GOOD = {
    "problem_id": "q",
    "data_type": "video",
    "videos": "v.mp4",
    "problem": "Which?\nA. x\nB. y",
    "problem_type": "multiple choice",
    "reasoning": "r",
    "answer": "<answer>A</answer>",
}
_ODD_CHARS = ["\x00", "\x07", "\x1f", "\ud800", "\udfff", "\u2028", "\x85", "\ufeff", "é", "视", "\U0001f600"]


def _random_text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(0, 6)):
        roll = rng.random()
        if roll < 0.3:
            pieces.append(rng.choice(_ODD_CHARS))
        elif roll < 0.5:
            pieces.append(rng.choice(["A. x", "\nB. y", "(C) z", "<answer>", "</answer>", "../", "/", "."]))
        else:
            pieces.append("".join(chr(rng.randint(32, 126)) for _ in range(rng.randint(0, 8))))
    return "".join(pieces)


def _random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 10**30, 2**63, rng.randint(-1000, 1000)])
    if kind == 3:
        return rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf"), float("-inf")])
    if kind in (4, 5):
        return _random_text(rng)
    if kind in (6, 7):
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_random_text(rng): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _mutated_row(rng: random.Random) -> bytes:
    row: dict[str, object] = dict(_GOOD)
    for _ in range(rng.randint(1, 3)):
        field = rng.choice([*_GOOD, "options", "category", _random_text(rng)])
        if rng.random() < 0.2:
            row.pop(field, None)
        else:
            row[field] = _random_value(rng)
    text = json.dumps(row, ensure_ascii=rng.random() < 0.5)  # NaN/Infinity included: json.dumps writes them
    data = text.encode("utf-8", "surrogatepass")  # a lone surrogate as raw (invalid) UTF-8 bytes
    if rng.random() < 0.2:  # cut, flip or insert bytes
        position = rng.randrange(len(data) + 1)
        noise = bytes(rng.randrange(256) for _ in range(rng.randint(0, 3)))
        data = data[:position] + noise + data[position + 1 :]
    return data.replace(b"\n", b" ")


def _random_bytes(rng: random.Random) -> bytes:
    alphabet = [0x20, 0x22, 0x7B, 0x7D, 0x5B, 0x5D]  # space " { } [ ]: JSON-ish noise
    return bytes(rng.choice([rng.randrange(256), *alphabet]) for _ in range(rng.randint(0, 40)))


def _random_lines(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.45:
            lines.append(_mutated_row(rng))
        elif roll < 0.7:
            lines.append(json.dumps(_random_value(rng)).encode("utf-8", "surrogatepass"))
        elif roll < 0.95:
            lines.append(_random_bytes(rng).replace(b"\n", b""))
        else:
            lines.append(json.dumps({**_GOOD, "problem_id": f"good-{len(lines)}"}).encode())
    return lines


@pytest.mark.parametrize("seed", [0, 1])
def test_random_lines_each_get_exactly_one_fate_and_never_raise(tmp_path, seed):
    lines = _random_lines(seed, 300)
    jsonl = tmp_path / "random.jsonl"
    jsonl.write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "videos").mkdir()
    settings = BuildSettings(jsonl, tmp_path / "videos", tmp_path / "out")

    fates = list(read_rows(settings))
    numbers = [fate.line for fate in fates]
    rows = [n for n, line in enumerate(lines, start=1) if line.strip(b" \t\r")]
    assert numbers == rows == [line.number for line in read_lines(jsonl, settings.limits.line_bytes)]
    assert _count_rows(settings) == len(rows)
    reasons = {fate.reason for fate in fates if isinstance(fate, Reject)}
    assert reasons <= set(REJECT_REASONS)
    for fate in fates:
        assert isinstance(fate, Reject | Candidate)
        if isinstance(fate, Reject):
            # What the rejects file gets is standard JSON in valid UTF-8.
            json.dumps(asdict(fate), ensure_ascii=False, allow_nan=False).encode("utf-8")
        else:  # no video files here: every candidate would be a bug
            raise AssertionError(f"line {fate.line} became a candidate without a video file")
    # The fuzz reached more than one check: bytes, JSON, row fields and the path.
    assert {"not_utf8", "malformed", "missing_video"} <= reasons, reasons


def test_decode_line_never_raises_anything_but_a_rejection():
    rng = random.Random(7)
    limits = TextLimits()
    accepted = 0
    for number in range(1, 400):
        data = _random_bytes(rng) if number % 2 else _mutated_row(rng)
        try:
            value = decode_line(Line(number, data, len(data)), limits.line_bytes)
        except RowRejected as err:
            assert err.reason in REJECT_REASONS and str(err)
            continue
        accepted += 1
        # What decodes is standard JSON that writes back as valid UTF-8.
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    assert accepted > 20


def test_line_numbers_blank_lines_and_long_lines(tmp_path: Path):
    jsonl = tmp_path / "lines.jsonl"
    long_line = b"x" * 100
    jsonl.write_bytes(b"\xef\xbb\xbf\r\n{}\n  \n" + long_line + b"\n" + b" " * 100 + b"\n[]")
    lines = list(read_lines(jsonl, max_line_bytes=50))
    # Line 1 is a BOM and CR only: blank. Line 5 is 100 spaces: blank however long.
    assert [(line.number, line.size) for line in lines] == [(2, 2), (4, 100), (6, 2)]
    assert lines[1].data == long_line[:51]  # only the first max_line_bytes + 1 bytes are kept
    with pytest.raises(RowRejected) as caught:
        decode_line(lines[1], 50)
    assert caught.value.reason == "too_long" and "100 bytes" in str(caught.value)
