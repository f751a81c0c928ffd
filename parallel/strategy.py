"""``SequenceParallelStrategy``: Lightning's DDP launcher and collectives, with a (data, sequence) mesh.

What it changes relative to :class:`~lightning.pytorch.strategies.DDPStrategy`:

- it builds the device mesh (:mod:`parallel.mesh`) after the process group, checks the sizes
  and the model's heads against the attention kind, and hands the LightningModule a
  :class:`~parallel.shard.SequenceShard` (``pl_module.sequence_shard``) for the sequence axis
  (the module implements :class:`~parallel.contract.SequenceParallelModule`);
- data sharding follows the ``data`` axis: ``data_parallel_rank``/``data_parallel_size`` are
  what the DataModule reads, so sequence-parallel peers receive the same samples, and the
  module's torchmetrics sync over the data axis only (each question counted once);
- gradients are reduced explicitly, once per optimizer update, over the right axes: **summed**
  over the sequence axis (each peer holds its slice's share of the gradient) and **averaged**
  over the data axis. The model is therefore not wrapped in ``DistributedDataParallel``, whose
  hooks would average over every rank on every backward (micro-batches included). Automatic
  optimization gets the reduction between backward and the optimizer step (before gradient
  clipping); a manually optimizing module calls :meth:`reduce_gradients` itself before it clips.

Works on CPU (gloo) and GPU (nccl), under ``lvrl fit`` with ``trainer.devices=N`` or under
``torchrun``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.distributed.device_mesh import DeviceMesh
from torch.optim import Optimizer
from torchmetrics import Metric

from parallel.contract import SequenceParallelModule, require_sequence_parallel_module
from parallel.mesh import MeshShape, build_device_mesh, check_attention_heads, mesh_shape
from parallel.shard import ATTENTION_KINDS, SequenceShard


class SequenceParallelStrategy(DDPStrategy):
    """Data x sequence parallelism for lvrl's modules.

    Args:
        sequence_parallel_size: ranks that split one sequence (must divide the world size).
        sequence_parallel_attention: ``ulysses`` (all-to-all over heads; heads must divide by the
            size) or ``ring`` (key/value blocks passed around; any head count).
        process_group_backend: ``gloo``/``nccl``; None picks by device.
        timeout: collective time-out.
        start_method: how ``trainer.devices > 1`` processes start (``popen``: re-run the command).
    """

    strategy_name = "sequence_parallel"

    def __init__(
        self,
        sequence_parallel_size: int = 2,
        sequence_parallel_attention: str = "ulysses",
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(minutes=30),
        start_method: str = "popen",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            process_group_backend=process_group_backend, timeout=timeout, start_method=start_method, **kwargs
        )
        # Checked against the world size and the model's heads once both are known (setup).
        if sequence_parallel_size < 1:
            raise ValueError(f"sequence_parallel_size must be >= 1, got {sequence_parallel_size}")
        if sequence_parallel_attention not in ATTENTION_KINDS:
            raise ValueError(
                f"sequence_parallel_attention must be one of {ATTENTION_KINDS}, "
                f"got {sequence_parallel_attention!r}"
            )
        self.sequence_parallel_size = sequence_parallel_size
        self.sequence_parallel_attention = sequence_parallel_attention
        self.shape: MeshShape | None = None
        self.device_mesh: DeviceMesh | None = None

    # -- mesh ---------------------------------------------------------------------------------
    def _configure_launcher(self) -> None:
        # Called while the Trainer is built, once devices and nodes are known and before any
        # process is launched: the earliest point where a bad layout can be refused.
        mesh_shape(self.num_nodes * self.num_processes, self.sequence_parallel_size)
        super()._configure_launcher()

    def setup_environment(self) -> None:
        self.shape = mesh_shape(self.num_nodes * self.num_processes, self.sequence_parallel_size)
        super().setup_environment()  # initialises the default process group
        self.device_mesh = build_device_mesh(self.root_device.type, self.shape)

    @property
    def data_parallel_rank(self) -> int:
        return self.global_rank // self.sequence_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.sequence_parallel_size

    @property
    def sequence_shard(self) -> SequenceShard | None:
        """The sequence axis for the module; None when sequences are not split."""
        if self.device_mesh is None or self.sequence_parallel_size == 1:
            return None
        return SequenceShard(self.device_mesh.get_group("sequence"), self.sequence_parallel_attention)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        module = require_sequence_parallel_module(self.lightning_module, type(self).__name__)
        check_module_fits(
            module,
            self.sequence_parallel_size,
            self.sequence_parallel_attention,
            fitting=trainer.state.fn == TrainerFn.FITTING,
        )
        module.sequence_shard = self.sequence_shard
        if self.sequence_parallel_size > 1 and self.device_mesh is not None:
            # Peers evaluate the same questions: metrics sync over the data axis only, so that
            # every question is counted once.
            for metric in self.lightning_module.modules():
                if isinstance(metric, Metric):
                    metric.process_group = self.device_mesh.get_group("data")

    # -- gradients ----------------------------------------------------------------------------
    def configure_ddp(self) -> None:
        # No DistributedDataParallel wrapper: gradients are reduced in `reduce_gradients`. The
        # replicas start from identical weights (the same checkpoint); make sure of it.
        assert self.model is not None
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            dist.broadcast(tensor.data, src=0)

    def reduce_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum over the sequence axis, average over the data axis, in one all-reduce.

        A rank that produced no gradient (no row trained) contributes zeros; if no rank did,
        the gradients stay ``None`` so the optimizer skips the update, as on one process.
        """
        trainable = [p for p in parameters if p.requires_grad]
        if self.world_size == 1 or not trainable:
            return
        device = trainable[0].device
        produced = torch.tensor([float(any(p.grad is not None for p in trainable))], device=device)
        dist.all_reduce(produced, op=dist.ReduceOp.MAX)
        if not produced.item():
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.data_parallel_size
        offset = 0
        for parameter in trainable:
            count = parameter.numel()
            parameter.grad = flat[offset : offset + count].view_as(parameter).clone()
            offset += count

    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: L.LightningModule | torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        module = self.lightning_module
        if module is None or not module.automatic_optimization:
            return super().optimizer_step(optimizer, closure, model, **kwargs)

        def closure_then_reduce() -> Any:
            result = closure()
            self.reduce_gradients(p for group in optimizer.param_groups for p in group["params"])
            return result

        return super().optimizer_step(optimizer, closure_then_reduce, model, **kwargs)


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
