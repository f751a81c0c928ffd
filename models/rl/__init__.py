"""The math of GRPO-family RL as pure tensor functions: group advantages and policy losses.

Groups are consecutive rows: completions ``[k * G, (k + 1) * G)`` answer prompt k.
"""

from models.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    dr_grpo_advantages,
    grpo_advantages,
    rloo_advantages,
    zero_variance_groups,
    zero_variance_rows,
)
from models.rl.losses import aggregate_loss, kl_penalty, policy_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "aggregate_loss",
    "dr_grpo_advantages",
    "grpo_advantages",
    "kl_penalty",
    "policy_loss",
    "rloo_advantages",
    "zero_variance_groups",
    "zero_variance_rows",
]
