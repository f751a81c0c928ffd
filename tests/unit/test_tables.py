"""The one table renderer: markdown and plain text from columns and rows, and who uses it."""

from __future__ import annotations

import pytest
from helpers.imports import assert_imports_none_of

from evaluation.metrics import MultipleChoiceScores, format_accuracy_table
from evaluation.tables import RULE, Column, Table, render_table


def test_markdown_aligns_columns_and_writes_empty_cells_as_a_bare_bar() -> None:
    table = Table(
        [Column("", "left"), Column("n"), Column("16 frames")],
        [("Plot", "3", "50.0%"), RULE, ("format rate", "", "12.5%")],
    )
    assert render_table(table).splitlines() == [
        "| | n | 16 frames |",
        "|---|---:|---:|",
        "| Plot | 3 | 50.0% |",
        "| format rate | | 12.5% |",  # the rule is a plain-text device only
    ]


def test_text_pads_to_fixed_or_fitted_widths_and_short_rows_end_early() -> None:
    table = Table(
        [Column("category", "left", width=10), Column("n", width=3), Column("accuracy")],
        [RULE, ("Temporal", "12", "7.5%"), ("a long label", "1"), ("x", "", "100.0%")],
        title="Validation",
    )
    assert render_table(table, "text").splitlines() == [
        "Validation",
        "category      n  accuracy",
        "-" * 25,  # 10 + 3 + 8 and two separators
        "Temporal     12      7.5%",
        "a long label    1",  # overflows its width; no trailing blanks
        "x                  100.0%",
    ]


def test_an_unknown_style_is_refused() -> None:
    with pytest.raises(ValueError, match="style must be"):
        render_table(Table([Column("a")]), "html")  # type: ignore[arg-type]


def test_the_validate_table_is_laid_out_as_before() -> None:
    # The exact bytes `lvrl validate` printed before the renderer existed.
    metric = MultipleChoiceScores()
    categories = ["Temporal", "Goal and Purpose", "Plot"]
    metric.update(["A", "B", None], ["A", "C", "B"], categories, [True, True, False])
    assert format_accuracy_table(metric.compute(), title="T") == "\n".join(
        [
            "T",
            "category              n  accuracy",
            "---------------------------------",
            "Temporal              1    100.0%",
            "Goal and Purpose      1      0.0%",
            "Plot                  1      0.0%",
            "---------------------------------",
            "overall               3     33.3%",
            "format rate                 66.7%",
            "unparseable           1",
            "constant letter             33.3%",
        ]
    )


def test_evaluation_does_not_import_models_or_lightning() -> None:
    assert_imports_none_of(
        ["evaluation.evaluator", "evaluation.report", "evaluation.scoring", "evaluation.tables"],
        ["models", "lightning", "callbacks", "app", "datamodules", "parallel"],
    )
