"""What a rank needs to know about its slice of a sequence split across a process group."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

ATTENTION_KINDS = ("ulysses", "ring")


@dataclass(frozen=True)
class SequenceShard:
    """Rank ``rank`` of ``size`` holds tokens ``[rank * length, (rank + 1) * length)`` of every row.

    Rows are right-padded (real tokens first), so the causal mask alone keeps every real query
    away from padding keys; the padding queries' outputs are never read.
    """

    group: dist.ProcessGroup
    attention: str
    """``ulysses`` (all-to-all over heads) or ``ring`` (key/value blocks passed around)."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"sequence-parallel attention must be one of {ATTENTION_KINDS}, got {self.attention!r}"
            )

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    def global_rank(self, group_rank: int) -> int:
        """The global rank of the group's ``group_rank``-th member (what point-to-point ops take)."""
        return dist.get_global_rank(self.group, group_rank)
