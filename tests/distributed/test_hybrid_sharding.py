"""Hybrid sharding (HSDP: replicated across 2 "nodes", sharded within each) equals one process.

``sharding: hybrid`` shards over a ``(replicate, shard)`` mesh; the strategy builds it from
``trainer.num_nodes``, which one machine cannot vary, so this drives
:func:`parallel.sharding.shard_model` directly on a 2 x 2 mesh of 4 gloo processes: each rank
takes a quarter of the rows, its loss normalised by the whole batch's token count, and the
gradients (summed by FSDP within a node and across nodes) must equal the one-process gradients
of the whole batch.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from helpers.tolerances import GRADIENT_ULPS, assert_float32_close

from models.loading import load_model
from models.vision import decoder_blocks, vision_tower
from parallel.sharding import ShardingLayout, ShardingSettings, full_tensor, run_sharded, shard_model

WORLD = 4
ROWS = 8


def rows() -> torch.Tensor:
    return torch.randint(10, 300, (ROWS, 20), generator=torch.Generator().manual_seed(0))


def summed_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Token-summed cross-entropy of next-token prediction, divided by the whole batch's tokens."""
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    total = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
    )
    return total / (ROWS * (ids.shape[1] - 1))


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: full_tensor(p.grad).clone() for name, p in model.named_parameters() if p.grad is not None}


def _worker(rank: int, model_dir: str, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(tmp + "/store", WORLD), rank=rank, world_size=WORLD)
    from torch.distributed.device_mesh import init_device_mesh

    model = load_model(model_dir)
    vision_tower(model).requires_grad_(False)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    layout = ShardingLayout(model, decoder_blocks(model), kept_whole=(vision_tower(model),))
    scope = shard_model(layout, mesh, ShardingSettings(param_dtype="float32"))
    share = rows()[rank * ROWS // WORLD : (rank + 1) * ROWS // WORLD]
    run_sharded(scope, lambda: summed_loss(model, share)).backward()
    grads = gradients(model)  # (a collective: every rank)
    if rank == 0:
        torch.save(grads, Path(tmp) / "hybrid.pt")
    dist.destroy_process_group()


def test_hybrid_sharding_sums_gradients_like_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = load_model(tiny_model_dir)
    vision_tower(model).requires_grad_(False)
    summed_loss(model, rows()).backward()
    expected = gradients(model)
    spawn_ranks(_worker, args=(str(tiny_model_dir), str(tmp_path)), nprocs=WORLD)
    got = torch.load(tmp_path / "hybrid.pt")
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        assert_float32_close(got[name], grad, ulps=GRADIENT_ULPS, reason=f"{name}: HSDP 2 x 2 vs one process")
