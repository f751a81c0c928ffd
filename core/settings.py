"""YAML blocks of settings as frozen dataclasses: one reading for every optional ``block: {...}``.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Shaping:
...     buffer: int
...     penalty: float = 1.0
>>> settings_block(Shaping, {"buffer": 4}, "overlong")
Shaping(buffer=4, penalty=1.0)
>>> settings_block(Shaping, {"bufer": 4}, "overlong")
Traceback (most recent call last):
ValueError: overlong: unknown settings ['bufer']; known: ['buffer', 'penalty']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def settings_block(cls: type[T], value: T | Mapping[str, Any] | None, name: str) -> T | None:
    """``value`` (a mapping from YAML, an instance, or None for "off") as a ``cls`` dataclass; a key
    ``cls`` does not have is an error naming the block and the keys it knows (a typo must not
    silently fall back to a default)."""
    if value is None or isinstance(value, cls):
        return value
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{name}: unknown settings {unknown}; known: {sorted(known)}")
    return cls(**value)
