"""Reading a JSONL file as bytes: which lines are rows, and each row's strict JSON value.

``lvrl data build`` must survive any file, so nothing here raises on the content of a line:
:func:`read_lines` yields every row with its line number (reading at most ``max_line_bytes``
of a line into memory), and :func:`decode_line` turns one into a JSON value or raises
:class:`~datatools.released.RowRejected` with a reason and a message.

What a row is: lines are separated by ``\\n`` (a ``\\r`` before it is JSON whitespace); a line
holding only JSON whitespace (space, tab, ``\\r``) is blank and not a row; every other line is
a row, however broken. A UTF-8 byte-order mark at the start of line 1 is an encoding marker
(editors on Windows write one) and is dropped; anywhere else it is a byte like any other
and the line is not JSON.

What a valid line is: UTF-8; standard JSON (no ``NaN``/``Infinity``, no number that overflows
a float or exceeds Python's int-string limit, no key repeated in one object); nested at most
:data:`MAX_NESTING` deep; no string (value or key) holding a C0 control character other than
tab, newline and carriage return (``\\u0000`` and friends have no place in a question or a
path, and NUL ends strings in C libraries) or a lone UTF-16 surrogate (which no UTF-8 output
can encode).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datatools.released import MALFORMED, NOT_UTF8, TOO_LONG, RowRejected

BOM = b"\xef\xbb\xbf"
_JSON_WHITESPACE = b" \t\r"
MAX_NESTING = 32
"""Deepest nesting of lists/objects in a row (released rows are 2 deep; deep ones exhaust recursion)."""
_FORBIDDEN_CHAR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")
_SKIP_CHUNK = 1 << 20


@dataclass(frozen=True)
class Line:
    """One row of the file: its 1-based line number and bytes (without the newline)."""

    number: int
    data: bytes
    """The line's bytes; only the first ``max_line_bytes + 1`` when the line is longer."""
    size: int
    """The line's full length in bytes."""


def read_lines(path: Path, max_line_bytes: int) -> Iterator[Line]:
    """Every row of a JSONL file (blank lines skipped), holding at most ``max_line_bytes + 1`` bytes
    of any line in memory: a longer line comes with its size and its first bytes only."""
    with path.open("rb") as handle:
        number = 0
        while True:
            data = handle.readline(max_line_bytes + 1)
            if not data:
                return
            number += 1
            complete = data.endswith(b"\n")
            data = data.rstrip(b"\n")
            size, blank = len(data), not data.strip(_JSON_WHITESPACE)
            while not complete:  # longer than the limit: skip the rest, only measuring it
                more = handle.readline(_SKIP_CHUNK)
                complete = not more or more.endswith(b"\n")
                more = more.rstrip(b"\n")
                size += len(more)
                blank = blank and not more.strip(_JSON_WHITESPACE)
            if number == 1 and data.startswith(BOM):
                data, size = data[len(BOM) :], size - len(BOM)
                blank = blank or not data.strip(_JSON_WHITESPACE)
            if not blank:
                yield Line(number, data, size)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON literal {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows a float")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys; which value the annotator meant is unknown.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key[:60]!r} appears twice in one object")
        obj[key] = value
    return obj


def check_json_value(value: Any) -> None:
    """Raise ``ValueError`` if ``value`` nests deeper than :data:`MAX_NESTING` or holds a string
    with a control character or a lone surrogate (walked without recursion)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "row")]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            bad = _FORBIDDEN_CHAR.search(item)
            if bad:
                kind = "a lone surrogate" if bad.group() >= "\ud800" else "a control character"
                raise ValueError(f"{where} holds {kind} U+{ord(bad.group()):04X} at position {bad.start()}")
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_NESTING:
            raise ValueError(f"{where} is nested more than {MAX_NESTING} deep")
        if isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, depth, f"a key in {where}"))
                stack.append((child, depth + 1, f"field {key[:60]!r}" if depth == 1 else where))
        else:
            stack.extend((child, depth + 1, where) for child in item)


def decode_line(line: Line, max_line_bytes: int) -> Any:
    """The JSON value of a row, or :class:`RowRejected` (``too_long``, ``not_utf8``, ``malformed``)."""
    if line.size > max_line_bytes:
        raise RowRejected(TOO_LONG, f"the line has {line.size:,} bytes; at most {max_line_bytes:,}")
    try:
        text = line.data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RowRejected(NOT_UTF8, f"invalid UTF-8 at byte {err.start}: {err.reason}") from err
    try:
        value = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError as err:
        raise RowRejected(MALFORMED, "not JSON (nested too deep to parse)") from err
    except ValueError as err:  # JSONDecodeError, the int-string limit, the hooks above
        raise RowRejected(MALFORMED, f"not JSON ({str(err)[:200]})") from err
    try:
        check_json_value(value)
    except ValueError as err:
        raise RowRejected(MALFORMED, str(err)) from err
    return value
