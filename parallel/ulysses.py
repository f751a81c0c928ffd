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
from parallel.packing import SHARED, visible
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
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    shard: SequenceShard,
    scaling: float,
    segments: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a sequence split over ``shard.group``; returns ``(B, L/P, H, D)``.

    ``query`` is ``(B, H, L/P, D)``, ``key``/``value`` ``(B, H_kv, L/P, D)``, all already
    rotated with the shard's own positions. ``segments`` (``(B, L)``, packed rows): attend by
    :func:`parallel.packing.visible` instead of plainly causally.
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
    out = causal_attention(query, key, value, scaling)
    if segments is not None:
        out = _redo_completion_queries(out, query, key, value, scaling, segments)
    return _heads_to_sequence(out, shard).transpose(1, 2)


def _redo_completion_queries(
    out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    segments: torch.Tensor,
) -> torch.Tensor:
    """``out`` with the queries of completion segments attended again under the segment rule.

    The plain causal pass is already right for the shared prompt (everything before a prompt
    position is prompt); a completion position must not see the completions packed before
    it. Those are few (G completions against a long prompt), so their scores are computed
    against the whole row with an explicit mask.
    """
    length = segments.shape[1]
    index = torch.arange(length, device=segments.device)
    rows = []
    for row in range(segments.shape[0]):
        queries = torch.nonzero(segments[row] > SHARED).squeeze(1)
        if not len(queries):
            rows.append(out[row])
            continue
        mask = visible(
            queries[:, None], index[None, :], segments[row, queries][:, None], segments[row][None, :]
        )
        redone = F.scaled_dot_product_attention(
            query[row : row + 1, :, queries],
            key[row : row + 1],
            value[row : row + 1],
            attn_mask=mask,
            scale=scaling,
            enable_gqa=key.shape[1] != query.shape[1],
        )
        rows.append(out[row].index_copy(1, queries, redone[0].to(out.dtype)))
    return torch.stack(rows)


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
