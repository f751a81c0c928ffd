"""Sharding a model with torch FSDP2 (``fully_shard``): units, mixed precision, and the gathered view.

Layout. Each decoder block is one FSDP unit (its parameters gathered for its forward and its
backward, then freed); everything else that trains (embeddings, final norm, LM head) belongs
to a *scope* unit, :class:`ShardedScope`, a thin root module whose forward runs a piece of
work with those parameters gathered. The work is a closure, so it may look tokens up, splice
cached video embeddings in and call the model several times (a shared-prompt pass); every
gradient of the scope's parameters is reduced once, when the backward pass ends (the closure
passes no tensor in, so FSDP waits for the end of backward instead of a hook on the inputs).
Parameters left out (a frozen vision tower) stay whole on every rank.

Precision. Parameters are kept (and updated, with their optimizer states) in the dtype they
were loaded in, fp32 for a master copy; ``param_dtype`` is what a gathered unit computes in
(bf16 on GPUs), ``reduce_dtype`` what gradients are summed in (fp32).

Reduction. Gradients are **summed** over every rank (``gradient_divide_factor=1``): each
rank's loss is its share of the whole batch's loss (normalised by counts summed over the
data axis), and sequence-parallel peers each hold their slice's share of a row's gradient.

Every rank must run every unit's forward (and backward) the same number of times, in the same
order: an FSDP unit's forward is a collective. Work whose length differs across ranks
(generation) runs in :func:`gathered`, where the units are unsharded once and stay so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

T = TypeVar("T")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ShardingSettings:
    """How a model is sharded (the strategy's arguments of the same names)."""

    param_dtype: str = "bfloat16"
    """dtype a gathered unit computes in; the sharded (master) parameters keep their own."""
    reduce_dtype: str = "float32"
    """dtype gradients are reduced in."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer states in host memory (FSDP2's
    ``CPUOffloadPolicy``): each unit is copied to the device for its forward and backward."""

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name} must be one of {sorted(DTYPES)}, got {getattr(self, name)!r}")

    def mixed_precision(self) -> MixedPrecisionPolicy:
        return MixedPrecisionPolicy(
            param_dtype=DTYPES[self.param_dtype], reduce_dtype=DTYPES[self.reduce_dtype]
        )

    def offload(self, device_type: str) -> OffloadPolicy:
        # On a CPU device everything already lives in host memory (and FSDP's offload policy
        # needs an accelerator to copy to).
        return CPUOffloadPolicy() if self.cpu_offload and device_type != "cpu" else OffloadPolicy()


@dataclass(frozen=True)
class ShardingLayout:
    """What a module shards: its model, the blocks that become units, the parts kept whole."""

    model: torch.nn.Module
    blocks: Sequence[torch.nn.Module]
    """One FSDP unit each (the decoder layers)."""
    kept_whole: Sequence[torch.nn.Module] = ()
    """Not sharded: whole on every rank (they must not train: nothing would reduce their gradients)."""


class ShardedScope(torch.nn.Module):
    """The root FSDP unit: ``scope(work)`` runs ``work()`` with the root's parameters gathered."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.held_gathered = False
        """Inside :func:`gathered`: every unit stays unsharded until it ends."""

    def forward(self, work: Callable[[], T]) -> T:  # type: ignore[override]
        return work()


def run_sharded(scope: ShardedScope | None, work: Callable[[], T]) -> T:
    """``work()`` inside ``scope`` (as it is when the model is not sharded).

    FSDP keeps the root's parameters gathered after its forward, for the backward that follows;
    a forward without gradient (a reference pass, a diagnostic) has no backward to shard them
    again, so they are sharded here (else a checkpoint would find whole tensors in the module).
    """
    if scope is None:
        return work()
    out = scope(work)
    if not torch.is_grad_enabled() and not scope.held_gathered:
        scope.reshard()
    return out


def shard_model(
    layout: ShardingLayout,
    mesh: DeviceMesh,
    settings: ShardingSettings,
    *,
    trains: bool = True,
    weights_from_rank0: dict[str, torch.Tensor] | None = None,
) -> ShardedScope:
    """Shard ``layout.model`` in place over ``mesh`` (1-D: FSDP; 2-D ``(replicate, shard)``: HSDP).

    Returns the scope every forward must run in. ``trains=False`` (a reference model) shards
    the same way; its units are never reduced. With ``weights_from_rank0`` (rank 0's full state
    dict; ``{}`` on the other ranks, whose model may be an empty skeleton on the meta device)
    every rank's shards, and the parts kept whole, are filled from rank 0
    (:func:`fill_from_rank0`): only rank 0 ever holds the whole model.
    """
    whole = {id(p) for part in layout.kept_whole for p in part.parameters()}
    trainable_whole = [p for part in layout.kept_whole for p in part.parameters() if p.requires_grad]
    if trains and trainable_whole:
        raise ValueError(
            f"{len(trainable_whole)} parameters kept whole on every rank require grad: nothing would "
            "reduce their gradients across ranks (freeze them, e.g. model.init_args.freeze_vision: true)"
        )
    kwargs = {
        "mesh": mesh,
        "mp_policy": settings.mixed_precision(),
        "offload_policy": settings.offload(mesh.device_type),
    }
    for block in layout.blocks:
        fully_shard(block, **kwargs)
    scope = ShardedScope(layout.model)
    ignored = {p for p in layout.model.parameters() if id(p) in whole}
    fully_shard(scope, ignored_params=ignored or None, **kwargs)
    for unit in fsdp_units(scope):
        # Sum, not mean: the losses are already each rank's share of the whole batch's loss.
        # (A plain SUM collective: with a factor of 1 nothing is scaled; gloo has no PREMUL_SUM.)
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    if weights_from_rank0 is not None:
        fill_from_rank0(layout.model, weights_from_rank0, torch.device(mesh.device_type))
    # The first unit to run forward becomes FSDP's root: make it the scope now, while every rank
    # is here (a generation in `gathered` calls the blocks directly and would claim it). The
    # root keeps its parameters gathered after a forward: shard them again, so that the module
    # holds its sharded parameters when an optimizer is made over them.
    scope(lambda: None)
    scope.reshard()
    return scope


def fill_from_rank0(
    model: torch.nn.Module, full_state: dict[str, torch.Tensor], device: torch.device
) -> None:
    """Load rank 0's ``full_state`` into every rank's (sharded) ``model``; a collective.

    A rank whose model is a skeleton on the meta device gets storage first (``to_empty``); each
    full tensor is broadcast from rank 0 and every rank keeps its own shard of it (torch's
    ``set_model_state_dict(broadcast_from_rank0=True)``). Buffers outside the state dict (the
    rotary embeddings' ``inv_freq``, computed at construction, garbage after ``to_empty``) are
    broadcast from rank 0 too.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
    set_model_state_dict(model, full_state, options=options)
    for buffer in model.buffers():
        torch.distributed.broadcast(buffer, src=0)


def fsdp_units(scope: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in scope.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(scope: ShardedScope) -> Iterator[torch.nn.Module]:
    """Every unit unsharded at once for the block: the whole model on each rank, no collective
    inside, so ranks may run different amounts of work (generation). Costs a full copy in
    ``param_dtype``; leaves the model sharded again. Not for training (no gradient reduction)."""
    blocks = [unit for unit in fsdp_units(scope) if unit is not scope]
    for unit in [scope, *blocks]:
        unit.unshard()
    for unit in blocks:  # (the root is never resharded after its forward anyway)
        unit.set_reshard_after_forward(False, recurse=False)
    scope.held_gathered = True
    try:
        yield scope.model
    finally:
        scope.held_gathered = False
        for unit in blocks:
            unit.set_reshard_after_forward(True, recurse=False)
        for unit in [scope, *blocks]:
            unit.reshard()


def _device_of(mesh_device_type: str) -> torch.device:
    if mesh_device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh_device_type, torch.get_device_module(mesh_device_type).current_device())


def full_tensor(parameter: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The full value of ``parameter`` (or of a gradient), detached, in ``dtype`` (None: its own):
    gathered from every rank when it is a ``DTensor`` (a collective: every rank must call it, in
    the same order), else the tensor itself, cast.

    The shard is cast before the gather (the same values as casting after, half the traffic for
    fp32 -> bf16) and moved to the mesh's device first (FSDP2 CPU offload keeps shards on the
    CPU, and NCCL gathers device memory only).
    """
    parameter = parameter.detach()
    target = dtype or parameter.dtype
    if not isinstance(parameter, DTensor):
        return parameter.to(target)
    local = parameter.to_local().to(device=_device_of(parameter.device_mesh.device_type), dtype=target)
    shard = DTensor.from_local(
        local,
        parameter.device_mesh,
        parameter.placements,
        run_check=False,
        shape=parameter.shape,
        stride=parameter.stride(),
    )
    return shard.full_tensor()
