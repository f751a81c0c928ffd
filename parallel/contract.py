"""What the sequence-parallel strategy and the LightningModule promise each other, as typed protocols.

The strategy (:class:`~parallel.strategy.SequenceParallelStrategy`) knows no model class: it
checks once, at setup, that the module is a :class:`SequenceParallelModule` (with a clear error
when not), reads its attention heads and whether it splits sequences, and hands it the
sequence axis; then it has the module shard its model(s) (:class:`ShardableModule`), since
only the module knows its blocks and which parts stay whole. Both are ``runtime_checkable``,
so ``isinstance`` checks that the members exist (not their types).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from parallel.shard import SequenceShard
from parallel.sharding import ShardingSettings


@dataclass(frozen=True)
class AttentionHeads:
    """Head counts of the language model's attention, which decide how a sequence can be split."""

    query: int
    key_value: int


@runtime_checkable
class SequenceParallelModule(Protocol):
    """A LightningModule the sequence-parallel strategy can drive.

    ``supports_sequence_parallel``: whether its training step scores with :attr:`sequence_shard`
    (when it does not, sequence-parallel peers would each compute the whole gradient, and the
    strategy refuses ``sequence_parallel_size > 1`` for fitting).
    ``sequence_shard``: set by the strategy at setup; None when sequences are not split.
    """

    supports_sequence_parallel: bool
    sequence_shard: SequenceShard | None

    def attention_heads(self) -> AttentionHeads | None:
        """Query and key/value heads of the model; None while the model is not built yet."""
        ...


@runtime_checkable
class ShardableModule(Protocol):
    """A LightningModule whose model(s) the strategy can shard with FSDP2."""

    def shard(
        self, mesh: DeviceMesh, settings: ShardingSettings, data_parallel_group: dist.ProcessGroup | None
    ) -> None:
        """Shard the model (and any frozen copy of it) over ``mesh`` with
        :func:`parallel.sharding.shard_model`, and from now on normalise each rank's loss by
        counts summed over ``data_parallel_group`` (gradients are summed over every rank)."""
        ...


@runtime_checkable
class ShardingStrategy(Protocol):
    """A strategy that shards the module's model (what the module asks of it before setup)."""

    sharding_settings: ShardingSettings


def require_sequence_parallel_module(module: object, strategy: str) -> SequenceParallelModule:
    """``module``, checked against :class:`SequenceParallelModule`; a ``TypeError`` naming what is missing."""
    if isinstance(module, SequenceParallelModule):
        return module
    members = ("supports_sequence_parallel", "sequence_shard", "attention_heads")
    missing = [name for name in members if not hasattr(module, name)]
    raise TypeError(
        f"{strategy} needs a module that implements parallel.contract.SequenceParallelModule; "
        f"{type(module).__name__} lacks {', '.join(missing)} (lvrl's modules derive from "
        "models.vlm_module.VLMModule, which implements it)"
    )
