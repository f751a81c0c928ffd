"""Progress bars for the data tools that read well in a terminal and in a log file.

tqdm redraws its bar in place with carriage returns. On a terminal that is what a person
wants; written to a file (``make demo > demo.log``) it becomes one line holding hundreds of
overwritten bars. When the stream is not a terminal, :func:`progress_bar` therefore prints a
plain line at most every ``LOG_INTERVAL_S`` seconds (and the final one), each ending in a newline.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")

LOG_INTERVAL_S = 30.0
"""Seconds between two progress lines when output goes to a file."""


class _LineWriter:
    """A file-like wrapper turning tqdm's in-place redraws into one line per update."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable: Iterable[T] | None = None, *, enabled: bool = True, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, **kwargs)`` on stderr: a live bar on a terminal, a line every
    :data:`LOG_INTERVAL_S` seconds otherwise; nothing at all when ``enabled`` is false."""
    stream = sys.stderr
    if not stream.isatty():
        kwargs = {"mininterval": LOG_INTERVAL_S, "file": _LineWriter(stream), "ncols": 100, **kwargs}
    return tqdm(iterable, disable=not enabled, **kwargs)
