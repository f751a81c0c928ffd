"""Sequence-parallel configuration: sizes, head counts and the dealing of video frames."""

from __future__ import annotations

import pytest
import torch
from helpers.tolerances import EPS_BF16, assert_close_in_ulps

from parallel.encoding import temporal_patch_runs
from parallel.mesh import check_attention_heads, mesh_shape
from parallel.strategy import SequenceParallelStrategy


def test_mesh_shape_and_its_errors() -> None:
    shape = mesh_shape(8, 4)
    assert (shape.data, shape.sequence, shape.world_size) == (2, 4, 8)
    assert mesh_shape(2, 2).data == 1
    with pytest.raises(
        ValueError, match=r"sequence_parallel_size=3 does not divide the world size 4.*\[1, 2, 4\]"
    ):
        mesh_shape(4, 3)
    with pytest.raises(ValueError, match="must be >= 1"):
        mesh_shape(4, 0)


def test_ulysses_needs_heads_divisible_ring_does_not() -> None:
    check_attention_heads(28, 4, 4, "ulysses")  # Qwen2.5-VL-7B: 28 query heads, 4 KV heads
    check_attention_heads(28, 4, 8, "ring")
    with pytest.raises(ValueError, match=r"28 attention heads.*sequence_parallel_size=8.*ring"):
        check_attention_heads(28, 4, 8, "ulysses")
    with pytest.raises(ValueError, match="one of"):
        check_attention_heads(28, 4, 2, "striped")


def test_strategy_rejects_bad_arguments_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match="sequence_parallel_attention must be one of"):
        SequenceParallelStrategy(sequence_parallel_attention="flash")
    with pytest.raises(ValueError, match="sequence_parallel_size must be >= 1"):
        SequenceParallelStrategy(sequence_parallel_size=0)


def test_temporal_patches_are_dealt_in_order_and_evenly() -> None:
    grids = torch.tensor([[5, 4, 4], [3, 2, 4]])
    runs = temporal_patch_runs(grids, 2)
    assert runs == [[(0, 0, 4)], [(0, 4, 1), (1, 0, 3)]]
    runs = temporal_patch_runs(grids, 3)  # 8 patches: 3 + 3 + 2
    assert runs == [[(0, 0, 3)], [(0, 3, 2), (1, 0, 1)], [(1, 1, 2)]]
    assert temporal_patch_runs(torch.tensor([[1, 2, 2]]), 2) == [[(0, 0, 1)], []]
    # Every patch of every video exactly once, in order.
    for parts in (1, 2, 3, 4, 7):
        flat = [(v, t + i) for run in temporal_patch_runs(grids, parts) for v, t, n in run for i in range(n)]
        assert flat == [(0, t) for t in range(5)] + [(1, t) for t in range(3)]


@pytest.mark.gpu
def test_flash_attention_kernel_matches_sdpa_on_gpu() -> None:
    """On CUDA with flash-attn installed, Ulysses' local attention is flash-attn's; same result as SDPA."""
    pytest.importorskip("flash_attn", reason="flash-attn is not installed (make setup-gpu installs it)")
    import torch.nn.functional as F

    from parallel.ulysses import causal_attention

    generator = torch.Generator(device="cuda").manual_seed(0)
    query = torch.randn(2, 8, 300, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
    key, value = (
        torch.randn(2, 2, 300, 64, device="cuda", dtype=torch.bfloat16, generator=generator) for _ in "kv"
    )
    out = causal_attention(query, key, value, 0.125)
    expected = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=0.125, enable_gqa=True)
    # Both kernels accumulate in float32 and round the output to bfloat16 once (<= 1/2 ulp each);
    # flash-attn also rounds the softmax weights to bfloat16 before the value product (<= 1 ulp
    # of the output's scale): 2 bfloat16 ulps of the largest |output|. A wrong causal mask,
    # scale or GQA head mapping changes outputs by O(1), dozens of bars.
    assert_close_in_ulps(out, expected, eps=EPS_BF16, ulps=2, reason="flash-attn vs SDPA, bfloat16")
