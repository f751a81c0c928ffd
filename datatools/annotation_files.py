"""Reading a benchmark's annotation file as a sequence of entries, whatever its bytes.

The benchmarks publish their annotations either as JSONL (one entry per line) or as one JSON
list of entries. :func:`file_layout` tells them apart by the first byte that is not JSON
whitespace (after a UTF-8 byte-order mark): ``[`` starts a JSON list, anything else is JSONL
(read as :mod:`datatools.jsonl_rows` reads the released rows). A Parquet file (magic ``PAR1``:
Video-MME's ``videomme/test-00000-of-00001.parquet``, LongVideoBench's
``validation-00000-of-00001.parquet``) is read with ``pyarrow``, one entry per table row, a row
group at a time (:data:`PARQUET`).

A JSON list is parsed whole (at most :data:`MAX_DOCUMENT_BYTES`), but judged entry by entry
with the rules a JSONL line is judged by: what a strict reading would refuse (``NaN``, a key
repeated in one object, a number that overflows, a control character, a lone surrogate,
nesting deeper than :data:`~datatools.jsonl_rows.MAX_NESTING`) rejects that entry only
(``malformed``); bytes that are not UTF-8 reject the entries whose strings hold them
(``not_utf8``); an entry longer than ``line_bytes`` as JSON is ``too_long``. Only a file that
is not a JSON list at all (broken brackets, say) cannot be read: :class:`AnnotationFileError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datatools.jsonl_rows import BOM, check_json_value, decode_line, read_lines
from datatools.released import MALFORMED, NOT_UTF8, TOO_LONG, RowRejected

JSON_LIST = "json_list"
JSONL = "jsonl"
PARQUET = "parquet"
MAX_DOCUMENT_BYTES = 256 * 2**20
"""Largest JSON-list file read (the published ones are a few MB; parsing holds it all in memory)."""
_SNIFF_BYTES = 1 << 16
_WHITESPACE = b" \t\r\n"
_PARQUET_MAGIC = b"PAR1"
_ESCAPED_BYTES = ("\udc80", "\udcff")
"""The range ``surrogateescape`` maps undecodable bytes to."""


class AnnotationFileError(ValueError):
    """The file as a whole cannot be read as annotations (the message says why and what to do)."""


@dataclass(frozen=True)
class Entry:
    """One entry of an annotation file: its JSON value, or why it cannot be used."""

    number: int
    """The JSONL line number, or the 1-based position in the JSON list."""
    value: Any
    """The decoded value (``None`` when ``error`` is set)."""
    error: RowRejected | None = None
    in_list: bool = False
    """Whether the file is a JSON list (else JSONL)."""

    @property
    def where(self) -> str:
        """``line N`` or ``entry N``, for a message."""
        return f"{'entry' if self.in_list else 'line'} {self.number}"


class _Flaw:
    """Stands in for a value a strict JSON reading refuses, so that only its entry is rejected."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Flaw:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:  # which of the two values the annotator meant is unknown
            return _Flaw(f"key {key[:60]!r} appears twice in one object")
        seen.add(key)
    return dict(pairs)


def _constant(name: str) -> _Flaw:
    return _Flaw(f"non-standard JSON literal {name}")


def _float(text: str) -> float | _Flaw:
    value = float(text)
    return value if math.isfinite(value) else _Flaw(f"number {text[:40]} overflows a float")


def _int(text: str) -> int | _Flaw:
    try:
        return int(text)
    except ValueError:  # beyond Python's int-string limit
        return _Flaw(f"integer of {len(text):,} digits")


def file_layout(path: Path) -> str:
    """:data:`PARQUET`, :data:`JSON_LIST` or :data:`JSONL`, by the first bytes."""
    with path.open("rb") as handle:
        head = handle.read(_SNIFF_BYTES)
    if head.startswith(_PARQUET_MAGIC):
        return PARQUET
    start = head.removeprefix(BOM).lstrip(_WHITESPACE)
    return JSON_LIST if start.startswith(b"[") else JSONL


def _parquet_entries(path: Path, max_entry_bytes: int) -> Iterator[Entry]:
    """One entry per row of a Parquet table, numbered from 1, judged like a JSON list's entries."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise AnnotationFileError(f"{path} starts like Parquet but cannot be read: {str(err)[:200]}") from err
    number = 0
    for group in range(table.num_row_groups):
        try:
            rows = table.read_row_group(group).to_pylist()
        except (pa.ArrowException, OSError) as err:
            raise AnnotationFileError(f"{path}: row group {group} cannot be read: {str(err)[:200]}") from err
        for value in rows:
            number += 1
            problem = _entry_problem(value, False, max_entry_bytes)
            yield Entry(number, None if problem else value, problem, in_list=True)


def _entry_problem(value: Any, has_bad_bytes: bool, max_bytes: int) -> RowRejected | None:
    """Why an entry of a JSON list is unusable, judged in a JSONL line's order; ``None`` if it is fine."""
    # default=: a _Flaw counts as an empty string towards the size; it is rejected below anyway.
    size = len(json.dumps(value, ensure_ascii=False, default=lambda _: "").encode("utf-8", "replace"))
    if size > max_bytes:
        return RowRejected(TOO_LONG, f"the entry has {size:,} bytes as JSON; at most {max_bytes:,}")
    flaw: str | None = None
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Flaw):
            flaw = flaw or item.message
        elif isinstance(item, str):
            if has_bad_bytes and any(_ESCAPED_BYTES[0] <= char <= _ESCAPED_BYTES[1] for char in item):
                return RowRejected(NOT_UTF8, "the entry holds bytes that are not UTF-8")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    if flaw is not None:
        return RowRejected(MALFORMED, f"not strict JSON ({flaw})")
    try:
        check_json_value(value)
    except ValueError as err:
        return RowRejected(MALFORMED, str(err))
    return None


def _list_entries(path: Path, max_entry_bytes: int) -> Iterator[Entry]:
    size = path.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise AnnotationFileError(
            f"{path} has {size:,} bytes; a JSON list is read whole, at most {MAX_DOCUMENT_BYTES:,}: "
            "write it as JSONL (one entry per line) instead"
        )
    data = path.read_bytes().removeprefix(BOM)
    try:
        text, has_bad_bytes = data.decode("utf-8"), False
    except UnicodeDecodeError:
        # Keep going: the bad bytes become lone surrogates, and only the entries holding them go.
        text, has_bad_bytes = data.decode("utf-8", "surrogateescape"), True
    try:
        document = json.loads(
            text, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float, parse_int=_int
        )
    except RecursionError as err:
        raise AnnotationFileError(f"{path} is nested too deep to parse") from err
    except ValueError as err:
        raise AnnotationFileError(f"{path} starts with '[' but is not a JSON list: {str(err)[:200]}") from err
    if not isinstance(document, list):  # text starting with '[' parses to a list; this keeps the type honest
        raise AnnotationFileError(f"{path} is not a JSON list of entries")
    for number, value in enumerate(document, start=1):
        problem = _entry_problem(value, has_bad_bytes, max_entry_bytes)
        yield Entry(number, None, problem, in_list=True) if problem else Entry(number, value, in_list=True)


def read_entries(path: Path, max_entry_bytes: int) -> Iterator[Entry]:
    """Every entry of a JSONL file, a JSON list or a Parquet table, in order, each decoded or rejected.

    Raises :class:`AnnotationFileError` only for a file that cannot be read as entries at all: a
    JSON list that does not parse or is too large, a Parquet file pyarrow cannot read.
    """
    layout = file_layout(path)
    if layout == PARQUET:
        yield from _parquet_entries(path, max_entry_bytes)
        return
    if layout == JSON_LIST:
        yield from _list_entries(path, max_entry_bytes)
        return
    for line in read_lines(path, max_entry_bytes):
        try:
            yield Entry(line.number, decode_line(line, max_entry_bytes))
        except RowRejected as err:
            yield Entry(line.number, None, err)
