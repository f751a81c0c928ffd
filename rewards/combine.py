"""The weighted sum of the configured reward functions, with each function's scores kept for logging.

A YAML config selects rewards by name and weight::

    rewards:
      - {name: accuracy, weight: 0.9}
      - {name: format, weight: 0.1}

A weight of 0 computes and logs a reward without training on it.

>>> breakdown = compute_rewards(
...     default_reward_specs(),
...     ["<think>x</think><answer>B</answer>", "<answer>B</answer>", "<think>x</think><answer>A</answer>"],
...     {"answer": ["B", "B", "B"], "problem_type": ["multiple choice"] * 3},
... )
>>> [round(t, 6) for t in breakdown.total]
[1.0, 0.9, 0.1]
>>> breakdown.per_function
{'accuracy': [1.0, 1.0, 0.0], 'format': [1.0, 0.0, 1.0]}
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewards.registry import RewardFunction, get_reward


class RewardError(RuntimeError):
    """Scoring failed: a reward function raised or returned bad values, or the inputs disagree.

    The message names the reward function or the field at fault; an exception raised by a
    reward function is chained as ``__cause__``.
    """


@dataclass
class RewardSpec:
    """One reward function selected by its registered name, with its weight in the total."""

    name: str
    """A name from :func:`rewards.registry.available_rewards`."""
    weight: float
    """Factor of this reward in the total; 0 logs it without training on it."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments bound to the function, e.g. ``{rel_tol: 1e-3}`` for numeric accuracy."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("a reward spec needs a non-empty name")
        if not math.isfinite(self.weight):
            raise ValueError(f"reward {self.name!r} has a non-finite weight {self.weight}")

    def function(self) -> RewardFunction:
        """The registered function with :attr:`kwargs` bound (``KeyError`` for an unknown name)."""
        fn = get_reward(self.name)
        return functools.partial(fn, **self.kwargs) if self.kwargs else fn


def default_reward_specs() -> list[RewardSpec]:
    """The paper's reward: ``0.9 * accuracy + 0.1 * format``."""
    return [RewardSpec("accuracy", 0.9), RewardSpec("format", 0.1)]


@dataclass
class RewardBreakdown:
    """Scores of one batch of completions."""

    total: list[float]
    """Weighted sum over the reward functions, one per completion."""
    per_function: dict[str, list[float]]
    """Unweighted scores of each reward function, by name, one per completion."""

    def summary(self, prefix: str = "reward/") -> dict[str, float]:
        """Mean and population standard deviation of the total and of each function, for logging.

        >>> RewardBreakdown([1.0, 0.0], {"format": [1.0, 1.0]}).summary(prefix="")
        {'total/mean': 0.5, 'total/std': 0.5, 'format/mean': 1.0, 'format/std': 0.0}
        """
        out: dict[str, float] = {}
        for name, values in {"total": self.total, **self.per_function}.items():
            if values:
                out[f"{prefix}{name}/mean"] = statistics.fmean(values)
                out[f"{prefix}{name}/std"] = statistics.pstdev(values)
        return out


def check_specs(specs: Sequence[RewardSpec]) -> list[RewardFunction]:
    """The functions of ``specs``; raises ``RewardError`` for no spec, an unknown or repeated name.

    Call it when a run starts, so that a typo in the config fails before the first rollout.
    """
    if not specs:
        raise RewardError("no reward functions configured")
    names = [spec.name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        # Scores are logged by name; two specs with one name would overwrite each other.
        raise RewardError(f"reward functions configured more than once: {', '.join(repeated)}")
    try:
        return [spec.function() for spec in specs]
    except KeyError as error:
        raise RewardError(error.args[0]) from error


def _check_fields(num_completions: int, fields: Mapping[str, Sequence[Any]]) -> None:
    for name, values in fields.items():
        if isinstance(values, str) or not isinstance(values, Sequence):
            raise RewardError(
                f"sample field {name!r} must be a list with one value per completion, "
                f"got {type(values).__name__}"
            )
        if len(values) != num_completions:
            raise RewardError(
                f"sample field {name!r} has {len(values)} values for {num_completions} completions"
            )


def _sample_name(fields: Mapping[str, Any], index: int) -> str:
    key = fields.get("key")
    return f"completion {index} (sample {key[index]!r})" if key is not None else f"completion {index}"


def _first_failing(fn: RewardFunction, completions: list[str], fields: Mapping[str, Any]) -> int | None:
    # The batch call raised: score one completion at a time to name the sample at fault.
    for index in range(len(completions)):
        try:
            fn(completions[index : index + 1], **{k: v[index : index + 1] for k, v in fields.items()})
        except Exception:
            return index
    return None


def _call(name: str, fn: RewardFunction, completions: list[str], fields: Mapping[str, Any]) -> list[float]:
    try:
        raw = fn(completions, **fields)
    except Exception as error:
        index = _first_failing(fn, completions, fields)
        where = f" on {_sample_name(fields, index)}" if index is not None else ""
        raise RewardError(
            f"reward function {name!r} raised {type(error).__name__}{where}: {error}"
        ) from error
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise RewardError(f"reward function {name!r} returned {type(raw).__name__}, not a list of floats")
    if len(raw) != len(completions):
        raise RewardError(
            f"reward function {name!r} returned {len(raw)} values for {len(completions)} completions"
        )
    values = []
    for index, value in enumerate(raw):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise RewardError(
                f"reward function {name!r} returned {value!r} for {_sample_name(fields, index)}, "
                "expected a float"
            ) from None
        if not math.isfinite(number):
            raise RewardError(f"reward function {name!r} returned {number} for {_sample_name(fields, index)}")
        values.append(number)
    return values


def compute_rewards(
    specs: Sequence[RewardSpec], completions: Sequence[str], fields: Mapping[str, Sequence[Any]]
) -> RewardBreakdown:
    """Score ``completions`` with every spec's function and sum the scores with the spec weights.

    ``fields`` holds the sample fields as per-completion lists (``answer``, ``options``,
    ``problem_type``, ``category``, ...), each as long as ``completions``; every function gets
    all of them as keyword arguments. Raises :class:`RewardError` naming the field or the
    function at fault.
    """
    functions = check_specs(specs)
    completions = list(completions)
    _check_fields(len(completions), fields)
    total = [0.0] * len(completions)
    per_function: dict[str, list[float]] = {}
    for spec, fn in zip(specs, functions, strict=True):
        values = _call(spec.name, fn, completions, fields)
        per_function[spec.name] = values
        total = [t + spec.weight * v for t, v in zip(total, values, strict=True)]
    return RewardBreakdown(total=total, per_function=per_function)
