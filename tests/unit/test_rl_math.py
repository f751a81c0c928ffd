"""GRPO-family math (models.rl) against values computed by hand, plus property tests over random inputs.

Constants used below (plain Python ``math.exp``): e^0.1 = 1.1051709181, e^0.2 = 1.2214027582,
e^0.5 = 1.6487212707, e^-0.5 = 0.6065306597, e^1.5 = 4.4816890703, e = 2.7182818285.

Tolerances: models.rl computes in float32 whatever the input, so a hand value (exact to 1e-10)
is met within a few float32 roundings. Each formula here is at most ~10 float32 operations on
O(1) values (one exp, a mean of <= 5 terms), each rounding by <= 1/2 ulp (exp by <= 1 ulp), so
16 ulps of the largest expected magnitude (HAND_ULPS, 1.9e-6 relative) bounds it with margin; a
wrong branch, clip bound or weight moves a value by >= 1e-2 (10^5 ulps). Dyadic results (sums of
powers of two, clip counts) are exact in float32 and compared with ``==``.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.tolerances import assert_float32_close, assert_identical

from models.rl import aggregate_loss, kl_penalty, policy_loss
from rollout.advantages import (
    ADVANTAGE_ESTIMATORS,
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
    zero_variance_groups,
    zero_variance_rows,
)

E_01 = 1.1051709181
E_02 = 1.2214027582
E_05 = 1.6487212707
E_M05 = 0.6065306597
E_15 = 4.4816890703
E_1 = 2.7182818285


HAND_ULPS = 16
"""Float32 rounding of a short formula vs its hand value (see the module docstring)."""


def close(actual: torch.Tensor | float, expected: list | float) -> None:
    """``actual`` (float32 from models.rl) equals the hand value within HAND_ULPS of its magnitude."""
    assert_float32_close(actual, expected, ulps=HAND_ULPS, reason="float32 formula vs hand value")


# --- advantages -----------------------------------------------------------------------------

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])


def test_grpo_advantages_population_std():
    # Group 1: mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 1e-6). Group 2: constant -> 0.
    a = 0.5 / 0.500001
    close(grpo_advantages(REWARDS, 4), [a, -a, -a, a, 0.0, 0.0, 0.0, 0.0])


def test_grpo_advantages_bessel_std_matches_verl():
    # Bessel std of [1, 0, 0, 1] = sqrt((4 * 0.25) / 3) = 0.5773502692 -> 0.5 / 0.5773512692.
    a = 0.5 / (0.5773502692 + 1e-6)
    close(grpo_advantages(REWARDS, 4, unbiased=True), [a, -a, -a, a, 0.0, 0.0, 0.0, 0.0])


def test_dr_grpo_advantages():
    close(dr_grpo_advantages(REWARDS, 4), [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0])


def test_rloo_advantages():
    # [1, 0, 0, 1]: 1 - (0 + 0 + 1) / 3 = 2/3 and 0 - (1 + 0 + 1) / 3 = -2/3.
    close(rloo_advantages(REWARDS, 4), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0])
    # [1, 2, 3]: 1 - 2.5, 2 - 2, 3 - 1.5.
    close(rloo_advantages(torch.tensor([1.0, 2.0, 3.0]), 3), [-1.5, 0.0, 1.5])
    with pytest.raises(ValueError):
        rloo_advantages(torch.tensor([1.0]), 1)


def test_zero_variance_groups_and_rows():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    assert zero_variance_groups(rewards, 4).tolist() == [False, True, True]
    assert zero_variance_rows(rewards, 4).tolist() == [False] * 4 + [True] * 8
    near = torch.tensor([0.1, 0.1000001, 0.2, 0.3])
    assert zero_variance_groups(near, 2).tolist() == [False, False]
    assert zero_variance_groups(near, 2, atol=1e-3).tolist() == [True, False]


def test_advantage_registry_and_shape_checks():
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "dr_grpo", "rloo"}
    for estimator in ADVANTAGE_ESTIMATORS.values():
        out = estimator(REWARDS, 4)
        assert out.shape == (8,) and out.dtype == torch.float32
    with pytest.raises(ValueError):
        grpo_advantages(REWARDS, 3)
    with pytest.raises(ValueError):
        grpo_advantages(REWARDS.view(2, 4), 4)


# --- KL estimators --------------------------------------------------------------------------

LP = torch.tensor([-1.0, -2.0])
REF = torch.tensor([-1.5, -1.0])  # log(pi / ref) = [0.5, -1.0]


def test_kl_estimators():
    close(kl_penalty(LP, REF, "k1"), [0.5, -1.0])
    close(kl_penalty(LP, REF, "k2"), [0.125, 0.5])
    # k3 = e^(ref - lp) - (ref - lp) - 1: e^-0.5 + 0.5 - 1 and e^1 - 1 - 1.
    close(kl_penalty(LP, REF, "k3"), [E_M05 - 0.5, E_1 - 2.0])
    with pytest.raises(ValueError):
        kl_penalty(LP, REF, "k4")  # type: ignore[arg-type]


def test_k3_is_clamped_like_verl():
    # Far from the reference in either direction the estimate is capped at 10, finite.
    out = kl_penalty(torch.tensor([-40.0, -1.0]), torch.tensor([-1.0, -40.0]), "k3")
    close(out, [10.0, 10.0])


# --- clipped surrogate, one token at a time ---------------------------------------------------


def one_token_loss(log_ratio: float, advantage: float, **kwargs) -> tuple[float, dict]:
    old = torch.tensor([[-1.0]])
    loss, stats = policy_loss(old + log_ratio, old, torch.tensor([advantage]), torch.ones(1, 1), **kwargs)
    return loss.item(), stats


@pytest.mark.parametrize(
    ("log_ratio", "advantage", "expected", "clipped"),
    [
        (0.1, 1.0, -E_01, 0.0),  # inside [0.8, 1.28]: -A * r
        (0.5, 2.0, -2.0 * 1.28, 1.0),  # r = 1.65 > 1 + clip_high, A > 0: clipped at 1.28
        (-0.5, -1.0, 0.8, 1.0),  # r = 0.61 < 1 - clip_low, A < 0: clipped at 0.8
        (0.5, -1.0, E_05, 0.0),  # r high, A < 0: the unclipped (larger) loss is kept
        (-0.5, 1.0, -E_M05, 0.0),  # r low, A > 0: unclipped kept
    ],
)
def test_clipped_surrogate_regimes(log_ratio, advantage, expected, clipped):
    loss, stats = one_token_loss(log_ratio, advantage)
    close(loss, expected)
    assert stats["clip_fraction"].item() == clipped
    assert stats["dual_clip_fraction"].item() == 0.0


def test_dual_clip_caps_negative_advantage_loss():
    # r = e^1.5 = 4.48, A = -1: the loss 4.48 is capped at c * |A| = 3.
    loss, stats = one_token_loss(1.5, -1.0, dual_clip=3.0)
    assert loss == 3.0  # the cap -c * A = 3 is exact in float32
    assert stats["dual_clip_fraction"].item() == 1.0 and stats["clip_fraction"].item() == 0.0
    loss, stats = one_token_loss(1.5, -1.0, dual_clip=5.0)  # below the cap
    close(loss, E_15)
    assert stats["dual_clip_fraction"].item() == 0.0
    loss, stats = one_token_loss(1.5, 2.0, dual_clip=3.0)  # A > 0: dual clip never applies
    close(loss, -2.0 * 1.28)
    assert stats["dual_clip_fraction"].item() == 0.0
    with pytest.raises(ValueError):
        one_token_loss(0.0, 1.0, dual_clip=1.0)


# --- a four-token batch: stats and gradients -------------------------------------------------

LOG_RATIOS = [0.1, 0.5, -0.5, 0.5]  # r = [1.105, 1.649, 0.607, 1.649]
ADVANTAGES = [1.0, 2.0, -1.0, -1.0]  # regimes: inside, clipped, clipped, unclipped-high


def four_tokens(**kwargs) -> tuple[torch.Tensor, torch.Tensor, dict]:
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    logprobs = (old + torch.tensor([LOG_RATIOS])).requires_grad_()
    loss, stats = policy_loss(logprobs, old, torch.tensor([ADVANTAGES]), torch.ones(1, 4), **kwargs)
    loss.backward()
    return loss, logprobs.grad, stats


def test_stats_on_mixed_batch():
    _, _, stats = four_tokens()
    assert stats["clip_fraction"].item() == pytest.approx(0.5)
    close(stats["ratio_mean"], (E_01 + E_05 + E_M05 + E_05) / 4)
    # KL(old || new) by k3: mean of e^x - 1 - x over the log-ratios x.
    k3 = [E_01 - 1.1, E_05 - 1.5, E_M05 - 0.5, E_05 - 1.5]
    close(stats["approx_kl"], sum(k3) / 4)
    assert stats["ref_kl"].item() == 0.0 and stats["kl_loss"].item() == 0.0
    assert all(not v.requires_grad for v in stats.values())


def test_gradient_is_zero_where_clipped_and_minus_a_ratio_elsewhere():
    loss, grad, stats = four_tokens()
    # loss = (-E_01 - 2.56 + 0.8 + E_05) / 4; d/dlogprob_t = -A_t * r_t / 4 where unclipped.
    close(loss.item(), (-E_01 - 2.56 + 0.8 + E_05) / 4)
    assert stats["pg_loss"].item() == loss.item()  # without a KL term the loss *is* pg_loss
    close(grad, [[-E_01 / 4, 0.0, 0.0, E_05 / 4]])


def test_gradient_is_zero_where_dual_clipped():
    # Dual clip c = 1.5 < r = 1.649 caps the last token: its gradient vanishes too.
    _, grad, stats = four_tokens(dual_clip=1.5)
    close(grad, [[-E_01 / 4, 0.0, 0.0, 0.0]])
    assert stats["dual_clip_fraction"].item() == pytest.approx(0.25)


def test_gradient_weights_follow_the_aggregation():
    # Rows of 3 and 1 valid tokens, ratio 1 everywhere (logprobs == old), A = 1 for row 0, 2 for row 1.
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    expected = {
        "token_mean": [[-1 / 4] * 3, [-2 / 4, 0.0, 0.0]],
        "seq_mean_token_mean": [[-1 / 6] * 3, [-2 / 2, 0.0, 0.0]],
        "seq_mean_token_sum": [[-1 / 2] * 3, [-2 / 2, 0.0, 0.0]],
    }
    for aggregation, grad in expected.items():
        logprobs = old.clone().requires_grad_()
        loss, _ = policy_loss(logprobs, old, torch.tensor([1.0, 2.0]), mask, aggregation=aggregation)
        loss.backward()
        close(logprobs.grad, grad)


# --- aggregations on a ragged 2x3 batch --------------------------------------------------------

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
RAGGED = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("aggregation", "kwargs", "expected"),
    [
        ("token_mean", {}, (1 + 2 + 3 + 4) / 4),
        ("token_mean", {"token_count_normalizer": 8}, 10 / 8),
        ("token_mean", {"token_count_normalizer": torch.tensor(8)}, 10 / 8),
        ("seq_mean_token_mean", {}, (6 / 3 + 4 / 1) / 2),
        ("seq_mean_token_mean", {"seq_count_normalizer": 4}, (6 / 3 + 4 / 1) / 4),
        ("seq_mean_token_sum", {}, (6 + 4) / 2),
        ("seq_mean_token_sum", {"max_completion_length": 4}, (6 / 4 + 4 / 4) / 2),
    ],
)
def test_aggregations(aggregation, kwargs, expected):
    # Every expected value is a small dyadic rational (sums of integers over 1, 2, 4 or 8), and
    # each step (sum of integers, division by a power of two) is exact in float32: compared with ==.
    assert aggregate_loss(VALUES, RAGGED, aggregation, **kwargs).item() == expected
    # The same through policy_loss: ratio 1 and A = -values make the per-token loss = values.
    logprobs = torch.full((2, 3), -1.0)
    loss, _ = policy_loss(logprobs, logprobs, -VALUES, RAGGED.bool(), aggregation=aggregation, **kwargs)
    assert loss.item() == expected  # ratio exp(0) = 1 exactly, so -A * 1 = values exactly
    # An extra all-masked row (a filtered group) changes nothing.
    padded_values = torch.cat([VALUES, torch.full((1, 3), 100.0)])
    padded_mask = torch.cat([RAGGED, torch.zeros(1, 3)])
    assert aggregate_loss(padded_values, padded_mask, aggregation, **kwargs).item() == expected


def test_aggregation_option_misuse_is_an_error():
    with pytest.raises(ValueError):
        aggregate_loss(VALUES, RAGGED, "seq_mean_token_mean", token_count_normalizer=8)
    with pytest.raises(ValueError):
        aggregate_loss(VALUES, RAGGED, "token_mean", max_completion_length=4)
    with pytest.raises(ValueError):
        aggregate_loss(VALUES, RAGGED, "token_mean", seq_count_normalizer=2)
    with pytest.raises(ValueError):
        aggregate_loss(VALUES, RAGGED, "sum")  # type: ignore[arg-type]


def test_token_count_normalizer_sums_to_the_global_token_mean():
    # Two "ranks" holding 4 and 2 valid tokens: each divides by the global 6; the sum is the global mean.
    other_values, other_mask = torch.tensor([[7.0, 8.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    here = aggregate_loss(VALUES, RAGGED, "token_mean", token_count_normalizer=6)
    there = aggregate_loss(other_values, other_mask, "token_mean", token_count_normalizer=6)
    close((here + there).item(), (1 + 2 + 3 + 4 + 7 + 8) / 6)


# --- GSPO --------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_value_clipping_and_gradient():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])
    # Row 0: log-ratios 0.1, 0.3 (third token padding) -> s = e^0.2 = 1.2214, inside the clip range.
    # Row 1: log-ratios 0.5 each -> s = e^0.5 = 1.6487 > 1.28 with A > 0: the whole row is clipped.
    logprobs = (old + torch.tensor([[0.1, 0.3, 9.0], [0.5, 0.5, 0.5]])).requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    gspo = {"ratio_level": "sequence", "aggregation": "seq_mean_token_mean"}
    loss, stats = policy_loss(logprobs, old, torch.tensor([1.0, 1.0]), mask, **gspo)
    loss.backward()
    close(loss.item(), (-E_02 - 1.28) / 2)
    close(stats["ratio_mean"], (2 * E_02 + 3 * E_05) / 5)
    assert stats["clip_fraction"].item() == pytest.approx(3 / 5)
    # d loss / d logprob_t = -A * s / n_i / num_seqs for row 0, as GSPO's sequence objective gives.
    close(logprobs.grad, [[-E_02 / 2 / 2, -E_02 / 2 / 2, 0.0], [0.0, 0.0, 0.0]])
    # Per-token advantages (GSPO-token): each token's gradient carries its own A_t, here 1 and 3.
    logprobs.grad = None
    loss, _ = policy_loss(logprobs, old, torch.tensor([[1.0, 3.0, 0.0], [1.0, 1.0, 1.0]]), mask, **gspo)
    loss.backward()
    close(loss.item(), (-(1.0 + 3.0) / 2 * E_02 - 1.28) / 2)
    close(logprobs.grad, [[-1.0 * E_02 / 2 / 2, -3.0 * E_02 / 2 / 2, 0.0], [0.0, 0.0, 0.0]])


# --- KL in the loss -----------------------------------------------------------------------------


def test_kl_term_value_and_gradient():
    logprobs = LP.view(1, 2).clone().requires_grad_()
    ref = REF.view(1, 2)
    loss, stats = policy_loss(
        logprobs, LP.view(1, 2), torch.zeros(1), torch.ones(1, 2), kl_coef=0.01, ref_logprobs=ref
    )
    loss.backward()
    k3_mean = (E_M05 - 0.5 + E_1 - 2.0) / 2
    close(loss.item(), 0.01 * k3_mean)
    close(stats["ref_kl"].item(), k3_mean)
    close(stats["kl_loss"].item(), k3_mean)
    # d k3 / d logprob = 1 - e^(ref - logprob), times kl_coef / 2 tokens; A = 0 adds nothing.
    close(logprobs.grad, [[0.005 * (1 - E_M05), 0.005 * (1 - E_1)]])


def test_kl_coef_zero_needs_no_reference_and_nonzero_does():
    lp = torch.tensor([[-1.0, -2.0]])
    loss, stats = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), kl_coef=0.0)
    assert loss.item() == -1.0 and stats["ref_kl"].item() == 0.0  # ratio exp(0) = 1 exactly
    with pytest.raises(ValueError):
        policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), kl_coef=0.01)


# --- empty rows and padding garbage ---------------------------------------------------------------


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_all_zero_mask_rows_stay_finite(ratio_level, aggregation):
    inf = float("inf")
    old = torch.tensor([[-1.0, -2.0, -inf], [-inf, -inf, -inf]])
    logprobs = torch.tensor([[-0.9, -2.1, -inf], [-inf, float("nan"), -inf]], requires_grad=True)
    ref = torch.tensor([[-1.2, -1.8, -inf], [-inf, -inf, -inf]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    kwargs = {"ratio_level": ratio_level, "aggregation": aggregation, "kl_coef": 0.01, "ref_logprobs": ref}
    loss, stats = policy_loss(logprobs, old, torch.tensor([1.0, 0.0]), mask, dual_clip=3.0, **kwargs)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in stats.values())
    assert torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[1].eq(0).all() and logprobs.grad[0, 2] == 0
    assert logprobs.grad[0, :2].ne(0).all()
    # A batch with no valid token at all: loss 0, zero gradient, stats 0.
    logprobs.grad = None
    empty = torch.zeros(2, 3)
    loss, stats = policy_loss(logprobs, old, torch.tensor([1.0, 0.0]), empty, **kwargs)
    loss.backward()
    assert loss.item() == 0.0 and logprobs.grad.eq(0).all()
    assert all(v.item() == 0.0 for v in stats.values())


def test_filtered_groups_drop_out_of_the_loss():
    # Two groups of two; the second is all-equal, so DAPO filtering masks its rows.
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    advantages = grpo_advantages(rewards, 2)
    keep = ~zero_variance_rows(rewards, 2)
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    logprobs = old + torch.tensor([[0.1, 0.1], [-0.5, -0.5], [0.3, 0.3], [0.3, 0.3]])
    mask = torch.ones(4, 2) * keep[:, None]
    loss, _ = policy_loss(logprobs, old, advantages, mask, aggregation="seq_mean_token_mean")
    # Kept rows: A = +a at r = e^0.1 (inside), A = -a at r = e^-0.5 (clipped at 0.8), with
    # a = 0.5 / 0.500001; the mean runs over the 2 kept sequences, not 4.
    a = 0.5 / 0.500001
    close(loss.item(), (-a * E_01 + 0.8 * a) / 2)
    assert keep.tolist() == [True, True, False, False]


def test_low_precision_inputs_compute_in_float32():
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    loss, stats = policy_loss(lp, lp, torch.tensor([1.0], dtype=torch.bfloat16), torch.ones(1, 2))
    # logprobs == old: every log-ratio is exactly 0, so the ratio is exactly 1 and k3 exactly 0.
    assert loss.dtype == torch.float32 and loss.item() == -1.0
    assert stats["ratio_mean"].dtype == torch.float32
    assert stats["approx_kl"].item() == 0.0


# --- properties over random inputs ------------------------------------------------------------
# Plain torch random with fixed seeds (hypothesis is not a dependency): each test walks CASES
# random batches of groups, with group sizes, group counts and reward distributions drawn
# per case, a share of them constant groups, and rewards like 0.9 whose float32 mean is not exact.

CASES = 200
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
ESTIMATORS = {
    "grpo": grpo_advantages,
    "grpo_bessel": lambda r, g: grpo_advantages(r, g, unbiased=True),
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}


def random_groups(generator: torch.Generator, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, int]:
    """(rewards, group_size): 1..6 groups of 2..16, each group constant with probability 1/2.

    Values are uniform in [-10, 10], or drawn from a few decimal levels (0.1, 0.9, ...) that
    binary floats cannot hold exactly; constant groups repeat one such value.
    """
    group_size = int(torch.randint(2, 17, (), generator=generator))
    groups = int(torch.randint(1, 7, (), generator=generator))
    levels = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0, 1 / 3, -0.9, 3.7], dtype=torch.float64)
    rows = []
    for _ in range(groups):
        if torch.rand((), generator=generator) < 0.5:
            value = levels[torch.randint(len(levels), (), generator=generator)]
            rows.append(value.repeat(group_size))
        elif torch.rand((), generator=generator) < 0.5:
            rows.append(levels[torch.randint(len(levels), (group_size,), generator=generator)])
        else:
            rows.append(torch.rand(group_size, generator=generator, dtype=torch.float64) * 20 - 10)
    return torch.cat(rows).to(dtype), group_size


def constant_rows(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    grouped = rewards.view(-1, group_size)
    return (grouped == grouped[:, :1]).all(dim=1).repeat_interleave(group_size)


def test_eight_rewards_of_point_nine_give_exactly_zero():
    # The float32 mean of eight 0.9 is one ulp off 0.9; before the fix GRPO gave -0.056 here.
    for dtype in DTYPES:
        for name, estimator in ESTIMATORS.items():
            assert_identical(
                estimator(torch.full((8,), 0.9, dtype=dtype), 8),
                torch.zeros(8),
                reason=f"{name}, {dtype}: a constant group carries no signal",
            )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_constant_groups_get_exactly_zero_and_others_the_formula(dtype):
    generator = torch.Generator().manual_seed(14)
    for _ in range(CASES):
        rewards, g = random_groups(generator, dtype)
        constant = constant_rows(rewards, g)
        grouped = rewards.float().view(-1, g)
        mean = grouped.mean(dim=1, keepdim=True)
        # The documented formulas, evaluated with the same float32 operations in the same order
        # as models.rl: identical by construction on every non-constant group.
        formulas = {
            "grpo": (grouped - mean) / (grouped.std(dim=1, keepdim=True, unbiased=False) + 1e-6),
            "grpo_bessel": (grouped - mean) / (grouped.std(dim=1, keepdim=True, unbiased=True) + 1e-6),
            "dr_grpo": grouped - mean,
            "rloo": grouped - (grouped.sum(dim=1, keepdim=True) - grouped) / (g - 1),
        }
        for name, estimator in ESTIMATORS.items():
            advantages = estimator(rewards, g)
            assert advantages.dtype == torch.float32
            assert_identical(
                advantages[constant], torch.zeros(int(constant.sum())), reason=f"{name}: constant groups"
            )
            assert_identical(
                advantages[~constant],
                formulas[name].view(-1)[~constant],
                reason=f"{name}: non-constant groups keep the formula, same float32 ops",
            )


def test_advantages_under_power_of_two_scaling_and_sign_flip():
    # Multiplying by +-2^k is exact in binary floating point and commutes exactly with every
    # correctly rounded operation (sums, divisions, sqrt of 4^k x), so the results are identical:
    # Dr.GRPO and RLOO scale with the rewards, GRPO without eps is invariant (sign-equivariant).
    generator = torch.Generator().manual_seed(15)
    for _ in range(CASES):
        rewards, g = random_groups(generator)
        for factor in (4.0, -1.0, -0.125):
            scaled = rewards * factor
            for name in ("dr_grpo", "rloo"):
                assert_identical(
                    ESTIMATORS[name](scaled, g),
                    factor * ESTIMATORS[name](rewards, g),
                    reason=f"{name} x{factor}",
                )
            sign = math.copysign(1.0, factor)
            assert_identical(
                grpo_advantages(scaled, g, eps=0.0),
                sign * grpo_advantages(rewards, g, eps=0.0),
                reason=f"grpo (eps 0) x{factor}",
            )


def shift_bar_scale(rewards: torch.Tensor, shifted: torch.Tensor, g: int, standardised: bool) -> float:
    """Magnitude that rounding scales with when two groups differing by a shift are compared.

    r + c is rounded to the ulps of max |r + c|, and so is the group mean; the deviations
    r - mean then carry that absolute error, which GRPO divides by the group's std (its
    condition number is max |r + c| / std).
    """
    magnitude = float(torch.cat([rewards, shifted]).abs().max())
    if not standardised:
        return magnitude
    stds = rewards.view(-1, g).std(dim=1, unbiased=False)
    return magnitude / float(stds[stds > 0].min()) if (stds > 0).any() else magnitude


def test_advantages_are_shift_invariant():
    # A(r + c) = A(r) for every estimator. Float32 rounds r + c and the mean to the ulps of
    # |r + c| (a handful of roundings per element: the shift, the mean's sum of <= 16 terms,
    # the subtraction), so the bar is 32 ulps of max |r + c| (divided by the std for GRPO).
    # An estimator that kept an absolute term (e.g. forgot to subtract a baseline) is off by
    # |c| >= 0.5, i.e. by >= 10^4 bars.
    generator = torch.Generator().manual_seed(16)
    for _ in range(CASES):
        rewards, g = random_groups(generator)
        shift = float(torch.rand((), generator=generator) * 20 - 10)
        shift = math.copysign(max(abs(shift), 0.5), shift)
        shifted = (rewards.double() + shift).float()
        for name, estimator in ESTIMATORS.items():
            scale = shift_bar_scale(rewards, shifted, g, standardised=name.startswith("grpo"))
            assert_float32_close(
                estimator(shifted, g),
                estimator(rewards, g),
                ulps=32,
                scale=scale,
                reason=f"{name}: shift by {shift:.3g}",
            )


def test_advantages_are_equivariant_under_permutation():
    # Reordering whole groups: each group is reduced on its own, so the result is the same
    # permutation of the same bits. Reordering inside a group changes the order of the mean's
    # sum (<= 16 terms, <= 16 ulps of the largest |r|, / std for GRPO): a float32 bar of 32 ulps.
    generator = torch.Generator().manual_seed(17)
    for _ in range(CASES):
        rewards, g = random_groups(generator)
        groups = rewards.numel() // g
        group_order = torch.randperm(groups, generator=generator)
        by_group = rewards.view(groups, g)[group_order].reshape(-1)
        within = torch.stack([torch.randperm(g, generator=generator) for _ in range(groups)])
        by_row = torch.gather(rewards.view(groups, g), 1, within).reshape(-1)
        for name, estimator in ESTIMATORS.items():
            advantages = estimator(rewards, g).view(groups, g)
            assert_identical(
                estimator(by_group, g),
                advantages[group_order].reshape(-1),
                reason=f"{name}: groups reordered",
            )
            scale = shift_bar_scale(rewards, rewards, g, standardised=name.startswith("grpo"))
            assert_float32_close(
                estimator(by_row, g),
                torch.gather(advantages, 1, within).reshape(-1),
                ulps=32,
                scale=scale,
                reason=f"{name}: rows reordered inside groups",
            )


def random_sequences(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs, old_logprobs, mask) of 1..6 rows of 1..40 valid tokens.

    Log-probs in [-25, 0] (a large vocabulary's range: their float32 ulp is up to 2e-6) and
    small log-ratios in [-0.3, 0.3], where summing s + lp first would round s to lp's ulp.
    """
    rows = int(torch.randint(1, 7, (), generator=generator))
    width = int(torch.randint(1, 41, (), generator=generator))
    old = -25 * torch.rand(rows, width, generator=generator)
    logprobs = old + 0.6 * torch.rand(rows, width, generator=generator) - 0.3
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return logprobs, old, mask


GSPO_UNCLIPPED = {"ratio_level": "sequence", "clip_low": 0.999, "clip_high": 1e6}
"""GSPO with a clip range ([0.001, 1e6]) no ratio here reaches, so the loss shows the ratio itself."""


def test_gspo_ratio_is_exp_of_the_mean_log_ratio():
    generator = torch.Generator().manual_seed(18)
    for _ in range(CASES):
        logprobs, old, mask = random_sequences(generator)
        for row in range(len(logprobs)):
            lp, old_lp, valid = logprobs[row : row + 1], old[row : row + 1], mask[row : row + 1]
            # One-hot advantage 1 on the first token and a normaliser of 1: the loss is exactly
            # -r of that token (the other tokens add -0 * r = -0), i.e. the row's sequence ratio.
            onehot = torch.zeros_like(lp)
            onehot[0, 0] = 1.0
            loss, _ = policy_loss(lp, old_lp, onehot, valid, token_count_normalizer=1, **GSPO_UNCLIPPED)
            ratio = -loss
            # Same float32 operations as the loss, in the same order: since (lp - sg(lp)) is
            # exactly 0, the ratio is exp(s) to the last bit (summing s + lp first would round
            # s to the ulp of lp, 2e-6 at lp = -25, and fail this).
            n = int(valid.sum())
            mean_log_ratio = torch.where(valid, lp - old_lp, 0.0).sum(dim=-1) / n
            # exp over a row of the same width, so the same kernel path (vector body or scalar
            # tail) evaluates the same position: identical by construction.
            row_of_s = torch.zeros_like(lp) + mean_log_ratio[:, None]
            assert_identical(ratio, row_of_s.exp()[0, 0], reason="GSPO ratio = exp(s) in float32")
            # Against float64: s is a float32 sum of n rounded differences (each <= 1/2 ulp of
            # |lp - old|, the sum <= n ulps of sum |d| in the worst case), and exp turns its
            # absolute error into a relative one, plus 1 ulp: (n + 2) ulps of r * (1 + mean |d|),
            # doubled (2n + 8) for exp implementations that differ by a few ulps across CPUs.
            diffs = torch.where(valid, lp.double() - old_lp.double(), 0.0)
            exact = float(diffs.sum() / n)
            scale = math.exp(exact) * (1 + float(diffs.abs().sum()) / n)
            assert_float32_close(
                ratio, math.exp(exact), ulps=2 * n + 8, scale=scale, reason="GSPO ratio vs float64"
            )


def test_gspo_gradient_is_the_sequence_ratio_over_length():
    # With A = 1 on every valid token and seq_mean_token_mean over one row, the loss is
    # -mean_t r_t and its gradient w.r.t. each valid logprob_t is -s / n (GSPO-token), 0 on
    # padding. Float64 reference; the float32 gradient carries s's rounding (<= (n + 2) ulps, as
    # above) and one division: (n + 4) ulps of the reference's magnitude times (1 + mean |d|),
    # doubled (2n + 12) as above.
    generator = torch.Generator().manual_seed(19)
    for _ in range(CASES):
        logprobs, old, mask = random_sequences(generator)
        for row in range(len(logprobs)):
            lp = logprobs[row : row + 1].clone().requires_grad_()
            old_lp, valid = old[row : row + 1], mask[row : row + 1]
            loss, _ = policy_loss(
                lp, old_lp, torch.ones(1), valid, aggregation="seq_mean_token_mean", **GSPO_UNCLIPPED
            )
            loss.backward()
            n = int(valid.sum())
            diffs = torch.where(valid, lp.detach().double() - old_lp.double(), 0.0)
            ratio = math.exp(float(diffs.sum() / n))
            expected = torch.where(valid, torch.tensor(-ratio / n, dtype=torch.float64), 0.0)
            scale = ratio / n * (1 + float(diffs.abs().sum()) / n)
            assert_float32_close(
                lp.grad, expected, ulps=2 * n + 12, scale=scale, reason="GSPO gradient vs float64"
            )


def test_gspo_bounds_a_negative_advantage_row_with_a_large_sequence_ratio():
    # One row of two tokens, log-ratios 12 each: log s = 12, above the cap of 10. With A = -1 the
    # clip does not act (it caps ratios on the side where the advantage gains), so without the cap
    # the loss would be e^12 = 162,755 and each token's gradient e^12 / 2.
    from models.rl.losses import GSPO_LOG_RATIO_MAX

    old = torch.tensor([[-20.0, -20.0]])
    logprobs = (old + 12.0).requires_grad_()
    gspo = {"ratio_level": "sequence", "aggregation": "seq_mean_token_mean"}
    loss, stats = policy_loss(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 2), **gspo)
    loss.backward()
    capped = math.exp(GSPO_LOG_RATIO_MAX)  # 22,026.47
    close(loss.item(), capped)  # -A * s at the cap, mean over 1 sequence of 2 tokens' equal losses
    close(stats["ratio_mean"], capped)
    close(logprobs.grad, [[capped / 2, capped / 2]])  # -A * s / n_i per token
    # With a dual clip of 3 the loss is capped at -c * A = 3, and its gradient is 0.
    logprobs.grad = None
    loss, _ = policy_loss(logprobs, old, torch.tensor([-1.0]), torch.ones(1, 2), dual_clip=3.0, **gspo)
    loss.backward()
    close(loss.item(), 3.0)
    close(logprobs.grad, [[0.0, 0.0]])
