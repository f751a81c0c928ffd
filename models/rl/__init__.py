"""The math of GRPO-family policy updates as pure tensor functions: the losses.

Groups are consecutive rows: completions ``[k * G, (k + 1) * G)`` answer prompt k. The group
advantages they take are computed where experience is produced: :mod:`rollout.advantages`.
"""

from models.rl.losses import aggregate_loss, kl_penalty, policy_loss

__all__ = ["aggregate_loss", "kl_penalty", "policy_loss"]
