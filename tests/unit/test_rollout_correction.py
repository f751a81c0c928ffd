"""Rollout correction (TIS / MIS at token, sequence and geometric level) against hand computation.

Every expected value is computed here in float64 from the formulas of
:mod:`models.rl.correction`, written out term by term; the function under test computes in
float32, so weights are compared within a few float32 ulps of their size: the only rounding is
in one subtraction (or one sum of at most four terms) and one ``exp`` (each correctly rounded to
half an ulp; the sum adds at most 3 ulps of the largest term, and exp turns an absolute error
e of its argument into a relative error e of its value).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.tolerances import assert_float32_close, assert_identical

from models.rl.correction import (
    RolloutCorrection,
    gap_distribution,
    importance_weights,
    log_importance_weights,
)
from models.rl.losses import policy_loss
from models.rl.step_statistics import FrameBuckets, gap_statistics, merge_stats

# Two completions: row 0 has 3 valid tokens, row 1 has 2 (its third position is padding, holding
# a value that must be ignored).
OLD = [[-1.0, -2.0, -0.5], [-0.3, -0.7, float("nan")]]
ENGINE = [[-1.2, -1.5, -0.5], [-0.3, -2.1, -9.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.tensor(OLD), torch.tensor(ENGINE), torch.tensor(MASK)


def hand_log_weights(level: str) -> list[list[float]]:
    """log w per token in float64, 0 on padding."""
    rows = []
    for old, engine, mask in zip(OLD, ENGINE, MASK, strict=True):
        gaps = [o - e for o, e, m in zip(old, engine, mask, strict=True) if m]
        if level == "token":
            per_token = gaps
        else:
            row = sum(gaps) if level == "sequence" else sum(gaps) / len(gaps)
            per_token = [row] * len(gaps)
        rows.append(per_token + [0.0] * (len(mask) - len(per_token)))
    return rows


def check(actual: torch.Tensor, expected: list[list[float]], what: str) -> None:
    # A few ulps of each weight's own size (see the module docstring); 4 ulps of 2.0 at most here.
    assert_float32_close(actual, torch.tensor(expected, dtype=torch.float32), ulps=8, reason=what)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_log_weights_by_level(level: str) -> None:
    old, engine, mask = tensors()
    check(log_importance_weights(old, engine, mask, level), hand_log_weights(level), f"log w, {level}")


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_truncated_importance_sampling(level: str) -> None:
    old, engine, mask = tensors()
    correction = RolloutCorrection(mode="truncate", level=level, upper=1.5)
    weights, stats = importance_weights(old, engine, mask, correction)
    expected = [
        [min(math.exp(x), 1.5) if m else 0.0 for x, m in zip(row, mrow, strict=True)]
        for row, mrow in zip(hand_log_weights(level), MASK, strict=True)
    ]
    check(weights, expected, f"TIS weights, {level}")
    raw = [
        math.exp(x)
        for row, mrow in zip(hand_log_weights(level), MASK, strict=True)
        for x, m in zip(row, mrow, strict=True)
        if m
    ]
    assert int(stats["truncated_tokens"]) == sum(w > 1.5 for w in raw)
    assert int(stats["masked_tokens"]) == 0 and int(stats["tokens"]) == 5
    assert stats["weight_max"] == weights.max()
    assert math.isclose(float(stats["raw_weight_sum"]), sum(raw), rel_tol=1e-6)


def test_token_level_truncation_by_hand() -> None:
    # Written out: token gaps are 0.2, -0.5, 0 (row 0) and 0, 1.4 (row 1); exp(1.4) = 4.06 > 2.
    old, engine, mask = tensors()
    weights, stats = importance_weights(old, engine, mask, RolloutCorrection("truncate", "token", upper=2.0))
    check(weights, [[math.exp(0.2), math.exp(-0.5), 1.0], [1.0, 2.0, 0.0]], "TIS token weights")
    assert int(stats["truncated_tokens"]) == 1


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_masked_importance_sampling(level: str) -> None:
    old, engine, mask = tensors()
    correction = RolloutCorrection(mode="mask", level=level, upper=2.0)
    assert correction.bounds == (0.5, 2.0)  # lower defaults to 1 / upper
    weights, stats = importance_weights(old, engine, mask, correction)
    expected = []
    masked = 0
    for row, mrow in zip(hand_log_weights(level), MASK, strict=True):
        out = []
        for x, m in zip(row, mrow, strict=True):
            w = math.exp(x)
            inside = 0.5 <= w <= 2.0
            masked += int(m and not inside)
            out.append(w if m and inside else 0.0)
        expected.append(out)
    check(weights, expected, f"MIS weights, {level}")
    assert int(stats["masked_tokens"]) == masked
    assert int(stats["truncated_tokens"]) == 0


def test_sequence_masking_drops_whole_rows() -> None:
    # Row 1's sequence weight is exp(1.4) = 4.06: out of [0.5, 2], so both its tokens go; row 0's
    # is exp(-0.3) = 0.74: kept, every token weighted by the same 0.74.
    old, engine, mask = tensors()
    weights, stats = importance_weights(old, engine, mask, RolloutCorrection("mask", "sequence", upper=2.0))
    check(weights, [[math.exp(-0.3)] * 3, [0.0, 0.0, 0.0]], "MIS sequence weights")
    assert int(stats["masked_tokens"]) == 2


def test_explicit_lower_bound() -> None:
    old, engine, mask = tensors()
    weights, _ = importance_weights(
        old, engine, mask, RolloutCorrection("mask", "token", upper=5.0, lower=0.7)
    )
    # exp(-0.5) = 0.61 < 0.7 is masked; exp(1.4) = 4.06 <= 5 stays.
    check(weights, [[math.exp(0.2), 0.0, 1.0], [1.0, math.exp(1.4), 0.0]], "MIS with lower 0.7")


def test_identical_policies_weigh_one_exactly() -> None:
    old, _, mask = tensors()
    for level in ("token", "sequence", "geometric"):
        weights, stats = importance_weights(old, old.clone(), mask, RolloutCorrection("mask", level))
        assert_identical(weights, mask.float(), reason="log w = 0 gives exp(0) = 1 exactly")
        assert int(stats["masked_tokens"]) == 0


def test_settings_are_checked() -> None:
    assert RolloutCorrection.of(None) is None
    assert RolloutCorrection.of({"mode": "mask", "level": "geometric"}) == RolloutCorrection(
        "mask", "geometric"
    )
    with pytest.raises(ValueError, match="unknown settings"):
        RolloutCorrection.of({"cap": 2.0})
    with pytest.raises(ValueError, match="mode"):
        RolloutCorrection(mode="clip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="level"):
        RolloutCorrection(level="row")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="upper"):
        RolloutCorrection(upper=1.0)
    with pytest.raises(ValueError, match="only applies to mode: mask"):
        RolloutCorrection(mode="truncate", lower=0.5)


def test_weights_multiply_each_token_loss() -> None:
    # With old = current log-probs (ratio 1, no clip active), the token loss is -A * w_t, and
    # token_mean divides by all 5 valid tokens: loss = -(A0 * sum_t w_0t + A1 * sum_t w_1t) / 5.
    logprobs = torch.tensor(OLD).nan_to_num(0.0).requires_grad_(True)
    mask = torch.tensor(MASK)
    advantages = torch.tensor([1.0, -0.5])
    weights = torch.tensor([[0.5, 2.0, 1.0], [1.5, 0.0, 7.0]])  # 7.0 sits on padding: ignored
    loss, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, token_weights=weights)
    expected = -(1.0 * (0.5 + 2.0 + 1.0) + (-0.5) * (1.5 + 0.0)) / 5
    assert math.isclose(float(loss.detach()), expected, rel_tol=1e-6)
    loss.backward()
    # d loss / d logprob_t = -A * w_t / 5 (the ratio's derivative is 1 at ratio 1); 0 on padding.
    expected_grad = torch.tensor([[-0.1, -0.4, -0.2], [0.15, 0.0, 0.0]])
    assert_float32_close(logprobs.grad, expected_grad, ulps=4, reason="w_t * A_t / N per token")
    unweighted, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask)
    ones, _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, token_weights=mask.float())
    assert_identical(ones, unweighted, reason="weights of 1 multiply exactly")


def test_gap_distribution_counts() -> None:
    old, engine, mask = tensors()
    counts = gap_distribution(old, engine, mask)
    # |gaps| of valid tokens: 0.2, 0.5, 0, 0, 1.4; row sums 0.3 and 1.4 in absolute value.
    assert {k: int(v) for k, v in counts.items() if k.startswith("gap_over")} == {
        "gap_over_0.01": 3,
        "gap_over_0.1": 3,
        "gap_over_1": 1,
    }
    assert math.isclose(float(counts["sequence_gap_max"]), 1.4, rel_tol=1e-6)


def test_gap_by_frame_bucket() -> None:
    old, engine, mask = tensors()
    buckets = FrameBuckets((16, 64))
    stats = gap_statistics(old.nan_to_num(0.0), engine, mask, torch.zeros(2, 3), [8, 100], buckets)
    assert math.isclose(float(stats["gap_sum@1-16"]), 0.7, rel_tol=1e-6)
    assert int(stats["sampled_tokens@1-16"]) == 3
    assert int(stats["sampled_tokens@17-64"]) == 0
    assert math.isclose(float(stats["gap_sum@65+"]), 1.4, rel_tol=1e-6)
    assert int(stats["sampled_tokens@65+"]) == 2
    totals: dict[str, torch.Tensor] = {}
    merge_stats(totals, stats)
    merge_stats(totals, stats)
    assert int(totals["sampled_tokens@65+"]) == 4  # sums add
    assert totals["gap_max"] == stats["gap_max"]  # maxima stay
    with pytest.raises(ValueError, match="ascending"):
        FrameBuckets((64, 16))
