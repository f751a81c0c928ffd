"""Where a tool-use answer looked: coverage of the relevant stretch by the served spans, the hit
rule, and the relevant stretch a row names (hand-computed cases)."""

from __future__ import annotations

import math

import pytest

from core.tool_use.requests import FramePlan
from core.tool_use.spans import HIT_COVERAGE, coverage, hits, where_it_looked
from datamodules.rows import QARow

BLUE = (32.0, 48.0)  # the zoom task's stretch 2 of 16 s


@pytest.mark.parametrize(
    ("spans", "share"),
    [
        ([(32.0, 48.0)], 1.0),  # the stretch at 1 fps: 16 frames from 32 s
        ([(0.0, 128.0)], 1.0),  # the whole video, however thin
        ([(40.0, 56.0)], 0.5),  # half of it
        ([(16.0, 32.0), (48.0, 64.0)], 0.0),  # both neighbours: they touch it, cover none
        ([(30.0, 36.0), (34.0, 40.0), (44.0, 60.0)], 0.75),  # overlaps counted once: 32-40 and 44-48
        ([(44.0, 60.0), (30.0, 36.0)], 0.5),  # order does not matter: 32-36 and 44-48
        ([], 0.0),
    ],
)
def test_coverage_is_the_share_of_the_stretch_the_union_covers(spans, share) -> None:
    assert coverage(spans, BLUE) == share


def test_a_hit_covers_at_least_half() -> None:
    assert HIT_COVERAGE == 0.5
    assert hits([(40.0, 56.0)], BLUE) and not hits([(41.0, 56.0)], BLUE)
    assert where_it_looked([(40.0, 56.0)], BLUE) == {"span_coverage": 0.5, "span_hit": True}
    assert where_it_looked([(40.0, 56.0)], None) == {}
    with pytest.raises(ValueError, match="empty"):
        coverage([(0.0, 1.0)], (5.0, 5.0))


def test_a_served_plan_samples_one_interval_past_its_last_frame() -> None:
    # 16 frames at 1 fps of an 8 fps video from 32 s: 32-47 s, the stretch 32-48 s.
    plan = FramePlan(tuple(range(256, 384, 8)), source_fps=8.0)
    assert plan.span == BLUE and coverage([plan.span], BLUE) == 1.0
    assert FramePlan((256,), source_fps=8.0).span == (32.0, 32.125)  # one frame: one source frame


def row(extra: dict) -> QARow:
    return QARow("p", "v.mp4", "q", "multiple choice", "r", "A", options=("a", "b"), extra=extra)


@pytest.mark.parametrize(
    ("extra", "span"),
    [
        ({"relevant_span_s": [32, 48]}, (32.0, 48.0)),
        ({"zoom": {"span_s": [16.0, 32.0]}}, (16.0, 32.0)),  # rows written before the key
        ({"relevant_span_s": [48, 32]}, None),
        ({"relevant_span_s": [-1, 2]}, None),
        ({"relevant_span_s": [0, math.inf]}, None),
        ({"relevant_span_s": ["a", "b"]}, None),
        ({"relevant_span_s": [1, 2, 3]}, None),
        ({"relevant_span_s": "0-5"}, None),
        ({"zoom": "blue"}, None),
        ({}, None),
    ],
)
def test_the_relevant_stretch_a_row_names(extra, span) -> None:
    assert row(extra).relevant_span_s == span
