"""Small collectives shared by callbacks and data modules."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


def gather_from_all_ranks(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by global rank; ``[obj]`` when no process group is running.

    Used for state that each rank holds but only rank 0 writes to the checkpoint (data stream
    positions, RNG states): every rank must call it, as for any collective.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered
