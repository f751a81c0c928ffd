"""Ulysses attention: trade the sequence split for a head split, attend, trade back.

Each of the P ranks holds ``L / P`` tokens of all ``H`` heads. One all-to-all gives each rank
all ``L`` tokens of ``H / P`` heads, so plain causal attention over the whole sequence runs
locally; a second all-to-all returns the outputs to the sequence split. Communication per
layer is a constant multiple of the activations, independent of P (DeepSpeed-Ulysses,
arXiv 2309.14509). Heads must divide by P; key/value heads that do not (grouped-query
attention with fewer KV heads than ranks) are repeated up to the query heads first.
Autograd flows through :func:`parallel.collectives.all_to_all`. The local attention is
flash-attn's kernel on a CUDA device in half precision when flash-attn is installed, PyTorch
SDPA otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from parallel.collectives import all_to_all
from parallel.shard import SequenceShard


def _sequence_to_heads(x: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
    """``(B, heads, L/P, D)`` on each rank -> ``(B, heads/P, L, D)``: rank j gets head chunk j."""
    chunks = [c.contiguous() for c in x.chunk(shard.size, dim=1)]
    received = all_to_all(chunks, shard.group)
    return torch.cat(received, dim=2)  # received[j] is rank j's sequence slice: sequence order


def _heads_to_sequence(x: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
    """The inverse: ``(B, heads/P, L, D)`` -> ``(B, heads, L/P, D)``."""
    chunks = [c.contiguous() for c in x.chunk(shard.size, dim=2)]
    received = all_to_all(chunks, shard.group)
    return torch.cat(received, dim=1)  # received[j] is head chunk j: head order


def ulysses_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, shard: SequenceShard, scaling: float
) -> torch.Tensor:
    """Causal attention of a sequence split over ``shard.group``; returns ``(B, L/P, H, D)``.

    ``query`` is ``(B, H, L/P, D)``, ``key``/``value`` ``(B, H_kv, L/P, D)``, all already
    rotated with the shard's own positions.
    """
    heads, kv_heads, size = query.shape[1], key.shape[1], shard.size
    if heads % size:
        raise ValueError(
            f"Ulysses needs the {heads} attention heads to divide by the sequence-parallel size {size}; "
            "use sequence-parallel attention 'ring' or a size that divides the heads"
        )
    if kv_heads % size:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    query, key, value = (_sequence_to_heads(t, shard) for t in (query, key, value))
    return _heads_to_sequence(causal_attention(query, key, value, scaling), shard).transpose(1, 2)


def causal_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Causal attention of whole sequences, ``(B, H, L, D)`` in and out; GQA when ``key`` has fewer heads."""
    flash = _flash_attention()
    if flash is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        # flash-attn takes (B, L, H, D) and handles fewer key/value heads itself.
        out = flash(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            causal=True,
            softmax_scale=scaling,
        )
        return out.transpose(1, 2)
    return F.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
    )


def _flash_attention() -> Callable[..., torch.Tensor] | None:
    """flash-attn's ``flash_attn_func`` if installed (GPU machines), else None."""
    try:
        from flash_attn import flash_attn_func
    except ImportError:
        return None
    return flash_attn_func
