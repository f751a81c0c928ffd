"""Sharded GRPO (FSDP2 under SequenceParallelStrategy) in 2 and 4 gloo processes against one process.

Three updates on the same fixed rollouts (4 video prompts, 2 completions each, a KL term to
a sharded reference, micro-batches of 2 rows, gradient clipping active, the last prompt's
group filtered out so that one data-parallel rank has fewer rows to train and runs an idle
pass). One process trains on all prompts with the model whole; the workers each train on their
data-parallel share, with sequences split across sequence-parallel peers when the size is > 1.
Compared per update: the loss and every full gradient (gathered from the shards) just before
the optimizer step, and every weight at the end, within float32 bars (FSDP and sequence
splitting reorder reductions; they change nothing else). The blocks compute in float32 here
(``param_dtype: float32``) so that the comparison is to float32 rounding, and the optimizer is
SGD with momentum, whose update is linear in the gradient (Adam would scale rounding noise in
near-zero gradient entries up to learning-rate-sized steps: see ``helpers.sharded_runs.sgd_variant``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.cli import free_port
from helpers.ranks import spawn_ranks
from helpers.sharded_runs import fit_on_rollouts, grpo_module, launched_externally, rollout_parts
from helpers.tolerances import GRADIENT_ULPS, assert_float32_close

PROMPTS = 4
STEPS = 3


def _worker(
    rank: int,
    world_size: int,
    sequence_parallel_size: int,
    checkpointing: bool,
    port: int,
    model_dir: str,
    tmp: str,
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
        grpo_module(Path(model_dir), gradient_checkpointing=checkpointing),
        parts,
        list(range(data_rank * per_rank, (data_rank + 1) * per_rank)),
        Path(tmp) / "sharded.pt",
        Path(tmp) / "run",
        strategy=strategy,
        devices=world_size,
        sequence_parallel_size=sequence_parallel_size,
    )


@pytest.fixture(scope="module")
def one_process(tiny_model_dir: Path, synth_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("one_process")
    parts = rollout_parts(tiny_model_dir, synth_dir, PROMPTS, STEPS)
    torch.save(parts, tmp / "parts.pt")
    fit_on_rollouts(grpo_module(tiny_model_dir), parts, list(range(PROMPTS)), tmp / "one.pt", tmp / "run")
    return tmp


@pytest.mark.parametrize(
    ("world_size", "sequence_parallel_size", "checkpointing"),
    [(2, 1, True), (2, 2, False), (4, 1, False), (4, 2, False)],
    ids=["data2-checkpointed", "sequence2", "data4", "data2xsequence2"],
)
def test_sharded_updates_equal_one_process(
    one_process: Path,
    tiny_model_dir: Path,
    tmp_path: Path,
    world_size: int,
    sequence_parallel_size: int,
    checkpointing: bool,
) -> None:
    """(One case recomputes each block's activations in backward: same arithmetic, same bar.)"""
    (tmp_path / "parts.pt").symlink_to(one_process / "parts.pt")
    spawn_ranks(
        _worker,
        args=(
            world_size,
            sequence_parallel_size,
            checkpointing,
            free_port(),
            str(tiny_model_dir),
            str(tmp_path),
        ),
        nprocs=world_size,
    )
    expected = torch.load(one_process / "one.pt")
    got = torch.load(tmp_path / "sharded.pt")
    label = f"{world_size} processes (sequence {sequence_parallel_size}) vs one"
    assert len(got["grads"]) == len(expected["grads"]) == STEPS
    assert_float32_close(got["losses"], expected["losses"], ulps=GRADIENT_ULPS, reason=f"losses, {label}")
    for update, (grads, want) in enumerate(zip(got["grads"], expected["grads"], strict=True)):
        assert grads.keys() == want.keys()
        for name, grad in want.items():
            assert_float32_close(
                grads[name],
                grad,
                ulps=GRADIENT_ULPS,
                reason=f"update {update + 1}: gradient of {name}, {label}",
            )
    assert got["weights"].keys() == expected["weights"].keys()
    for name, weight in expected["weights"].items():
        assert_float32_close(
            got["weights"][name], weight, ulps=GRADIENT_ULPS, reason=f"{name} after {STEPS} updates, {label}"
        )


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
        grpo_module(Path(model_dir)),
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


def test_a_sharded_checkpoint_restores_at_another_world_size(
    one_process: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two updates on 2 processes, a sharded checkpoint (weights and SGD momentum), the third update
    on 1 process: the same gradient and weights as three updates in one process."""
    (tmp_path / "parts.pt").symlink_to(one_process / "parts.pt")
    for world_size, steps, phase in ((2, STEPS - 1, "first"), (1, STEPS, "resumed")):
        spawn_ranks(
            _resumed_worker,
            args=(world_size, free_port(), str(tiny_model_dir), str(tmp_path), steps, phase),
            nprocs=world_size,
        )
    assert (tmp_path / "step2.ckpt").is_dir()  # one shard per rank of the writing run
    expected = torch.load(one_process / "one.pt")
    got = torch.load(tmp_path / "resumed.pt")
    assert len(got["grads"]) == 1  # the resumed run made the last update only
    for name, grad in expected["grads"][-1].items():
        assert_float32_close(
            got["grads"][0][name], grad, ulps=GRADIENT_ULPS, reason=f"update 3: gradient of {name}"
        )
    for name, weight in expected["weights"].items():
        assert_float32_close(
            got["weights"][name], weight, ulps=GRADIENT_ULPS, reason=f"{name}, restored at 1 process"
        )
