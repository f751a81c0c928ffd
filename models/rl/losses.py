"""Policy-gradient losses of the GRPO family (GRPO, DAPO, Dr.GRPO, GSPO) as pure tensor functions.

Shapes: a batch holds one completion per row. ``logprobs``, ``old_logprobs``, ``ref_logprobs``
and ``mask`` are ``(batch, max_len)``; ``mask`` (bool or float, nonzero = valid) marks the
completion tokens that enter the loss. Positions outside the mask may hold anything, -inf
and NaN included: they are replaced by 0 before any arithmetic, so they reach neither the
loss nor the gradient. A row whose mask is all zero (a filtered group, see
``rollout.advantages.zero_variance_rows``) contributes nothing and causes no NaN.
Everything is computed in float32 whatever the input dtype.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

__all__ = ["aggregate_loss", "kl_penalty", "policy_loss"]

KLKind = Literal["k1", "k2", "k3"]
RatioLevel = Literal["token", "sequence"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]

LOG_RATIO_LIMIT = 20.0
"""Log-ratios are clamped to [-20, 20] before ``exp`` (as verl does) so a stale or broken
log-prob cannot overflow float32; the gradient through a clamped log-ratio is 0."""

GSPO_LOG_RATIO_MAX = 10.0
"""GSPO's sequence log-ratio is capped at 10 (as verl's ``gspo`` loss does), on the value and the
gradient alike: the gradient of a row is ``s_i * A_i`` times its mean token gradient, so a row
whose likelihood grew a lot (log s = 12: s = 1.6e5) with a negative advantage escapes the clip
(the clip only caps ratios on the side where the advantage gains) and would push its tokens down
with an unbounded weight. At the cap, a row's loss and gradient weight are at most e^10 |A_i|
(22,026 |A_i|); ``dual_clip`` bounds them further (c |A_i|, gradient 0)."""

K3_LIMIT = 10.0
"""The k3 estimate is clamped to [-10, 10] (as verl's ``low_var_kl``): k3 >= 0 in exact math,
and the cap bounds the penalty (and zeroes its gradient) on tokens far from the reference."""


def _check_choice(name: str, value: str, kind: object) -> None:
    allowed = get_args(kind)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: KLKind = "k3") -> Tensor:
    """Per-token estimate of KL(pi || ref) from log-probs of tokens sampled from pi.

    With d = logprobs - ref_logprobs = log(pi / ref):

        k1 = d                           unbiased, high variance, can be negative
        k2 = 0.5 * d^2                   biased, low variance, >= 0
        k3 = exp(-d) - (-d) - 1          unbiased, low variance, >= 0 ("low_var_kl"); equals
           = ref/pi - log(ref/pi) - 1    (r - 1) - log r with r = ref/pi (Schulman's k3)

    (Estimator names from J. Schulman, "Approximating KL Divergence", 2020.) For k3 the
    log-ratio is clamped to [-20, 20] before ``exp`` and the result to [-10, 10], as verl
    does; k1 and k2 are not clamped. No mask is applied here: ``policy_loss`` zeroes padded
    positions before calling it. Returns float32 of the input shape.
    """
    _check_choice("kind", kind, KLKind)
    log_ratio = logprobs.float() - ref_logprobs.float()
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    ref_log_ratio = (-log_ratio).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # log(ref / pi)
    return (ref_log_ratio.exp() - ref_log_ratio - 1.0).clamp(-K3_LIMIT, K3_LIMIT)


def _count_floor(count: float | Tensor) -> float | Tensor:
    """A token or sequence count used as a divisor, floored at 1 so an empty batch gives 0, not NaN."""
    return count.clamp(min=1) if isinstance(count, Tensor) else max(float(count), 1.0)


def aggregate_loss(
    values: Tensor,
    mask: Tensor,
    aggregation: Aggregation = "token_mean",
    token_count_normalizer: float | Tensor | None = None,
    seq_count_normalizer: float | Tensor | None = None,
    max_completion_length: int | None = None,
) -> Tensor:
    """Reduce per-token values ``(batch, max_len)`` to a scalar over the valid tokens.

    With m the mask, n_i = sum_t m_it the valid tokens of row i and S the non-empty rows:

        token_mean           sum_it m_it v_it / N,  N = sum_it m_it, or ``token_count_normalizer``
        seq_mean_token_mean  sum_{i in S} (sum_t m_it v_it / n_i) / |S|
        seq_mean_token_sum   sum_{i in S} (sum_t m_it v_it / L) / |S|,  L = ``max_completion_length`` or 1

    ``token_mean`` weighs every token equally (DAPO; long completions weigh more).
    ``seq_mean_token_mean`` weighs every completion equally (the GRPO paper and GSPO; a
    token of a short completion weighs more, the length bias Dr.GRPO points out).
    ``seq_mean_token_sum`` with L a constant generation budget is Dr.GRPO's unbiased
    aggregation; without L it is the plain token sum per sequence (gradient scale grows with
    length, so the learning rate must shrink).

    Departures: rows with no valid token (filtered groups) are left out of |S| instead of
    counting as zero-loss sequences, so filtering a group does not shrink the loss of the
    others (TRL's Dr.GRPO divides by the full batch size).

    Data parallelism: by default every rank averages over its own tokens or sequences, which
    weighs ranks equally, not tokens. Pass the global count (all-reduced over data-parallel
    ranks) as ``token_count_normalizer`` (``token_mean``) or ``seq_count_normalizer`` (the
    ``seq_mean_*`` modes) to get this rank's share of the global-batch mean: summing the ranks'
    losses gives the global mean, so under DDP's gradient *averaging* multiply the loss by the
    data-parallel world size. Counts below 1 are treated as 1.
    """
    _check_choice("aggregation", aggregation, Aggregation)
    if token_count_normalizer is not None and aggregation != "token_mean":
        raise ValueError("token_count_normalizer only applies to aggregation='token_mean'")
    if seq_count_normalizer is not None and aggregation == "token_mean":
        raise ValueError("seq_count_normalizer only applies to the seq_mean_* aggregations")
    if max_completion_length is not None and aggregation != "seq_mean_token_sum":
        raise ValueError("max_completion_length only applies to aggregation='seq_mean_token_sum'")
    if values.shape != mask.shape or values.dim() != 2:
        raise ValueError(
            f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must both be (batch, max_len)"
        )
    valid = mask.bool()
    values = torch.where(valid, values.float(), 0.0)
    if aggregation == "token_mean":
        count = valid.sum() if token_count_normalizer is None else token_count_normalizer
        return values.sum() / _count_floor(count)
    tokens_per_seq = valid.sum(dim=-1)
    if aggregation == "seq_mean_token_mean":
        per_seq = values.sum(dim=-1) / tokens_per_seq.clamp(min=1)
    else:
        if max_completion_length is not None and max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
        per_seq = values.sum(dim=-1) / float(max_completion_length or 1)
    count = (tokens_per_seq > 0).sum() if seq_count_normalizer is None else seq_count_normalizer
    return per_seq.sum() / _count_floor(count)  # empty rows have per_seq == 0


def _masked_mean(values: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``values`` over the valid positions, detached, 0 when there are none."""
    values = torch.where(valid, values.detach().float(), 0.0)
    return values.sum() / valid.sum().clamp(min=1)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    ratio_level: RatioLevel = "token",
    aggregation: Aggregation = "token_mean",
    kl_coef: float = 0.0,
    ref_logprobs: Tensor | None = None,
    kl_kind: KLKind = "k3",
    token_count_normalizer: float | Tensor | None = None,
    seq_count_normalizer: float | Tensor | None = None,
    max_completion_length: int | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped-surrogate policy loss (PPO/GRPO/DAPO/GSPO) plus an optional KL-to-reference term.

    ``advantages`` is ``(batch,)`` (one per completion, broadcast over its tokens) or
    ``(batch, max_len)``. Per valid token t of completion i, with A = A_it:

        r_t    = exp(logprobs_t - old_logprobs_t)                                 (ratio_level="token")
        L_t    = max(-A * r_t, -A * clip(r_t, 1 - clip_low, 1 + clip_high))
               = -min(A * r_t, A * clip(r_t, ...))
        L_t    = min(L_t, -c * A)     when A < 0 and dual_clip c > 1 (Ye et al., 2020: caps the
                                      loss of a negative-advantage token whose ratio is huge)
        loss   = aggregate(L) + kl_coef * aggregate(kl_penalty(logprobs, ref_logprobs, kl_kind))

    with ``aggregate`` = :func:`aggregate_loss` (same mode and normalizers for both terms).
    The gradient of L_t is -A * r_t * grad(logprobs_t) where no clip is active and 0 where one
    is. ``clip_high > clip_low`` is DAPO's "clip-higher" (0.2 / 0.28 by default).

    GSPO (``ratio_level="sequence"``, Zheng et al., 2025): the ratio is the length-normalised
    sequence likelihood ratio s_i = exp(mean over valid t of (logprobs_t - old_logprobs_t)),
    and every token of the row uses

        r_t = sg(s_i) * exp(logprobs_t - sg(logprobs_t))       (sg = stop-gradient / detach)

    whose value is s_i (so clipping acts on whole sequences) and whose gradient w.r.t.
    logprobs_t is s_i (GSPO-token). It is evaluated as exp((logprobs_t - sg(logprobs_t)) +
    sg(log s_i)), in that order: the bracket is exactly 0, so the value is exactly
    exp(log s_i), with no rounding of log s_i to the coarser ulp of logprobs_t. With one
    advantage per sequence this has exactly the gradient of GSPO's sequence objective,
    s_i * A_i * mean_t grad(logprobs_t) per sequence
    (the paper averages sequences: ``aggregation="seq_mean_token_mean"``; ``token_mean``
    weighs sequence i by its length instead); per-token advantages then weigh each token's
    gradient by its own A_it, which the sequence form cannot express. GSPO's
    clip ranges are far smaller than the token-level ones (the paper uses 3e-4 / 4e-4): set
    ``clip_low`` / ``clip_high`` accordingly, the defaults are token-level values. log s_i is
    capped at :data:`GSPO_LOG_RATIO_MAX` (10), which bounds a negative-advantage row's loss and
    gradient weight at e^10 |A_i|.

    Rollout correction (:mod:`models.rl.correction`): ``token_weights`` ``(batch, max_len)``
    multiplies each token's surrogate loss after clipping (L_t <- w_t * L_t), as constants (no
    gradient flows through them); the KL term is not weighted. None: every weight is 1.

    KL: ``kl_coef = 0`` skips the term and ``ref_logprobs`` may be None; with a reference
    given the KL is still reported. Log-ratios are clamped to [-20, 20] before ``exp``
    (see ``LOG_RATIO_LIMIT``).

    Returns ``(loss, stats)``; stats are detached float32 scalars over the valid tokens of
    this batch (each token weighs the same, whatever the aggregation), so logging them costs
    no device sync:

        clip_fraction       tokens where the clipped branch is strictly the larger loss
        dual_clip_fraction  tokens where the dual-clip cap is active
        ratio_mean          mean r_t (for GSPO, s_i per token)
        approx_kl           KL(old || new) by the k3 estimator on the token log-ratio,
                            mean of (r - 1) - log r; >= 0 and lower-variance than
                            verl's k1 "ppo_kl" (mean of -log r)
        ref_kl              mean kl_penalty to the reference (0 without ref_logprobs)
        pg_loss, kl_loss    the two aggregated terms (kl_loss before kl_coef, 0 without a reference)
    """
    _check_choice("ratio_level", ratio_level, RatioLevel)
    _check_choice("kl_kind", kl_kind, KLKind)
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must all be (batch, max_len)"
        )
    if not 0.0 <= clip_low < 1.0 or clip_high < 0.0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError("kl_coef != 0 needs ref_logprobs")
    if ref_logprobs is not None and ref_logprobs.shape != logprobs.shape:
        raise ValueError(f"ref_logprobs {tuple(ref_logprobs.shape)} must match logprobs")
    if token_weights is not None and token_weights.shape != logprobs.shape:
        raise ValueError(f"token_weights {tuple(token_weights.shape)} must match logprobs")
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    advantages = advantages.float().expand_as(logprobs)

    valid = mask.bool()
    # Zero the padding first: -inf or NaN there would otherwise poison sums and gradients.
    logprobs = torch.where(valid, logprobs.float(), 0.0)
    old_logprobs = torch.where(valid, old_logprobs.float(), 0.0)
    advantages = torch.where(valid, advantages, 0.0)

    token_log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if ratio_level == "token":
        ratio = token_log_ratio.exp()
    else:
        seq_log_ratio = (logprobs - old_logprobs).sum(dim=-1) / valid.sum(dim=-1).clamp(min=1)
        seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_LIMIT, GSPO_LOG_RATIO_MAX)
        # (lp - sg(lp)) is exactly 0 in value, so adding s_i after it keeps s_i exact and the
        # ratio's value is exp(s_i) to the last bit; summing s_i + lp first (as a one-line
        # transcription would) rounds s_i to the ulp of lp, which can be far coarser.
        ratio = ((logprobs - logprobs.detach()) + seq_log_ratio.detach()[:, None]).exp()

    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped_loss, clipped_loss)
    clipped = clipped_loss > unclipped_loss
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (per_token > cap)
        per_token = torch.where(dual_clipped, cap, per_token)
    else:
        dual_clipped = torch.zeros_like(valid)
    if token_weights is not None:
        per_token = per_token * torch.where(valid, token_weights.detach().float(), 0.0)

    def aggregate(values: Tensor) -> Tensor:
        return aggregate_loss(
            values, valid, aggregation, token_count_normalizer, seq_count_normalizer, max_completion_length
        )

    pg_loss = aggregate(per_token)
    loss = pg_loss
    kl_loss = ref_kl = torch.zeros((), dtype=torch.float32, device=logprobs.device)
    if ref_logprobs is not None:
        ref_logprobs = torch.where(valid, ref_logprobs.float(), 0.0)
        kl = kl_penalty(logprobs, ref_logprobs, kl_kind)
        ref_kl = _masked_mean(kl, valid)
        kl_loss = aggregate(kl)
        if kl_coef != 0.0:
            loss = loss + kl_coef * kl_loss

    token_log_ratio = token_log_ratio.detach()
    stats = {
        "clip_fraction": _masked_mean(clipped, valid),
        "dual_clip_fraction": _masked_mean(dual_clipped, valid),
        "ratio_mean": _masked_mean(ratio, valid),
        "approx_kl": _masked_mean(token_log_ratio.exp() - 1.0 - token_log_ratio, valid),
        "ref_kl": ref_kl,
        "pg_loss": pg_loss.detach(),
        "kl_loss": kl_loss.detach(),
    }
    return loss, stats
