"""LoRA GRPO under the sharded strategy (FSDP2 units with frozen base weights and trainable
adapters side by side) in 2 gloo processes against one process.

The runs of tests/distributed/test_sharded_training.py with ``lora`` set: three updates on the
same fixed rollouts, a KL term whose reference is the policy with its adapters disabled (run in
the policy's own sharded units), micro-batches of 2 rows, clipping active, one data-parallel
rank with fewer rows (an idle pass). Compared per update: the loss and every adapter gradient
(gathered from the shards); at the end, every adapter weight and the merged weights the engine
would receive (gathered and merged on every rank, as the rollout callback's sync does). Float32
bars of tests/helpers/tolerances.py: FSDP and sequence splitting reorder reductions only. The
frozen base weights must not move at all. A sharded checkpoint of two updates restores at one
process and makes the third update as one process does; `lvrl model export` reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers.cli import free_port
from helpers.ranks import spawn_ranks
from helpers.sharded_runs import fit_on_rollouts, grpo_module, launched_externally, rollout_parts
from helpers.tolerances import GRADIENT_ULPS, assert_float32_close, assert_identical

from models.loading import load_model
from models.lora import engine_weights
from parallel.sharding import full_tensor

PROMPTS = 4
STEPS = 3
LORA = {"r": 4, "alpha": 8.0}


class RecordEngineWeights(L.Callback):
    """At the end, the merged weights an engine would receive, and the base weights (rank 0 writes)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        # Every rank iterates: the merge gathers sharded weights (collectives in one order).
        merged = {name: tensor.detach().clone() for name, tensor in engine_weights(pl_module.model)}
        base = {
            name: full_tensor(p.detach()).clone()
            for name, p in pl_module.model.named_parameters()
            if not p.requires_grad
        }
        if trainer.global_rank == 0:
            torch.save({"merged": merged, "base": base}, self.out)


def lora_module(model_dir: Path, **overrides: Any) -> Any:
    return grpo_module(model_dir, lora=LORA, learning_rate=0.1, **overrides)


def _worker(
    rank: int, world_size: int, sequence_parallel_size: int, port: int, model_dir: str, tmp: str
) -> None:
    torch.set_num_threads(1)
    launched_externally(rank, world_size, port)
    from parallel.strategy import SequenceParallelStrategy

    parts = torch.load(Path(tmp) / "parts.pt", weights_only=False)
    data_size = world_size // sequence_parallel_size
    per_rank = PROMPTS // data_size
    data_rank = rank // sequence_parallel_size
    strategy = SequenceParallelStrategy(
        sequence_parallel_size=sequence_parallel_size, param_dtype="float32", process_group_backend="gloo"
    )
    fit_on_rollouts(
        lora_module(Path(model_dir)),
        parts,
        list(range(data_rank * per_rank, (data_rank + 1) * per_rank)),
        Path(tmp) / "sharded.pt",
        Path(tmp) / "run",
        strategy=strategy,
        devices=world_size,
        sequence_parallel_size=sequence_parallel_size,
        callbacks=[RecordEngineWeights(Path(tmp) / "sharded_engine.pt")],
    )


@pytest.fixture(scope="module")
def one_process(tiny_model_dir: Path, synth_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("lora_one_process")
    parts = rollout_parts(tiny_model_dir, synth_dir, PROMPTS, STEPS)
    torch.save(parts, tmp / "parts.pt")
    fit_on_rollouts(
        lora_module(tiny_model_dir),
        parts,
        list(range(PROMPTS)),
        tmp / "one.pt",
        tmp / "run",
        callbacks=[RecordEngineWeights(tmp / "one_engine.pt")],
    )
    return tmp


@pytest.mark.parametrize(
    ("world_size", "sequence_parallel_size"), [(2, 1), (2, 2)], ids=["data2", "sequence2"]
)
def test_sharded_lora_updates_equal_one_process(
    one_process: Path, tiny_model_dir: Path, tmp_path: Path, world_size: int, sequence_parallel_size: int
) -> None:
    (tmp_path / "parts.pt").symlink_to(one_process / "parts.pt")
    spawn_ranks(
        _worker,
        args=(world_size, sequence_parallel_size, free_port(), str(tiny_model_dir), str(tmp_path)),
        nprocs=world_size,
    )
    expected, got = torch.load(one_process / "one.pt"), torch.load(tmp_path / "sharded.pt")
    label = f"{world_size} processes (sequence {sequence_parallel_size}) vs one"
    assert_float32_close(got["losses"], expected["losses"], ulps=GRADIENT_ULPS, reason=f"losses, {label}")
    assert len(got["grads"]) == len(expected["grads"]) == STEPS
    for update, (grads, want) in enumerate(zip(got["grads"], expected["grads"], strict=True)):
        assert grads.keys() == want.keys() and all(".lora_" in name for name in want)
        for name, grad in want.items():
            assert_float32_close(
                grads[name],
                grad,
                ulps=GRADIENT_ULPS,
                reason=f"update {update + 1}: gradient of {name}, {label}",
            )
    assert got["weights"].keys() == expected["weights"].keys()
    for name, weight in expected["weights"].items():
        assert_float32_close(got["weights"][name], weight, ulps=GRADIENT_ULPS, reason=f"{name}, {label}")
    engine_expected = torch.load(one_process / "one_engine.pt")
    engine_got = torch.load(tmp_path / "sharded_engine.pt")
    loaded = dict(load_model(tiny_model_dir).named_parameters())
    for name, base in engine_got["base"].items():  # the frozen base, sharded and gathered: unchanged
        assert_identical(base, loaded[name.replace(".base_layer.", ".")].detach(), reason=f"{name}, {label}")
    assert engine_got["merged"].keys() == engine_expected["merged"].keys()
    for name, merged in engine_expected["merged"].items():
        assert_float32_close(
            engine_got["merged"][name], merged, ulps=GRADIENT_ULPS, reason=f"engine weight {name}, {label}"
        )
        if name.endswith(".weight"):  # the adapters did move every merged weight
            assert not torch.equal(merged, loaded[name].detach()), name


def _resumed_worker(
    rank: int, world_size: int, port: int, model_dir: str, tmp: str, steps: int, phase: str
) -> None:
    torch.set_num_threads(1)
    launched_externally(rank, world_size, port)
    from parallel.strategy import SequenceParallelStrategy

    parts = torch.load(Path(tmp) / "parts.pt", weights_only=False)
    per_rank = PROMPTS // world_size
    strategy = SequenceParallelStrategy(
        sequence_parallel_size=1, param_dtype="float32", process_group_backend="gloo"
    )
    checkpoint = Path(tmp) / "step2.ckpt"
    fit_on_rollouts(
        lora_module(Path(model_dir)),
        parts,
        list(range(rank * per_rank, (rank + 1) * per_rank)),
        Path(tmp) / f"{phase}.pt",
        Path(tmp) / phase,
        strategy=strategy,
        devices=world_size,
        max_steps=steps,
        save_to=checkpoint if phase == "first" else None,
        resume_from=checkpoint if phase == "resumed" else None,
    )


def test_a_sharded_lora_checkpoint_restores_at_another_world_size(
    one_process: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two updates on 2 processes, a sharded checkpoint (adapters and SGD momentum), the third on
    1 process: the same adapter gradient and weights as three updates in one process."""
    (tmp_path / "parts.pt").symlink_to(one_process / "parts.pt")
    for world_size, steps, phase in ((2, STEPS - 1, "first"), (1, STEPS, "resumed")):
        spawn_ranks(
            _resumed_worker,
            args=(world_size, free_port(), str(tiny_model_dir), str(tmp_path), steps, phase),
            nprocs=world_size,
        )
    assert (tmp_path / "step2.ckpt").is_dir()  # one shard per rank of the writing run
    expected, got = torch.load(one_process / "one.pt"), torch.load(tmp_path / "resumed.pt")
    assert len(got["grads"]) == 1  # the resumed run made the last update only
    for name, grad in expected["grads"][-1].items():
        assert_float32_close(
            got["grads"][0][name], grad, ulps=GRADIENT_ULPS, reason=f"update 3: gradient of {name}"
        )
    for name, weight in expected["weights"].items():
        assert_float32_close(
            got["weights"][name], weight, ulps=GRADIENT_ULPS, reason=f"{name}, restored at 1 process"
        )
    # `lvrl model export` reads the sharded folder in one process: merged weights and the adapter.
    from models.export import export_checkpoint

    out = export_checkpoint(tmp_path / "step2.ckpt", tmp_path / "exported")
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    exported = dict(load_model(out).named_parameters())
    base = dict(load_model(tiny_model_dir).named_parameters())
    assert exported.keys() == base.keys()
    moved = [name for name, p in exported.items() if not torch.equal(p, base[name])]
    assert moved and all(name.endswith("_proj.weight") and ".language_model." in name for name in moved)
