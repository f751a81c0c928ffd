"""Seed-level statistics: a paired t-test on per-seed results (the standard library only).

Per-question tests (exact McNemar, :func:`app.commands.report.paired_comparison`) say whether two
runs differ on the questions; whether a recipe beats another across training seeds is a test on
the seeds' results, here Student's paired t-test. Its two-sided p-value is the regularized
incomplete beta function ``I_x(df / 2, 1 / 2)`` at ``x = df / (df + t^2)``, evaluated with its
continued fraction (modified Lentz).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (converges for x < (a + 1) / (a + b + 2))."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return value


def regularized_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function, for ``0 <= x <= 1``.

    >>> round(regularized_beta(1.0, 1.0, 0.3), 12)  # the uniform distribution's CDF
    0.3
    """
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x={x} is outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def student_t_two_sided(t: float, df: int) -> float:
    """The chance that Student's t with ``df`` degrees of freedom is at least ``|t|`` away from 0.

    >>> round(student_t_two_sided(4.303, 2), 3)  # the 95% critical value at 2 degrees of freedom
    0.05
    """
    if df < 1:
        raise ValueError("df must be >= 1")
    return regularized_beta(df / 2.0, 0.5, df / (df + t * t))


@dataclass(frozen=True)
class PairedSeeds:
    """Per-seed results of two recipes, paired by seed."""

    differences: tuple[float, ...]
    """``new - base`` per seed, in the seeds' order."""
    p_value: float
    """Two-sided paired t-test; 1 for identical results, 0 for equal nonzero differences."""

    @property
    def mean(self) -> float:
        return sum(self.differences) / len(self.differences)

    def line(self) -> str:
        shown = ", ".join(f"{d:+.3f}" for d in self.differences)
        return f"per seed {shown}; mean {self.mean:+.3f}, paired t-test over seeds p = {self.p_value:.3g}"


def paired_seeds(base: Sequence[float], new: Sequence[float]) -> PairedSeeds:
    """Student's paired t-test of ``new`` against ``base``, one value per seed (at least two).

    >>> paired_seeds([0.5, 0.6, 0.7], [0.6, 0.7, 0.8]).p_value  # the same gain every seed
    0.0
    """
    if len(base) != len(new) or len(base) < 2:
        raise ValueError("a paired test over seeds needs the same seeds on both sides, at least two")
    differences = tuple(n - b for b, n in zip(base, new, strict=True))
    count = len(differences)
    mean = sum(differences) / count
    variance = sum((d - mean) ** 2 for d in differences) / (count - 1)
    if variance <= 1e-24 * max(1.0, mean * mean):  # every seed moved by the same amount
        return PairedSeeds(differences, 1.0 if abs(mean) < 1e-12 else 0.0)
    t = mean / math.sqrt(variance / count)
    return PairedSeeds(differences, student_t_two_sided(t, count - 1))
