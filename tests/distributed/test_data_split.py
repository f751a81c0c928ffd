"""Shard splitting across real processes: data-parallel ranks x dataloader workers.

Four processes form a 2 (data-parallel) x 2 (sequence-parallel) grid, each with 2 dataloader
workers. Every sample must reach exactly one data-parallel rank per epoch, and the two
sequence-parallel peers of a rank must receive the same samples, in the same order, with the
same frames.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks

from datamodules.shards import resolve_shards
from datamodules.stream import EpochAwareDataLoader, VideoQAStream, data_parallel_coordinates

WORLD_SIZE, SEQUENCE_PARALLEL = 4, 2


def _first(sample):
    return sample


def _list_samples(rank: int, shards: list[str], store_path: str, out_dir: str) -> None:
    store = dist.FileStore(store_path, WORLD_SIZE)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD_SIZE)
    dp_rank, dp_size = data_parallel_coordinates(dist.get_rank(), dist.get_world_size(), SEQUENCE_PARALLEL)
    stream = VideoQAStream(
        shards,
        num_frames=8,
        max_pixels=56 * 56,
        data_parallel_rank=dp_rank,
        data_parallel_size=dp_size,
        shuffle=True,
        shuffle_buffer=4,
        seed=3,
    )
    # Workers fork from the rank process (as under Lightning); spawning them would only add start-up time.
    epochs = []
    for epoch in range(2):
        loader = EpochAwareDataLoader(
            stream,
            epoch_fn=lambda e=epoch: e,
            batch_size=None,
            num_workers=2,
            collate_fn=_first,
            multiprocessing_context="fork",
        )
        epochs.append([[s.key, hashlib.sha1(s.video.frames.tobytes()).hexdigest()] for s in loader])
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"dp_rank": dp_rank, "epochs": epochs}))
    dist.barrier()
    dist.destroy_process_group()


def test_every_sample_once_per_epoch_and_peers_identical(synth_dir: Path, tmp_path: Path) -> None:
    shards = resolve_shards(str(synth_dir / "train-*.tar"))
    assert len(shards) == 6
    spawn_ranks(_list_samples, args=(shards, str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD_SIZE)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    assert [r["dp_rank"] for r in results] == [0, 0, 1, 1]
    for epoch in range(2):
        per_rank = [[key for key, _ in r["epochs"][epoch]] for r in results]
        # Sequence-parallel peers: same samples, same order, same decoded frames.
        assert results[0]["epochs"][epoch] == results[1]["epochs"][epoch]
        assert results[2]["epochs"][epoch] == results[3]["epochs"][epoch]
        # Data-parallel ranks: disjoint, and together every sample exactly once.
        seen = per_rank[0] + per_rank[2]
        assert len(seen) == 24 and len(set(seen)) == 24
        assert set(per_rank[0]).isdisjoint(per_rank[2])
    # A new epoch reshuffles (same samples, another order).
    assert [k for k, _ in results[0]["epochs"][0]] != [k for k, _ in results[0]["epochs"][1]]
    assert torch.distributed.is_available()
