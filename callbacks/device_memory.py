"""Peak accelerator memory per phase of a training step: the rollout, then the update.

What a CUDA run's memory plan (``lvrl plan``) is checked against: the caching allocator's peak
of memory handed to tensors since the phase began. The CUDA context, NCCL's buffers, a vLLM
engine's own reservation (``gpu_memory_utilization``) and the allocator's cached free blocks are
not in it (the plan's overhead line covers the first). Other devices have no such counter: on
them nothing is measured (``bench/plan_check.py`` reads a CPU run's from the kernel instead).
"""

from __future__ import annotations

import torch

GIB = 2**30


class PhasePeaks:
    """Peak allocated memory on ``device`` since the last :meth:`begin` (None off CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device if device.type == "cuda" else None

    def begin(self) -> None:
        """Start a phase: the peak counts from the memory allocated now."""
        if self.device is not None:
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gib(self) -> float | None:
        """The most memory allocated at once since :meth:`begin`, in GiB."""
        if self.device is None:
            return None
        return torch.cuda.max_memory_allocated(self.device) / GIB

    def held_gib(self) -> float | None:
        """Memory allocated now, in GiB (between steps: weights, optimizer states, caches)."""
        if self.device is None:
            return None
        return torch.cuda.memory_allocated(self.device) / GIB
