"""The paired t-test over seeds against closed forms of Student's t and a numerical integral."""

from __future__ import annotations

import math

import pytest

from evaluation.significance import paired_seeds, regularized_beta, student_t_two_sided


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 4.303, 12.7, 60.0])
def test_one_and_two_degrees_of_freedom_match_their_closed_forms(t: float) -> None:
    # df = 1 is Cauchy; df = 2 has the CDF 1/2 + t / (2 sqrt(2 + t^2)).
    assert student_t_two_sided(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-12)
    assert student_t_two_sided(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)


@pytest.mark.parametrize(("t", "df"), [(1.7, 5), (2.9, 9), (0.4, 30)])
def test_other_degrees_of_freedom_match_the_integrated_density(t: float, df: int) -> None:
    # Simpson's rule on the density from |t| to a far tail (the rest is below 1e-9 at these df).
    def density(x: float) -> float:
        norm = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        return norm * (1 + x * x / df) ** (-(df + 1) / 2)

    upper, steps = 2000.0, 400_000
    width = (upper - t) / steps
    total = density(t) + density(upper)
    total += sum((4 if k % 2 else 2) * density(t + k * width) for k in range(1, steps))
    tail = total * width / 3
    assert student_t_two_sided(t, df) == pytest.approx(2 * tail, abs=1e-6)


def test_the_regularized_beta_is_symmetric_and_bounded() -> None:
    for a, b, x in [(0.5, 0.5, 0.2), (3.0, 0.5, 0.9), (10.0, 2.0, 0.7)]:
        assert regularized_beta(a, b, x) == pytest.approx(1 - regularized_beta(b, a, 1 - x), abs=1e-12)
    assert regularized_beta(2.0, 3.0, 0.0) == 0.0 and regularized_beta(2.0, 3.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        regularized_beta(1.0, 1.0, 1.5)


def test_paired_seeds() -> None:
    # Differences 0.10, 0.05, 0.15: mean 0.1, sd 0.05, t = 0.1 / (0.05 / sqrt 3) = 3.464, df 2.
    result = paired_seeds([0.40, 0.50, 0.45], [0.50, 0.55, 0.60])
    assert result.differences == pytest.approx((0.10, 0.05, 0.15))
    assert result.p_value == pytest.approx(1 - 3.4641016 / math.sqrt(2 + 12), abs=1e-6)
    assert "mean +0.100" in result.line()
    assert paired_seeds([0.5, 0.5], [0.5, 0.5]).p_value == 1.0
    with pytest.raises(ValueError, match="at least two"):
        paired_seeds([0.5], [0.6])
