"""The device mesh: a ``data`` axis and a ``sequence`` axis, and the checks on their sizes.

Ranks are laid out row-major over ``(data, sequence)``: consecutive ranks form a
sequence-parallel group (on a GPU node, the fast links), and rank ``d * S + s`` is member ``s``
of data-parallel replica ``d`` (:func:`datamodules.stream.data_parallel_coordinates`
uses the same rule to shard the data).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from parallel.shard import ATTENTION_KINDS

MESH_AXES = ("data", "sequence")


@dataclass(frozen=True)
class MeshShape:
    data: int
    sequence: int

    @property
    def world_size(self) -> int:
        return self.data * self.sequence


def mesh_shape(world_size: int, sequence_parallel_size: int) -> MeshShape:
    """The mesh for ``world_size`` processes, or a ValueError that says what to change."""
    if sequence_parallel_size < 1:
        raise ValueError(f"sequence_parallel_size must be >= 1, got {sequence_parallel_size}")
    if world_size % sequence_parallel_size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"sequence_parallel_size={sequence_parallel_size} does not divide the world size {world_size} "
            f"(trainer.devices x trainer.num_nodes); use one of {divisors} or change trainer.devices"
        )
    return MeshShape(world_size // sequence_parallel_size, sequence_parallel_size)


def check_attention_heads(
    num_heads: int, num_kv_heads: int, sequence_parallel_size: int, attention: str
) -> None:
    """Ulysses splits heads across the group: refuse a split that cannot work, saying what to do."""
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"sequence_parallel_attention must be one of {ATTENTION_KINDS}, got {attention!r}")
    if attention == "ulysses" and num_heads % sequence_parallel_size:
        raise ValueError(
            f"Ulysses attention splits the model's {num_heads} attention heads across "
            f"sequence_parallel_size={sequence_parallel_size} ranks, which does not divide them: set "
            f"sequence_parallel_attention: ring, or a sequence_parallel_size that divides {num_heads}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} attention heads are not a multiple of {num_kv_heads} key/value heads")


def build_device_mesh(device_type: str, shape: MeshShape) -> DeviceMesh:
    """The ``(data, sequence)`` mesh over the initialised default process group."""
    return init_device_mesh(device_type, (shape.data, shape.sequence), mesh_dim_names=MESH_AXES)


def sequence_exchange_group(shape: MeshShape) -> dist.ProcessGroup:
    """A group of its own over this rank's sequence-parallel peers, for the rollout's exchanges.

    The mesh's sequence group is the default group itself when there is one data replica, and
    the ranks' decisions and checkpoints run there. An exchange left waiting inside a rollout
    (a peer's engine hung; the rollout has timed out but its thread still waits) must not take
    their place in that group's order, or every rank waits until the time-out. On a group of
    its own it only waits for the peer's process to end. Every rank creates every replica's
    group, in the same order (``new_group`` is collective).
    """
    own: dist.ProcessGroup | None = None
    for replica in range(shape.data):
        ranks = list(range(replica * shape.sequence, (replica + 1) * shape.sequence))
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            own = group
    assert own is not None
    return own
