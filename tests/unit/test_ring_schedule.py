"""Ring attention's layouts and schedule: which positions a rank holds, which products it computes.

The schedule decides what :mod:`parallel.ring` computes (forward and backward read it), so it
is checked here against the causal mask pair by pair: over the ring steps, every rank computes
each (query, key) pair the causal mask allows for its queries exactly once, and no other. The
work per rank is the schedule's count of query x key scores; the real processes' count is
checked in ``tests/distributed/test_sequence_parallel.py``.
"""

from __future__ import annotations

import pytest
import torch

from parallel.ring import ring_schedule
from parallel.shard import LAYOUTS, held_positions

SIZES = (1, 2, 3, 4, 8)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", SIZES)
def test_every_position_is_held_once(layout: str, size: int) -> None:
    length = 2 * size * 3
    held = torch.cat([held_positions(length, rank, size, layout) for rank in range(size)])
    assert sorted(held.tolist()) == list(range(length))
    for rank in range(size):
        mine = held_positions(length, rank, size, layout)
        assert len(mine) == length // size
        # Increasing global order within a rank: the local causal mask is the global one.
        assert torch.all(mine[1:] > mine[:-1])


def test_zigzag_holds_chunks_r_and_mirror() -> None:
    assert held_positions(16, 1, 4, "zigzag").tolist() == [2, 3, 12, 13]
    assert held_positions(16, 3, 4, "zigzag").tolist() == [6, 7, 8, 9]
    with pytest.raises(ValueError, match="does not cut into 8 equal zigzag chunks"):
        held_positions(12, 0, 4, "zigzag")


def computed_pairs(rank: int, size: int, length: int, layout: str) -> list[tuple[int, int]]:
    """Every (global query, global key) pair ``rank`` scores, over all ring steps."""
    queries = held_positions(length, rank, size, layout).tolist()
    pairs = []
    for step, blocks in enumerate(ring_schedule(rank, size, length // size, layout)):
        keys = held_positions(length, (rank - step) % size, size, layout).tolist()
        for block in blocks:
            for i in range(block.queries.start, block.queries.stop):
                for j in range(block.keys.start, block.keys.stop):
                    if block.causal and j - block.keys.start > i - block.queries.start:
                        continue  # masked inside a causal block
                    pairs.append((queries[i], keys[j]))
    return pairs


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", SIZES)
def test_schedule_computes_exactly_the_causal_pairs(layout: str, size: int) -> None:
    length = 2 * size * 3
    for rank in range(size):
        pairs = computed_pairs(rank, size, length, layout)
        assert len(pairs) == len(set(pairs)), "a pair scored twice would be counted twice by the softmax"
        causal = {(q, k) for q in held_positions(length, rank, size, layout).tolist() for k in range(q + 1)}
        assert set(pairs) == causal


def score_entries(rank: int, size: int, length: int, layout: str) -> int:
    return sum(block.score_entries for step in ring_schedule(rank, size, length, layout) for block in step)


@pytest.mark.parametrize("size", (2, 3, 4, 8))
def test_zigzag_balances_the_work_contiguous_does_not(size: int) -> None:
    length = 64  # positions per rank
    zigzag = [score_entries(rank, size, length, "zigzag") for rank in range(size)]
    contiguous = [score_entries(rank, size, length, "contiguous") for rank in range(size)]
    assert len(set(zigzag)) == 1
    # Contiguous: rank r scores r + 1 whole blocks (the own one masked, but computed).
    assert contiguous == [(rank + 1) * length**2 for rank in range(size)]
    assert contiguous[-1] == size * contiguous[0]
    # Zigzag's own block is three quarter-products (the fourth is all in the future), each other
    # block a half-product: (2P + 1) quarters per rank, (2P + 1) / 4P of the contiguous last rank's.
    assert zigzag[0] == (2 * size + 1) * (length // 2) ** 2
    assert 4 * size * max(zigzag) == (2 * size + 1) * max(contiguous)
