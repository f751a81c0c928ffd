"""GRPO-family math (models.rl) against values computed by hand.

Constants used below (plain Python ``math.exp``): e^0.1 = 1.1051709181, e^0.2 = 1.2214027582,
e^0.5 = 1.6487212707, e^-0.5 = 0.6065306597, e^1.5 = 4.4816890703, e = 2.7182818285.
"""

from __future__ import annotations

import math

import pytest
import torch

from models.rl import (
    ADVANTAGE_ESTIMATORS,
    aggregate_loss,
    dr_grpo_advantages,
    grpo_advantages,
    kl_penalty,
    policy_loss,
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


def close(actual: torch.Tensor, expected: list | float, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=1e-5)


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
    assert loss == pytest.approx(expected, rel=1e-6)
    assert stats["clip_fraction"].item() == clipped
    assert stats["dual_clip_fraction"].item() == 0.0


def test_dual_clip_caps_negative_advantage_loss():
    # r = e^1.5 = 4.48, A = -1: the loss 4.48 is capped at c * |A| = 3.
    loss, stats = one_token_loss(1.5, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0)
    assert stats["dual_clip_fraction"].item() == 1.0 and stats["clip_fraction"].item() == 0.0
    loss, stats = one_token_loss(1.5, -1.0, dual_clip=5.0)  # below the cap
    assert loss == pytest.approx(E_15, rel=1e-6) and stats["dual_clip_fraction"].item() == 0.0
    loss, stats = one_token_loss(1.5, 2.0, dual_clip=3.0)  # A > 0: dual clip never applies
    assert loss == pytest.approx(-2.0 * 1.28) and stats["dual_clip_fraction"].item() == 0.0
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
    assert loss.item() == pytest.approx((-E_01 - 2.56 + 0.8 + E_05) / 4, rel=1e-6)
    assert stats["pg_loss"].item() == pytest.approx(loss.item())
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
    assert aggregate_loss(VALUES, RAGGED, aggregation, **kwargs).item() == pytest.approx(expected)
    # The same through policy_loss: ratio 1 and A = -values make the per-token loss = values.
    logprobs = torch.full((2, 3), -1.0)
    loss, _ = policy_loss(logprobs, logprobs, -VALUES, RAGGED.bool(), aggregation=aggregation, **kwargs)
    assert loss.item() == pytest.approx(expected)
    # An extra all-masked row (a filtered group) changes nothing.
    padded_values = torch.cat([VALUES, torch.full((1, 3), 100.0)])
    padded_mask = torch.cat([RAGGED, torch.zeros(1, 3)])
    assert aggregate_loss(padded_values, padded_mask, aggregation, **kwargs).item() == pytest.approx(expected)


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
    assert (here + there).item() == pytest.approx((1 + 2 + 3 + 4 + 7 + 8) / 6)


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
    assert loss.item() == pytest.approx((-E_02 - 1.28) / 2, rel=1e-6)
    close(stats["ratio_mean"], (2 * E_02 + 3 * E_05) / 5)
    assert stats["clip_fraction"].item() == pytest.approx(3 / 5)
    # d loss / d logprob_t = -A * s / n_i / num_seqs for row 0, as GSPO's sequence objective gives.
    close(logprobs.grad, [[-E_02 / 2 / 2, -E_02 / 2 / 2, 0.0], [0.0, 0.0, 0.0]])
    # Per-token advantages (GSPO-token): each token's gradient carries its own A_t, here 1 and 3.
    logprobs.grad = None
    loss, _ = policy_loss(logprobs, old, torch.tensor([[1.0, 3.0, 0.0], [1.0, 1.0, 1.0]]), mask, **gspo)
    loss.backward()
    assert loss.item() == pytest.approx((-(1.0 + 3.0) / 2 * E_02 - 1.28) / 2, rel=1e-6)
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
    assert loss.item() == pytest.approx(0.01 * k3_mean, rel=1e-6)
    assert stats["ref_kl"].item() == pytest.approx(k3_mean, rel=1e-6)
    assert stats["kl_loss"].item() == pytest.approx(k3_mean, rel=1e-6)
    # d k3 / d logprob = 1 - e^(ref - logprob), times kl_coef / 2 tokens; A = 0 adds nothing.
    close(logprobs.grad, [[0.005 * (1 - E_M05), 0.005 * (1 - E_1)]])


def test_kl_coef_zero_needs_no_reference_and_nonzero_does():
    lp = torch.tensor([[-1.0, -2.0]])
    loss, stats = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), kl_coef=0.0)
    assert loss.item() == pytest.approx(-1.0) and stats["ref_kl"].item() == 0.0
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
    assert loss.item() == pytest.approx((-a * E_01 + 0.8 * a) / 2, rel=1e-6)
    assert keep.tolist() == [True, True, False, False]


def test_low_precision_inputs_compute_in_float32():
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    loss, stats = policy_loss(lp, lp, torch.tensor([1.0], dtype=torch.bfloat16), torch.ones(1, 2))
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(-1.0)
    assert stats["ratio_mean"].dtype == torch.float32
    assert math.isclose(stats["approx_kl"].item(), 0.0, abs_tol=1e-12)
