"""What a rank needs to know about its part of a sequence split across a process group."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

ATTENTION_KINDS = ("ulysses", "ring")
LAYOUTS = ("zigzag", "contiguous")


def held_positions(length: int, rank: int, size: int, layout: str) -> torch.Tensor:
    """The positions of a ``length``-long row that ``rank`` of ``size`` holds, in its local order.

    ``contiguous``: slice ``rank`` of ``size`` equal slices. ``zigzag``: the row is cut into
    ``2 * size`` equal chunks and rank r holds chunks r and ``2 * size - 1 - r``, so that under
    the causal mask every rank attends to the same number of earlier positions (with contiguous
    slices the last rank's queries see the whole row, the first rank's only its own slice).

    >>> held_positions(8, 0, 2, "contiguous").tolist(), held_positions(8, 1, 2, "contiguous").tolist()
    ([0, 1, 2, 3], [4, 5, 6, 7])
    >>> held_positions(8, 0, 2, "zigzag").tolist(), held_positions(8, 1, 2, "zigzag").tolist()
    ([0, 1, 6, 7], [2, 3, 4, 5])
    """
    if layout not in LAYOUTS:
        raise ValueError(f"sequence layout must be one of {LAYOUTS}, got {layout!r}")
    parts = 2 * size if layout == "zigzag" else size
    if length % parts:
        raise ValueError(f"a row of {length} positions does not cut into {parts} equal {layout} chunks")
    if layout == "contiguous":
        width = length // size
        return torch.arange(rank * width, (rank + 1) * width)
    chunk = length // parts
    first, second = rank * chunk, (parts - 1 - rank) * chunk
    return torch.cat([torch.arange(first, first + chunk), torch.arange(second, second + chunk)])


@dataclass(frozen=True)
class SequenceShard:
    """This rank's part of every row of a sequence split across ``group``.

    Ulysses holds contiguous slices (its all-to-all hands every rank the whole sequence in
    order). Ring attention holds the ``zigzag`` layout by default (:func:`held_positions`:
    balanced causal work); ``ring_layout="contiguous"`` keeps plain slices, for comparison.
    Rows are right-padded (real tokens first), so the causal mask alone keeps every real query
    away from padding keys, in either layout; the padding queries' outputs are never read.
    """

    group: dist.ProcessGroup
    attention: str
    """``ulysses`` (all-to-all over heads) or ``ring`` (key/value blocks passed around)."""
    ring_layout: str = "zigzag"
    """The positions ring attention gives each rank: ``zigzag`` (balanced) or ``contiguous``."""
    exchange_group: dist.ProcessGroup | None = None
    """The same ranks as a group of their own, for the rollout's exchanges
    (:func:`parallel.mesh.sequence_exchange_group`); None: ``group``."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(
                f"sequence-parallel attention must be one of {ATTENTION_KINDS}, got {self.attention!r}"
            )
        if self.ring_layout not in LAYOUTS:
            raise ValueError(f"ring layout must be one of {LAYOUTS}, got {self.ring_layout!r}")

    @property
    def rollout_group(self) -> dist.ProcessGroup:
        """Where peers share out a rollout's requests (its exchanges may be left waiting by a hung engine)."""
        return self.group if self.exchange_group is None else self.exchange_group

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def layout(self) -> str:
        """``zigzag`` or ``contiguous``: how this shard's attention lays positions over the ranks."""
        return self.ring_layout if self.attention == "ring" else "contiguous"

    @property
    def length_multiple(self) -> int:
        """Row widths that split into this layout's equal parts are multiples of this."""
        return 2 * self.size if self.layout == "zigzag" else self.size

    def positions(self, length: int, rank: int | None = None) -> torch.Tensor:
        """The positions of a ``length``-long row that ``rank`` (default: this rank) holds, in local order."""
        return held_positions(length, self.rank if rank is None else rank, self.size, self.layout)

    def global_rank(self, group_rank: int) -> int:
        """The global rank of the group's ``group_rank``-th member (what point-to-point ops take)."""
        return dist.get_global_rank(self.group, group_rank)
