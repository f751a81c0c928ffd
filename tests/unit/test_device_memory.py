"""callbacks.device_memory: each phase's peak allocated CUDA memory; nothing measured elsewhere."""

from __future__ import annotations

import pytest
import torch

from callbacks.device_memory import GIB, PhasePeaks


def test_off_cuda_nothing_is_measured() -> None:
    peaks = PhasePeaks(torch.device("cpu"))
    peaks.begin()
    assert peaks.peak_gib() is None and peaks.held_gib() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_a_phase_peak_counts_from_its_begin() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    peaks = PhasePeaks(device)
    size = 256 * 2**20  # bytes: far above the allocator's rounding
    big = torch.empty(size, dtype=torch.uint8, device=device)
    del big  # freed: an earlier phase's peak
    peaks.begin()
    held = peaks.held_gib()
    assert held is not None and peaks.peak_gib() == held
    small = torch.empty(size // 4, dtype=torch.uint8, device=device)
    peak = peaks.peak_gib()
    assert peak is not None and peak * GIB == pytest.approx(held * GIB + size // 4, abs=2**20)
    assert peaks.held_gib() == peak
    del small
