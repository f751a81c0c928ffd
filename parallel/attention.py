"""The ``lvrl_sequence_parallel`` attention implementation, registered with transformers.

A model loaded (or switched with ``model.set_attn_implementation``) to this name attends with
PyTorch SDPA as usual, and with Ulysses or ring attention when the forward call carries a
``sequence_shard=`` keyword (transformers passes extra forward keywords down to the attention
function), following the segment rule of packed rows when it also carries
``sequence_segments=``. No library code is patched: this is the registry transformers provides
for it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from parallel.ring import ring_attention
from parallel.shard import SequenceShard
from parallel.ulysses import ulysses_attention

SEQUENCE_PARALLEL_ATTENTION = "lvrl_sequence_parallel"


def sequence_parallel_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sequence_shard: SequenceShard | None = None,
    sequence_segments: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``(B, H, L, D)`` in, ``(B, L, H, D)`` out.

    ``sequence_segments``: for rows packed by :func:`parallel.packing.shared_prompt_rows`, the
    ``(B, whole length)`` segment ids in row order; attention then follows
    :func:`parallel.packing.visible` instead of the plain causal mask.
    """
    if sequence_shard is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if attention_mask is not None:
        raise ValueError(
            "sequence-parallel attention builds its own causal mask; call the model with attention_mask=None "
            "(rows right-padded)"
        )
    if dropout:
        raise ValueError("sequence-parallel attention does not implement attention dropout")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    attend = ulysses_attention if sequence_shard.attention == "ulysses" else ring_attention
    return attend(query, key, value, sequence_shard, scale, segments=sequence_segments), None


def register_sequence_parallel_attention() -> str:
    """Register the implementation (idempotent) and return its name."""
    AttentionInterface.register(SEQUENCE_PARALLEL_ATTENTION, sequence_parallel_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SEQUENCE_PARALLEL_ATTENTION, sdpa_mask)
    return SEQUENCE_PARALLEL_ATTENTION
