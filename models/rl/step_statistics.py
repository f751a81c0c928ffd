"""What one GRPO step measures beside its loss: the trainer-engine gap, entropy, correction weights.

Every statistic is a detached *sum* (or a maximum) over valid tokens, so micro-batches and
data-parallel ranks combine by adding (or taking the largest), and the step divides by the
matching count once at the end. Names ending in ``_max`` combine by maximum.

The gap is |log pi_trainer - log mu| on each sampled token, the trainer's first-iteration
log-probs (before any update of the batch) against the engine's. It is reported overall, as a
tail distribution (:data:`models.rl.correction.GAP_THRESHOLDS`), and per frame-count bucket:
a mismatch that grows with the number of frames (more visual tokens, longer attention in the
engine's kernels) shows in the long-video buckets first.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from models.rl.correction import GAP_THRESHOLDS, gap_distribution

DEFAULT_FRAME_BUCKETS = (16, 64, 256, 1024)
"""Upper frame counts of the gap buckets (the last bucket holds everything above 1,024)."""


def is_max_statistic(name: str) -> bool:
    return name.endswith("_max")


def merge_stats(totals: dict[str, Tensor], stats: dict[str, Tensor]) -> None:
    """Add ``stats`` into ``totals`` (maxima for names ending in ``_max``)."""
    for name, value in stats.items():
        merge = torch.maximum if is_max_statistic(name) else torch.add
        totals[name] = merge(totals[name], value) if name in totals else value


@dataclass(frozen=True)
class FrameBuckets:
    """Frame-count buckets of the gap: ``edges`` are inclusive upper bounds, ascending.

    >>> buckets = FrameBuckets((16, 64))
    >>> buckets.labels
    ('1-16', '17-64', '65+')
    >>> [buckets.label(n) for n in (1, 16, 17, 64, 65)]
    ['1-16', '1-16', '17-64', '17-64', '65+']
    """

    edges: tuple[int, ...] = DEFAULT_FRAME_BUCKETS

    def __post_init__(self) -> None:
        edges = tuple(int(e) for e in self.edges)
        if not edges or list(edges) != sorted(set(edges)) or edges[0] < 1:
            raise ValueError(f"gap_frame_buckets must be ascending frame counts >= 1, got {self.edges}")
        object.__setattr__(self, "edges", edges)

    @property
    def labels(self) -> tuple[str, ...]:
        lows = (1, *(e + 1 for e in self.edges))
        return (*(f"{lo}-{hi}" for lo, hi in zip(lows, self.edges, strict=False)), f"{lows[-1]}+")

    def label(self, frames: int) -> str:
        return self.labels[bisect.bisect_left(self.edges, frames)]

    def statistic_names(self) -> tuple[str, ...]:
        """The summed statistics the buckets add to a step (the same on every rank, in order)."""
        return tuple(f"{kind}@{label}" for label in self.labels for kind in ("gap_sum", "sampled_tokens"))


def gap_statistics(
    logprobs: Tensor,
    engine_logprobs: Tensor,
    completion_mask: Tensor,
    entropy: Tensor,
    row_frames: Sequence[int] | None = None,
    buckets: FrameBuckets | None = None,
) -> dict[str, Tensor]:
    """Sums behind ``rollout/logprob_diff_*`` (trainer vs engine on the sampled tokens), the gap's
    tail counts, the entropy, and, with ``buckets`` and each row's frame count, the gap per bucket."""
    valid = completion_mask.to(logprobs.device).bool()
    gap = torch.where(valid, (logprobs.detach() - engine_logprobs).abs(), 0.0)
    out = {
        "gap_sum": gap.sum(),
        "gap_max": gap.max() if gap.numel() else torch.zeros(()),
        "entropy_sum": entropy[valid].sum(),
        "sampled_tokens": valid.sum(),
    }
    out |= gap_distribution(logprobs, engine_logprobs, valid)
    if buckets is not None and row_frames is not None:
        labels = [buckets.label(n) for n in row_frames]
        for label in buckets.labels:
            rows = torch.tensor([row_label == label for row_label in labels], device=gap.device)
            out[f"gap_sum@{label}"] = gap[rows].sum()
            out[f"sampled_tokens@{label}"] = valid[rows].sum()
    return out


CORRECTION_STATISTICS = (
    "is_weight_sum",
    "is_raw_weight_sum",
    "is_masked_tokens",
    "is_truncated_tokens",
    "is_tokens",
)
"""Summed statistics of the rollout correction's weights (``is_weight_max`` combines by maximum)."""

GAP_TAIL_STATISTICS = tuple(f"gap_over_{t:g}" for t in GAP_THRESHOLDS)
