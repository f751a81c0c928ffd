"""The one table renderer: columns and rows as data, markdown or aligned plain text.

Every table lvrl prints or writes goes through :func:`render_table`: the evaluation report
(:mod:`evaluation.report`), the accuracy table ``lvrl validate`` prints
(:func:`evaluation.metrics.format_accuracy_table`), ``lvrl report compare`` and the bench
scripts. Cells arrive formatted (``"55.8%"``); the renderer only lays them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Align = Literal["left", "right"]
Style = Literal["markdown", "text"]


@dataclass(frozen=True)
class Column:
    """One column: its header cell, its alignment and (plain text only) its width."""

    title: str
    align: Align = "right"
    width: int | None = None
    """Characters of a plain-text cell (longer cells overflow); None: the widest cell's."""


RULE: tuple[str, ...] = ()
"""A row that is a horizontal line (plain text: dashes across the table; markdown: left out)."""


@dataclass(frozen=True)
class Table:
    """A table as data: header cells in ``columns``, then ``rows`` of formatted cells.

    A row may be shorter than the columns: in plain text it ends after its last cell (no
    trailing blanks); :data:`RULE` draws a line across.
    """

    columns: Sequence[Column]
    rows: Sequence[Sequence[str]] = field(default_factory=list)
    title: str | None = None
    """A line above the plain-text table (markdown tables carry no title)."""


def render_table(table: Table, style: Style = "markdown") -> str:
    """The table's lines joined by newlines (no trailing newline).

    ``markdown``: ``| a | b |`` rows under a header and an alignment row (``---`` left,
    ``---:`` right); an empty cell is written ``| |``. ``text``: cells padded to their
    column's width and separated by two spaces, the title (if any) on the first line.

    >>> table = Table([Column("", "left"), Column("n")], [RULE, ("red", "3"), RULE, ("all", "12")])
    >>> print(render_table(table))
    | | n |
    |---|---:|
    | red | 3 |
    | all | 12 |
    >>> print(render_table(table, "text"))
          n
    -------
    red   3
    -------
    all  12
    """
    if style == "markdown":
        return "\n".join(_markdown_lines(table))
    if style == "text":
        return "\n".join(_text_lines(table))
    raise ValueError(f"style must be 'markdown' or 'text', got {style!r}")


def _markdown_row(cells: Sequence[str]) -> str:
    return "|" + "".join(f" {cell} |" if cell else " |" for cell in cells)


def _markdown_lines(table: Table) -> list[str]:
    lines = [
        _markdown_row([column.title for column in table.columns]),
        "|" + "".join("---|" if column.align == "left" else "---:|" for column in table.columns),
    ]
    lines += [_markdown_row(row) for row in table.rows if row]
    return lines


def _text_lines(table: Table) -> list[str]:
    header = [column.title for column in table.columns]
    widths = [
        column.width
        if column.width is not None
        else max(len(row[i]) for row in [header, *table.rows] if len(row) > i)
        for i, column in enumerate(table.columns)
    ]
    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))

    def line(cells: Sequence[str]) -> str:
        padded = [
            f"{cell:<{width}}" if column.align == "left" else f"{cell:>{width}}"
            for cell, column, width in zip(cells, table.columns, widths, strict=False)
        ]
        return "  ".join(padded)

    lines = [table.title] if table.title is not None else []
    lines.append(line(header))
    lines += [line(row) if row else rule for row in table.rows]
    return lines
