"""Group-relative advantage estimators (GRPO, Dr.GRPO, RLOO) and DAPO-style group filtering.

Grouping convention (used by every function here): ``rewards`` is a 1-D tensor of length
``num_prompts * group_size`` whose consecutive rows form a group, i.e. rows
``[k * G, (k + 1) * G)`` are the G completions of prompt k. That is the order a rollout engine
returns ``n = G`` samples per request in, so no group ids are carried around.

All functions compute in float32 (rewards may arrive in any float dtype) and return one
advantage per completion, shape ``(batch,)``. Broadcast it over the completion's tokens in
the loss (``models.rl.losses.policy_loss`` accepts it as is).

Constant groups: a group whose G rewards are all equal carries no learning signal, and every
estimator here gives each of its rows an advantage of exactly 0, in every input dtype. The
formulas alone do not guarantee that in floating point: the float32 mean of eight 0.9 is one
ulp away from 0.9, so r - mean is about 6e-8 instead of 0, and GRPO divides that by a std of
the same size (+ eps) to get -0.056. The estimators therefore detect constant groups exactly
(max == min, the test :func:`zero_variance_groups` uses) and set their advantages to 0; every
other group goes through its formula unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "dr_grpo_advantages",
    "grpo_advantages",
    "rloo_advantages",
    "zero_variance_groups",
    "zero_variance_rows",
]


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """View ``rewards`` (batch,) as (num_groups, group_size) in float32, checking the shape."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (batch,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards are not a whole number of groups of {group_size}")
    return rewards.float().view(-1, group_size)


def _zero_constant_groups(grouped: Tensor, advantages: Tensor) -> Tensor:
    """``advantages`` (num_groups, G) flattened to (batch,), with exactly 0 on every row of a
    group whose rewards are all equal (see the module docstring for why rounding needs this)."""
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(advantages), advantages).view(-1)


def grpo_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6, unbiased: bool = False) -> Tensor:
    """GRPO outcome advantage: the reward standardised within its group.

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)

    where mean_g and std_g run over the G rewards of completion i's group.

    Choice of std: by default the population std, std_g = sqrt(mean_g((r - mean_g r)^2))
    (``unbiased=False``). The group is the whole set being normalised, not a sample from which
    a larger population's spread is estimated, and with this choice every non-constant group
    has advantages of mean 0 and mean square exactly 1, whatever G is; it is also defined for
    G = 1 (advantage 0). verl and TRL use ``torch.std`` (Bessel-corrected, divides by G - 1);
    their advantages are ours times sqrt((G - 1) / G) (0.894 at G = 5, 0.935 at G = 8), a
    constant factor an optimizer's learning rate absorbs. Pass ``unbiased=True`` to reproduce
    them exactly.

    A group whose rewards are all equal gets advantage exactly 0 (in exact arithmetic the
    numerator is 0 and the denominator eps; in floating point the group is detected with
    max == min, because a rounded mean would leave a numerator of about one ulp that the
    equally tiny std amplifies).
    """
    grouped = _grouped(rewards, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    if unbiased and group_size == 1:
        raise ValueError("the Bessel-corrected std needs group_size >= 2")
    std = grouped.std(dim=1, keepdim=True, unbiased=unbiased)
    return _zero_constant_groups(grouped, (grouped - mean) / (std + eps))


def dr_grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """Dr.GRPO advantage: the reward minus its group mean, with no std division.

        A_i = r_i - mean_g(r)

    Dr.GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training") drops the std because
    it up-weights groups that are nearly all right or all wrong (a question-difficulty bias).
    Pair it with the ``seq_mean_token_sum`` aggregation to also drop the length bias.
    A group whose rewards are all equal gets exactly 0 (not the mean's rounding error).
    """
    grouped = _grouped(rewards, group_size)
    return _zero_constant_groups(grouped, grouped - grouped.mean(dim=1, keepdim=True))


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO (REINFORCE leave-one-out) advantage: the reward minus the mean of the other G - 1.

        A_i = r_i - (sum_g(r) - r_i) / (G - 1)  =  G / (G - 1) * (r_i - mean_g(r))

    The baseline of completion i does not depend on i's own sample, so the estimator is
    unbiased. Needs G >= 2. A group whose rewards are all equal gets exactly 0 (not the
    rounding error of the leave-one-out sums).
    """
    if group_size < 2:
        raise ValueError("RLOO needs at least two completions per group")
    grouped = _grouped(rewards, group_size)
    others_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    return _zero_constant_groups(grouped, grouped - others_mean)


def zero_variance_groups(rewards: Tensor, group_size: int, atol: float = 0.0) -> Tensor:
    """Which groups carry no learning signal: all G rewards equal (max - min <= atol).

    Returns a bool tensor of shape ``(num_groups,)``, True for a zero-variance group. Every
    group-relative estimator above gives such a group advantage 0, so its completions only
    dilute the loss; DAPO's "dynamic sampling" drops them (and refills the batch). DAPO's
    criterion is on accuracy (mean accuracy 0 or 1): pass the accuracy rewards here to get
    exactly that, or the total reward to drop only groups whose total is constant.
    """
    grouped = _grouped(rewards, group_size)
    spread = grouped.max(dim=1).values - grouped.min(dim=1).values
    return spread <= atol


def zero_variance_rows(rewards: Tensor, group_size: int, atol: float = 0.0) -> Tensor:
    """Row-level version of :func:`zero_variance_groups`: bool ``(batch,)``, True for every
    completion of a zero-variance group. ``mask * ~zero_variance_rows(...)[:, None]`` removes
    those rows from the loss (the losses handle all-zero mask rows without NaN)."""
    return zero_variance_groups(rewards, group_size, atol).repeat_interleave(group_size)


AdvantageEstimator = Callable[[Tensor, int], Tensor]
"""``(rewards (batch,), group_size) -> advantages (batch,)`` over consecutive-row groups."""

ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
}
"""Advantage estimators by the name a YAML config selects them with."""
