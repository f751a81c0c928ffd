"""Length shaping of rollouts: DAPO's soft overlong penalty, and which truncated completions train.

A completion that runs out of its token budget (``finish_reason == "length"``) has no answer
the reward can read, so a plain outcome reward scores it like a wrong answer, and the policy
learns nothing about *why*. DAPO (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale", section 3.4) offers two remedies, both here:

- **Soft overlong punishment**: with budget L_max and a buffer of L_cache tokens before it,
  a completion of |y| tokens gets, added to its reward,

      0                                  |y| <= L_max - L_cache
      ((L_max - L_cache) - |y|) / L_cache    L_max - L_cache < |y| <= L_max
      -1                                 |y| > L_max

  times ``penalty`` (a linear ramp from 0 to -penalty over the buffer). The engine never
  exceeds L_max, so the last case is the ramp's end, reached by a completion that used the
  whole budget.
- **Overlong filtering**: truncated completions are left out of the loss (their group's
  advantages are still computed with them, so the others' are unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.settings import settings_block


@dataclass(frozen=True)
class OverlongShaping:
    """The ``overlong:`` block of the rollout callback.

    Attributes:
        buffer: L_cache, the tokens before the budget over which the penalty ramps up.
        penalty: the penalty at the end of the ramp (DAPO uses 1.0, the scale of its reward).
    """

    buffer: int
    penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.buffer < 1:
            raise ValueError(f"overlong.buffer must be at least 1 token, got {self.buffer}")
        if self.penalty < 0:
            raise ValueError(f"overlong.penalty must be >= 0, got {self.penalty}")

    @classmethod
    def of(cls, value: OverlongShaping | Mapping[str, Any] | None) -> OverlongShaping | None:
        return settings_block(cls, value, "overlong")

    def check_budget(self, max_new_tokens: int) -> None:
        if self.buffer >= max_new_tokens:
            raise ValueError(
                f"overlong.buffer={self.buffer} must be below max_new_tokens={max_new_tokens}: the "
                "penalty would start before the first token"
            )


def overlong_penalties(lengths: Sequence[int], max_new_tokens: int, shaping: OverlongShaping) -> list[float]:
    """DAPO's soft overlong penalty of each completion length (<= 0; see the module docstring).

    >>> overlong_penalties([10, 12, 14, 16, 17], 16, OverlongShaping(buffer=4))
    [0.0, 0.0, -0.5, -1.0, -1.0]
    """
    start = max_new_tokens - shaping.buffer
    out = []
    for length in lengths:
        if length <= start:
            out.append(0.0)
        elif length <= max_new_tokens:
            out.append(shaping.penalty * (start - length) / shaping.buffer)
        else:
            out.append(-shaping.penalty)
    return out
