"""Per-rank state gathered into rank 0's checkpoint, across two real gloo processes.

Each rank holds its own RNG states and its own stream position; rank 0 writes the one
checkpoint file, so both must arrive there under the right rank, and each rank must get its
own back on resume.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks

from callbacks.checkpoint import RunCheckpoint
from parallel.collectives import gather_from_all_ranks

WORLD_SIZE = 2


def _gather(rank: int, store_path: str, out_dir: str) -> None:
    store = dist.FileStore(store_path, WORLD_SIZE)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(100 + rank)
    own_torch_state = torch.get_rng_state()
    objects = gather_from_all_ranks({"rank": rank, "position": 10 * rank + 3})
    checkpoint_state = RunCheckpoint().state_dict()
    saved = checkpoint_state["rng_states"]
    torch.rand(5)  # move this rank's generator on, as training would
    RunCheckpoint().load_state_dict(checkpoint_state)
    restored = torch.equal(torch.get_rng_state(), own_torch_state)
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "objects": objects,
                "saved_states_match": [torch.equal(s["torch"], own_torch_state) for s in saved],
                "restored_own_state": restored,
            }
        )
    )
    dist.destroy_process_group()


def test_every_rank_state_reaches_every_rank_in_rank_order(tmp_path: Path) -> None:
    spawn_ranks(_gather, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD_SIZE)
    for rank in range(WORLD_SIZE):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["objects"] == [{"rank": r, "position": 10 * r + 3} for r in range(WORLD_SIZE)]
        # Seeds differ per rank, so only this rank's slot holds its own state.
        assert result["saved_states_match"] == [r == rank for r in range(WORLD_SIZE)]
        assert result["restored_own_state"]


def test_without_a_process_group_the_state_is_this_process_alone() -> None:
    assert gather_from_all_ranks({"position": 7}) == [{"position": 7}]
