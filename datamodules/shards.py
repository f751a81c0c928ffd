"""Reading WebDataset shards: resolving shard specs (paths, brace patterns, globs) into shard paths.

A shard set is a folder of plain tar files named ``{split}-{index:05d}.tar`` plus a
``dataset.json`` manifest; writing them is offline work (:mod:`datatools.shard_writer`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from braceexpand import braceexpand

_GLOB_CHARS = frozenset("*?[")


def _is_url(spec: str) -> bool:
    # WebDataset also reads "pipe:cmd" and remote URLs; their existence cannot be checked here.
    return spec.startswith("pipe:") or "://" in spec


def resolve_shards(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Expand shard specs into an ordered list of existing shard paths.

    A spec is a path, a brace pattern (``data/train-{00000..00003}.tar``), a glob
    (``data/train-*.tar``; matches are sorted) or a list of those, expanded in order.
    ``pipe:`` commands and URLs (``s3://...``) pass through unchecked.

    Raises:
        ValueError: the spec is empty.
        FileNotFoundError: a path does not exist or a glob matches nothing; the message
            names the offending path and the spec it came from.
    """
    specs = [spec] if isinstance(spec, str | os.PathLike) else list(spec)
    specs = [str(s).strip() for s in specs]
    if not specs or not all(specs):
        raise ValueError(f"empty shard spec {spec!r}: give shard paths, a brace pattern or a glob")
    shards: list[str] = []
    for item in specs:
        for expanded in braceexpand(item):
            if _is_url(expanded):
                shards.append(expanded)
                continue
            path = os.path.expanduser(expanded)
            if _GLOB_CHARS & set(path):
                matches = sorted(glob.glob(path))
                if not matches:
                    raise FileNotFoundError(f"no shard matches the glob {path!r} (from shard spec {item!r})")
                shards.extend(matches)
            elif os.path.isdir(path):
                raise FileNotFoundError(
                    f"shard spec {item!r} names the folder {path!r}; give shards, e.g. {path}/train-*.tar"
                )
            elif not os.path.exists(path):
                raise FileNotFoundError(f"shard {path!r} does not exist (from shard spec {item!r})")
            else:
                shards.append(path)
    return shards
