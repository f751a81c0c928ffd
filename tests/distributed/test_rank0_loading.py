"""Loading a sharded model from rank 0 alone: the other ranks never hold the whole model.

Two gloo processes shard the tiny Qwen2.5-VL as the strategy does (a unit per decoder layer, the
root scope, the frozen vision tower kept whole). Rank 0 loads the weights (perturbed by seeded
noise, so they differ from anything a constructor draws); rank 1 builds an empty skeleton on the
meta device and is filled from rank 0 (:func:`parallel.sharding.fill_from_rank0`). Every
parameter gathered whole, every kept-whole tensor and every buffer (including the rotary
``inv_freq``, outside the state dict) must equal the loaded model's exactly: broadcasting and
slicing move values, they compute nothing. Rank 1's largest resident model tensor is also
recorded: a shard, never a whole layer of the model.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from helpers.sharded_runs import perturbed_policy
from helpers.tolerances import assert_identical

from models.loading import load_config

WORLD_SIZE = 2


def loaded_model(model_dir: str) -> torch.nn.Module:
    return perturbed_policy(model_dir, seed=13)


def _worker(rank: int, model_dir: str, store_path: str, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForImageTextToText

    from models.vision import decoder_blocks, vision_tower
    from parallel.sharding import ShardingLayout, ShardingSettings, full_tensor, shard_model

    dist.init_process_group(
        "gloo", store=dist.FileStore(store_path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE
    )
    torch.set_num_threads(1)
    if rank == 0:
        model = loaded_model(model_dir)
        weights = model.state_dict()
    else:
        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(load_config(model_dir))
        for name, parameter in model.named_parameters():
            parameter.requires_grad_("visual" not in name)
        weights = {}
    assert (rank == 0) != any(p.is_meta for p in model.parameters())
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    layout = ShardingLayout(model, decoder_blocks(model), kept_whole=(vision_tower(model),))
    settings = ShardingSettings(param_dtype="float32")
    shard_model(layout, mesh, settings, weights_from_rank0=weights)
    del weights
    gathered = {name: full_tensor(p).detach().clone() for name, p in model.named_parameters()}
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    largest_shard = max(p.to_local().numel() for p in model.parameters() if hasattr(p, "to_local"))
    torch.save((gathered, buffers, largest_shard), Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_a_meta_skeleton_is_filled_from_rank0(tiny_model_dir: Path, tmp_path: Path) -> None:
    spawn_ranks(
        _worker,
        args=(str(tiny_model_dir), str(tmp_path / "store"), str(tmp_path)),
        nprocs=WORLD_SIZE,
    )
    expected = loaded_model(str(tiny_model_dir))
    parameters = {name: p.detach() for name, p in expected.named_parameters()}
    buffers = dict(expected.named_buffers())
    assert any("inv_freq" in name for name in buffers)  # the buffers outside the state dict are checked
    for rank in range(WORLD_SIZE):
        gathered, rank_buffers, largest_shard = torch.load(tmp_path / f"rank{rank}.pt")
        assert gathered.keys() == parameters.keys() and rank_buffers.keys() == buffers.keys()
        for name, want in parameters.items():
            assert_identical(gathered[name], want, reason=f"parameter {name} on rank {rank}")
        for name, want in buffers.items():
            assert_identical(rank_buffers[name], want, reason=f"buffer {name} on rank {rank}")
        largest_sharded = max(p.numel() for n, p in parameters.items() if "visual" not in n)
        assert largest_shard <= -(-largest_sharded // WORLD_SIZE)
