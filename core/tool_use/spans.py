"""Where a tool-use answer looked: the spans its requests were served, against the stretch of the
video that holds the answer (when the data knows it, as the zoom task does).

A served span is the stretch its frames sample (:attr:`core.tool_use.requests.FramePlan.span`). An
answer's **coverage** is the share of the relevant stretch that the union of its served spans
covers (0 without a request); it **hits** the stretch when that share is at least
:data:`HIT_COVERAGE`. Both are reported per evaluation beside accuracy, frames and requests, and
for the episodes of each RL step (``tool/span_hit_rate``, ``tool/span_coverage``).
"""

from __future__ import annotations

from collections.abc import Sequence

HIT_COVERAGE = 0.5
"""An answer whose served spans cover at least this share of the relevant stretch hit it."""

Span = tuple[float, float]
"""``(start, end)`` seconds, ``start < end``."""


def coverage(spans: Sequence[Sequence[float]], relevant: Sequence[float]) -> float:
    """The share of ``relevant`` that the union of ``spans`` covers, in [0, 1].

    >>> coverage([(30.0, 40.0), (38.0, 60.0)], (32.0, 48.0))
    1.0
    >>> coverage([(0.0, 36.0)], (32.0, 48.0))
    0.25
    >>> coverage([], (32.0, 48.0)), coverage([(50.0, 60.0), (0.0, 8.0)], (32.0, 48.0))
    (0.0, 0.0)
    """
    low, high = float(relevant[0]), float(relevant[1])
    if not high > low:
        raise ValueError(f"the relevant stretch {relevant!r} is empty")
    clipped = sorted((max(low, float(a)), min(high, float(b))) for a, b in spans)
    covered, reach = 0.0, low
    for start, end in clipped:
        begin = max(start, reach)
        if end <= begin:  # outside the stretch, or already counted
            continue
        covered += end - begin
        reach = end
    return covered / (high - low)


def hits(spans: Sequence[Sequence[float]], relevant: Sequence[float]) -> bool:
    """Whether the served ``spans`` cover at least :data:`HIT_COVERAGE` of ``relevant``."""
    return coverage(spans, relevant) >= HIT_COVERAGE


def where_it_looked(
    spans: Sequence[Sequence[float]], relevant: Sequence[float] | None
) -> dict[str, float | bool]:
    """An answer record's ``span_coverage`` and ``span_hit`` (nothing when the data does not
    say which stretch holds the answer)."""
    if relevant is None:
        return {}
    share = coverage(spans, relevant)
    return {"span_coverage": share, "span_hit": share >= HIT_COVERAGE}
