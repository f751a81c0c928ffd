"""fp32 master weights: at RL's learning rate, bf16 weights barely move; the sharded model's do.

Ten AdamW steps at lr 1e-6 on the tiny model, one gloo process: the model sharded as the
strategy shards it (fp32 parameters and optimizer states, blocks computing in bf16) against the
model cast to bf16 (``precision: bf16-true``: AdamW updates the bf16 weights themselves). A
weight of magnitude ~0.02 has a bf16 spacing of ~1.2e-4, so an update of ~1e-6 per step rounds
back to the same bf16 value unless the weight is tiny; the fp32 master keeps every update.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks

from models.loading import load_model
from models.vision import decoder_blocks, vision_tower
from parallel.sharding import ShardingLayout, ShardingSettings, full_tensor, run_sharded, shard_model

STEPS = 10
LEARNING_RATE = 1e-6


def _loss(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(10, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def changed_fraction(model: torch.nn.Module, train: Callable[[], torch.Tensor]) -> float:
    """Fraction of the language model's weights that differ after ``STEPS`` AdamW steps (all but
    the input embeddings, whose rows of tokens absent from the batch get no gradient)."""
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=LEARNING_RATE,
        betas=(0.9, 0.999),
        weight_decay=0.0,
    )
    embeddings = model.get_input_embeddings().weight
    params = [p for p in model.parameters() if p.requires_grad and p is not embeddings]
    before = [full_tensor(p.detach()).clone() for p in params]
    for _ in range(STEPS):
        train().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    changed = sum(int((full_tensor(p.detach()) != b).sum()) for p, b in zip(params, before, strict=True))
    return changed / sum(b.numel() for b in before)


def _worker(rank: int, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(out + ".store", 1), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh

    sharded = load_model(model_dir, dtype=torch.float32)
    vision_tower(sharded).requires_grad_(False)
    layout = ShardingLayout(sharded, decoder_blocks(sharded), kept_whole=(vision_tower(sharded),))
    scope = shard_model(layout, init_device_mesh("cpu", (1,)), ShardingSettings(param_dtype="bfloat16"))
    master = changed_fraction(sharded, lambda: run_sharded(scope, lambda: _loss(sharded)))
    dtypes = {full_tensor(p).dtype for p in sharded.parameters() if p.requires_grad}

    half = load_model(model_dir, dtype=torch.bfloat16)
    vision_tower(half).requires_grad_(False)
    bf16_true = changed_fraction(half, lambda: _loss(half))
    torch.save({"master": master, "bf16_true": bf16_true, "dtypes": dtypes}, out)
    dist.destroy_process_group()


def test_fp32_master_weights_move_where_bf16_weights_do_not(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fractions.pt"
    spawn_ranks(_worker, args=(str(tiny_model_dir), str(out)), nprocs=1)
    result = torch.load(out)
    assert result["dtypes"] == {torch.float32}  # the sharded parameters are the fp32 master copy
    assert result["master"] > 0.99, result
    assert result["bf16_true"] < 0.1, result
