"""Rollout correction: importance weights for completions sampled by an engine that is not the trainer.

The engine samples with its own kernels and, on GPUs, often in bf16; the trainer scores the same
tokens with others. So the *behaviour* policy mu (what the engine actually sampled from) is not
the trainer's *old* policy pi_old (the same weights, evaluated by the trainer), and a clipped
surrogate whose ratio is taken against mu's log-probs carries the gap between the two as if it
were a policy change. Rollout correction splits the two roles:

    ratio_t  = pi_theta(y_t) / pi_old(y_t)          the PPO/GRPO ratio, clipped as usual
    w        = pi_old / mu                          the importance weight of the sample
    L_t      = w * clipped_surrogate(ratio_t)       (w is a constant: no gradient through it)

which is the off-policy policy gradient of pi_old's objective from mu's samples. The raw weight
has unbounded variance, so it is bounded in one of two ways, at one of three levels.

Levels, with d_t = log pi_old(y_t) - log mu(y_t) over the completion's valid tokens:

    token       w_t = exp(d_t)                         each token its own weight
    sequence    w_i = exp(sum_t d_t)                   the exact weight of the whole completion
    geometric   w_i = exp(mean_t d_t)                  its per-token geometric mean (length-free)

Modes (C = ``upper``, c = ``lower``):

    truncate    w <- min(w, C)                         truncated IS (TIS): Yao, Liu et al., 2025,
                                                       "Your Efficient RL Framework Secretly
                                                       Brings You Off-Policy RL Training"
    mask        w <- w * 1[c <= w <= C]                masked IS (MIS): a token or sequence whose
                                                       weight leaves [c, C] is dropped from the
                                                       loss instead of being weighted (Liu, Li et
                                                       al., 2025, "When Speed Kills Stability")

A masked token keeps its place in the loss's normaliser (its weight is 0, as if its advantage
were): micro-batches then add up to the full batch without knowing the mask in advance.

pi_old costs no extra pass here: the trainer's first-iteration log-probs are taken before any
update of the batch (the update follows the last micro-batch), so, detached, they *are* the old
policy's, bit for bit what a separate no-grad pass would compute (tested). With the correction
off, pi_old is the engine's mu, as in the paper's release.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from core.settings import settings_block
from models.rl.losses import LOG_RATIO_LIMIT

CorrectionMode = Literal["truncate", "mask"]
CorrectionLevel = Literal["token", "sequence", "geometric"]

GAP_THRESHOLDS = (0.01, 0.1, 1.0)
"""Token log-prob gaps |log pi_old - log mu| counted above these (nats): the gap distribution's tail."""


@dataclass(frozen=True)
class RolloutCorrection:
    """The ``rollout_correction:`` block of the GRPO module's arguments.

    Attributes:
        mode: ``truncate`` (TIS: weights capped at ``upper``) or ``mask`` (MIS: weights outside
            ``[lower, upper]`` set to 0).
        level: ``token``, ``sequence`` (product over the completion) or ``geometric`` (its
            per-token geometric mean).
        upper: the cap C (truncate) or the upper bound (mask). 2.0 by default (verl's and TIS's
            usual range is 2 to 10 for tokens); a sequence-level product drifts further from 1
            as completions lengthen, so give ``sequence`` a wider range than ``geometric``.
        lower: the lower bound of ``mask`` (default ``1 / upper``); unused by ``truncate``.
    """

    mode: CorrectionMode = "truncate"
    level: CorrectionLevel = "token"
    upper: float = 2.0
    lower: float | None = None

    def __post_init__(self) -> None:
        for name, kind in (("mode", CorrectionMode), ("level", CorrectionLevel)):
            value = getattr(self, name)
            if value not in get_args(kind):
                raise ValueError(f"rollout_correction.{name} must be one of {get_args(kind)}, got {value!r}")
        if not self.upper > 1.0:
            raise ValueError(f"rollout_correction.upper must be > 1, got {self.upper}")
        if self.lower is not None:
            if self.mode != "mask":
                raise ValueError("rollout_correction.lower only applies to mode: mask")
            if not 0.0 <= self.lower < 1.0:
                raise ValueError(f"rollout_correction.lower must be in [0, 1), got {self.lower}")

    @property
    def bounds(self) -> tuple[float, float]:
        """``(lower, upper)`` of the accepted weights (truncate accepts every weight: lower 0)."""
        if self.mode == "truncate":
            return 0.0, self.upper
        return (1.0 / self.upper if self.lower is None else self.lower), self.upper

    @classmethod
    def of(cls, value: RolloutCorrection | Mapping[str, Any] | None) -> RolloutCorrection | None:
        """The settings of a YAML ``rollout_correction:`` block (None: no correction, the engine's
        log-probs are the old policy)."""
        return settings_block(cls, value, "rollout_correction")


def log_importance_weights(
    old_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, level: CorrectionLevel
) -> Tensor:
    """log w per token ``(batch, max_len)``, float32, 0 outside ``mask``; sequence levels give
    every valid token of a row its row's log-weight. Clamped to [-20, 20] before any ``exp``."""
    valid = mask.bool()
    gap = torch.where(valid, old_logprobs.detach().float() - engine_logprobs.float(), 0.0)
    if level == "token":
        log_w = gap
    else:
        per_row = gap.sum(dim=-1)
        if level == "geometric":
            per_row = per_row / valid.sum(dim=-1).clamp(min=1)
        log_w = per_row[:, None].expand_as(gap)
    return torch.where(valid, log_w.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), 0.0)


def importance_weights(
    old_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, correction: RolloutCorrection
) -> tuple[Tensor, dict[str, Tensor]]:
    """Bounded importance weights ``(batch, max_len)`` for the per-token loss, and their statistics.

    Weights are float32, detached, and 0 outside ``mask``. Statistics are detached *sums* over
    the valid tokens (divide by ``tokens``), so that micro-batches and data-parallel ranks add
    up: ``weight_sum`` (bounded weights), ``weight_max``, ``raw_weight_sum`` (before bounding),
    ``masked_tokens`` (mask mode: weight set to 0), ``truncated_tokens`` (truncate mode: capped),
    ``tokens``.
    """
    valid = mask.bool()
    raw = log_importance_weights(old_logprobs, engine_logprobs, mask, correction.level).exp()
    lower, upper = correction.bounds
    none = torch.zeros((), dtype=torch.long)
    if correction.mode == "truncate":
        limited = raw > upper
        weights = raw.clamp(max=upper)
        stats = {"truncated_tokens": (limited & valid).sum(), "masked_tokens": none}
    else:
        outside = (raw < lower) | (raw > upper)
        weights = torch.where(outside, 0.0, raw)
        stats = {"masked_tokens": (outside & valid).sum(), "truncated_tokens": none}
    weights = torch.where(valid, weights, 0.0)
    stats |= {
        "weight_sum": weights.sum(),
        "weight_max": weights.max() if weights.numel() else torch.zeros(()),
        "raw_weight_sum": torch.where(valid, raw, 0.0).sum(),
        "tokens": valid.sum(),
    }
    return weights, stats


def gap_distribution(old_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Counts of valid tokens whose |log pi_old - log mu| exceeds each of :data:`GAP_THRESHOLDS`
    (``gap_over_<t>``), and the largest per-completion |sum_t gap| (``sequence_gap_max``)."""
    valid = mask.bool()
    gap = torch.where(valid, old_logprobs.detach().float() - engine_logprobs.float(), 0.0)
    out = {f"gap_over_{t:g}": (gap.abs() > t).sum() for t in GAP_THRESHOLDS}
    out["sequence_gap_max"] = gap.sum(dim=-1).abs().max() if gap.numel() else torch.zeros(())
    return out
