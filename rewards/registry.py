"""Reward functions by name, so that a YAML config can select them (``name: accuracy``).

The built-in functions live in :mod:`rewards.functions` and register themselves when that
module is imported; the look-ups below import it first, so callers never have to.

>>> from rewards.registry import available_rewards, get_reward
>>> {"format", "accuracy"} <= set(available_rewards())
True
>>> get_reward("format")(["<think>x</think><answer>B</answer>"])
[1.0]
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

RewardFunction = Callable[..., list[float]]
"""``fn(completions: Sequence[str], **sample_fields) -> list[float]``, one score per completion."""

SAMPLE_FIELDS = ("key", "problem", "answer", "options", "problem_type", "category", "reasoning")
"""The per-completion fields the RL rollout hands every reward function (as keyword lists)."""

_F = TypeVar("_F", bound=RewardFunction)
_REGISTRY: dict[str, RewardFunction] = {}


def _qualified_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _same_definition(a: Any, b: Any) -> bool:
    # Compared by the last module component and the qualified name, so that one file imported
    # under two module names (``rewards.functions`` and ``functions``, as doctest runners do)
    # or reloaded is recognised as the same definition.
    def key(fn: Any) -> tuple[str, str]:
        return str(getattr(fn, "__module__", "")).rsplit(".", 1)[-1], str(getattr(fn, "__qualname__", id(fn)))

    return a is b or key(a) == key(b)


def register(name: str) -> Callable[[_F], _F]:
    """Decorator that registers a reward function under ``name`` and returns it unchanged.

    Registering a different function under a taken name is an error (a silent override
    would change what an existing config trains on). Re-registering the same function, as
    happens when its module is reloaded, replaces the entry.

    >>> @register("doctest_constant")
    ... def constant(completions, **_):
    ...     return [0.5 for _ in completions]
    >>> get_reward("doctest_constant")(["a", "b"])
    [0.5, 0.5]
    >>> _ = _REGISTRY.pop("doctest_constant")  # keep the registry as it was
    """
    if not name or not name.strip():
        raise ValueError("a reward function needs a non-empty name")

    def decorator(fn: _F) -> _F:
        existing = _REGISTRY.get(name)
        if existing is not None and not _same_definition(existing, fn):
            raise ValueError(
                f"reward name {name!r} is already registered to {_qualified_name(existing)}; "
                f"cannot register {_qualified_name(fn)} under it"
            )
        _REGISTRY[name] = fn
        return fn

    return decorator


def _load_builtins() -> None:
    # Imported lazily: these modules import this one to register their functions.
    for module in ("rewards.functions", "rewards.judge", "rewards.zoom"):
        importlib.import_module(module)


def available_rewards() -> list[str]:
    """Names of all registered reward functions, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def get_reward(name: str) -> RewardFunction:
    """The reward function registered under ``name``.

    An unknown name raises ``KeyError`` listing the names that do exist:

    >>> try:
    ...     get_reward("no_such_reward")
    ... except KeyError as error:
    ...     message = error.args[0]
    >>> message.split(";")[0], "format" in message.split(";")[1]
    ("unknown reward function 'no_such_reward'", True)
    """
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        available = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"unknown reward function {name!r}; available: {available}") from None
