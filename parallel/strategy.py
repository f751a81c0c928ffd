"""``SequenceParallelStrategy``: FSDP2 sharding over a (data, sequence) mesh, on Lightning's
``ModelParallelStrategy`` (its launcher, collectives and distributed checkpoints).

What it adds:

- the device mesh (:mod:`parallel.mesh`) of data-parallel replicas and sequence-parallel
  groups, checked against the world size (before any process starts) and the model's heads;
  the LightningModule gets a :class:`~parallel.shard.SequenceShard` (``pl_module.sequence_shard``)
  for the sequence axis (the module implements :class:`~parallel.contract.SequenceParallelModule`);
- data sharding follows the ``data`` axis (``data_parallel_rank``/``data_parallel_size`` are
  what the DataModule reads), so sequence-parallel peers receive the same samples, and the
  module's torchmetrics sync over the data axis only (each question counted once);
- the model sharded with torch FSDP2 over every rank (``sharding: full``), or replicated across
  nodes and sharded within one (``hybrid``, HSDP): one unit per decoder block, the rest in a
  root scope (:mod:`parallel.sharding`), parameters and optimizer states kept in the model's
  dtype (fp32: a master copy), blocks computing in ``param_dtype`` (bf16), gradients summed in
  ``reduce_dtype`` (fp32), optionally all of it in host memory (``cpu_offload``). Gradients
  are reduced by FSDP (a reduce-scatter per unit), summed over every rank: the modules
  normalise each rank's loss by counts summed over the data axis, so the sum is the
  one-process gradient of the whole batch;
- checkpoints: sharded (torch.distributed.checkpoint, one folder, written to a temporary
  folder and renamed into place) or, with ``save_distributed_checkpoint: false``, a single
  file gathered on rank 0; either restores at another world size.

Works on CPU (gloo) and GPU (nccl), under ``lvrl fit`` with ``trainer.devices=N`` or under
``torchrun``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import HalfPrecision
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torchmetrics import Metric

from parallel.contract import SequenceParallelModule, ShardableModule, require_sequence_parallel_module
from parallel.mesh import (
    MeshShape,
    build_device_mesh,
    check_attention_heads,
    mesh_shape,
    sequence_exchange_group,
)
from parallel.shard import ATTENTION_KINDS, SequenceShard
from parallel.sharding import ShardingSettings

SHARDING_KINDS = ("full", "hybrid")
PARTIAL_CHECKPOINT = ".partial-"
"""In the name of a checkpoint folder being written (``callbacks.checkpoint.RunCheckpoint``
removes one left by a killed run at the next start: the same marker as its files')."""


class SequenceParallelStrategy(ModelParallelStrategy):
    """Data x sequence parallelism with the model sharded by FSDP2.

    Args:
        sequence_parallel_size: ranks that split one sequence (must divide the world size).
        sequence_parallel_attention: ``ulysses`` (all-to-all over heads; heads must divide by the
            size) or ``ring`` (key/value blocks passed around; any head count).
        sharding: ``full`` (every parameter sharded over all ranks) or ``hybrid`` (sharded within
            a node, replicated across ``trainer.num_nodes``: less traffic between nodes).
        param_dtype: what the gathered blocks compute in (``bfloat16`` on GPUs; ``float32`` for
            exact checks). The sharded parameters and optimizer states keep the model's own dtype
            (``model.init_args.dtype: float32``: a master copy, so small updates are not rounded away).
        reduce_dtype: what gradients are summed in.
        cpu_offload: keep the sharded parameters, gradients and optimizer states in host memory.
        save_distributed_checkpoint: one shard per rank (a folder, resumable at any world size);
            False: a single file gathered on rank 0 (memory for the whole state on rank 0).
        check_memory_plan: on GPUs, refuse to start a run that ``lvrl plan`` says cannot fit.
        process_group_backend: ``gloo``/``nccl``; None picks by device.
        timeout: collective time-out.
    """

    strategy_name = "sequence_parallel"

    def __init__(
        self,
        sequence_parallel_size: int = 2,
        sequence_parallel_attention: str = "ulysses",
        sharding: str = "full",
        param_dtype: str = "bfloat16",
        reduce_dtype: str = "float32",
        cpu_offload: bool = False,
        save_distributed_checkpoint: bool = True,
        check_memory_plan: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(minutes=30),
    ) -> None:
        super().__init__(
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        # Checked against the world size and the model's heads once both are known.
        if sequence_parallel_size < 1:
            raise ValueError(f"sequence_parallel_size must be >= 1, got {sequence_parallel_size}")
        if sequence_parallel_attention not in ATTENTION_KINDS:
            raise ValueError(
                f"sequence_parallel_attention must be one of {ATTENTION_KINDS}, "
                f"got {sequence_parallel_attention!r}"
            )
        if sharding not in SHARDING_KINDS:
            raise ValueError(f"sharding must be one of {SHARDING_KINDS}, got {sharding!r}")
        self.sequence_parallel_size = sequence_parallel_size
        self.sequence_parallel_attention = sequence_parallel_attention
        self.sharding = sharding
        self.sharding_settings = ShardingSettings(param_dtype, reduce_dtype, cpu_offload)
        self.check_memory_plan = check_memory_plan
        self.shape: MeshShape | None = None
        self.shard_mesh: DeviceMesh | None = None
        """The mesh FSDP shards over: ``(shard,)`` or, hybrid, ``(replicate, shard)``."""
        self.exchange_group: torch.distributed.ProcessGroup | None = None
        """The sequence-parallel peers as a group of their own, for rollout exchanges."""

    # -- mesh ---------------------------------------------------------------------------------
    def _configure_launcher(self) -> None:
        # Called while the Trainer is built, once devices and nodes are known and before any
        # process is launched: the earliest point where a bad layout can be refused. Protected:
        # Lightning 2.6 has no public hook there (tests/unit/test_lightning_internals.py).
        mesh_shape(self.num_nodes * self.num_processes, self.sequence_parallel_size)
        super()._configure_launcher()

    def setup_environment(self) -> None:
        # ModelParallelStrategy's own, with our mesh instead of its (data, tensor) one: its body
        # is followed, protected members included (_setup_distributed, _device_mesh and the
        # module's _device_mesh, which its public device_mesh properties read); calling it and
        # replacing the mesh would build process groups that are never used.
        # tests/unit/test_lightning_internals.py fails when Lightning changes that body.
        self.shape = mesh_shape(self.num_nodes * self.num_processes, self.sequence_parallel_size)
        self._setup_distributed()  # the accelerator's device, then the default process group
        device = self.root_device.type
        self._device_mesh = build_device_mesh(device, self.shape)
        if self.shape.sequence > 1:
            self.exchange_group = sequence_exchange_group(self.shape)
        if self.sharding == "hybrid" and self.num_nodes > 1:
            self.shard_mesh = init_device_mesh(
                device, (self.num_nodes, self.num_processes), mesh_dim_names=("replicate", "shard")
            )
        else:
            self.shard_mesh = init_device_mesh(device, (self.world_size,), mesh_dim_names=("shard",))
        assert self.lightning_module is not None
        self.lightning_module._device_mesh = self._device_mesh

    @property
    def data_parallel_rank(self) -> int:
        return self.global_rank // self.sequence_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.sequence_parallel_size

    @property
    def data_parallel_group(self) -> torch.distributed.ProcessGroup | None:
        """The ranks holding different samples (losses are normalised by counts summed over them)."""
        return None if self._device_mesh is None else self._device_mesh.get_group("data")

    @property
    def sequence_shard(self) -> SequenceShard | None:
        """The sequence axis for the module; None when sequences are not split."""
        if self._device_mesh is None or self.sequence_parallel_size == 1:
            return None
        return SequenceShard(
            self._device_mesh.get_group("sequence"),
            self.sequence_parallel_attention,
            exchange_group=self.exchange_group,
        )

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    # -- setup: checks, the sequence axis, sharding ------------------------------------------
    def setup(self, trainer: L.Trainer) -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting and isinstance(self.precision_plugin, HalfPrecision):
            raise ValueError(
                f"trainer.precision={self.precision_plugin.precision!r} casts the weights themselves, so "
                "AdamW updates bf16 weights with no fp32 master copy and small updates round away: use "
                "trainer.precision: 32-true with model dtype float32; the strategy computes in "
                "param_dtype (bfloat16 by default)"
            )
        module = require_sequence_parallel_module(self.lightning_module, type(self).__name__)
        check_module_fits(
            module, self.sequence_parallel_size, self.sequence_parallel_attention, fitting=fitting
        )
        module.sequence_shard = self.sequence_shard
        if self.sequence_parallel_size > 1 and self._device_mesh is not None:
            # Peers evaluate the same questions: metrics sync over the data axis only, so that
            # every question is counted once.
            for metric in module.modules():
                if isinstance(metric, Metric):
                    metric.process_group = self._device_mesh.get_group("data")
        if not isinstance(module, ShardableModule):
            raise TypeError(
                f"{type(self).__name__} shards the module's model: {type(module).__name__} does not "
                "implement parallel.contract.ShardableModule (lvrl's modules derive from "
                "models.vlm_module.VLMModule)"
            )
        assert self.shard_mesh is not None
        module.shard(self.shard_mesh, self.sharding_settings, self.data_parallel_group)
        super().setup(trainer)

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | os.PathLike[str], storage_options: Any | None = None
    ) -> None:
        if not self._save_distributed_checkpoint:
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        # A sharded checkpoint is a folder that every rank writes into: write it under a
        # temporary name and rename it once all ranks are done, so a kill mid-write never leaves
        # a folder that looks complete (the rename of a folder over another is not atomic:
        # the old one is moved aside first, and removed after).
        final = Path(self.broadcast(str(filepath)))
        token = self.broadcast(uuid.uuid4().hex[:8])
        partial = final.with_name(f"{final.name}{PARTIAL_CHECKPOINT}{token}")
        super().save_checkpoint(checkpoint, partial, storage_options)
        self.barrier("checkpoint written")
        if self.global_rank == 0:
            old = final.with_name(f"{final.name}{PARTIAL_CHECKPOINT}old-{token}")
            if final.exists() or final.is_symlink():
                final.rename(old)
            partial.rename(final)
            if old.is_dir():
                shutil.rmtree(old)
            elif old.exists():
                old.unlink()
        self.barrier("checkpoint renamed")

    def remove_checkpoint(self, filepath: str | os.PathLike[str]) -> None:
        if self.global_rank != 0:
            return
        path = Path(filepath)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def check_module_fits(
    module: SequenceParallelModule, sequence_parallel_size: int, attention: str, *, fitting: bool
) -> None:
    """Refuse a module the sequence split cannot work with: its heads against the attention kind,
    and, when training, a module that does not score with the shard."""
    heads = module.attention_heads()
    if heads is not None:
        check_attention_heads(heads.query, heads.key_value, sequence_parallel_size, attention)
    if fitting and sequence_parallel_size > 1 and not module.supports_sequence_parallel:
        # Its peers would each compute the whole gradient, and the sum over the sequence axis
        # would count it sequence_parallel_size times.
        raise ValueError(
            f"{type(module).__name__} does not split sequences across ranks: set "
            "trainer.strategy.init_args.sequence_parallel_size: 1 (plain data parallelism)"
        )
