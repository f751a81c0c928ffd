"""Rollout engines that record what the trainer asks of them, for weight-sync and life-cycle tests."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch

from rollout.base import PolicyHandle, RolloutEngine, RolloutRequest, RolloutResult, SamplingConfig
from rollout.hf_engine import TransformersEngine
from rollout.weight_sync import fused_module_key

# vLLM's fused layers of Qwen2.5-VL (its `packed_modules_mapping`, vllm 0.32): a recording engine
# that groups like vLLM lets a test check that no fused layer is split across two calls.
QWEN2_5_VL_PACKED_MODULES = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
    "qkv": ["qkv"],
}


class WeightRecorder(RolloutEngine):
    """Keeps a copy of every tensor it is handed, call by call, grouped like vLLM.

    Copies, as an engine loading weights into its own memory does: the sync's tensors are freed
    after each call, which the sync's peak measurement relies on.
    """

    def __init__(self, dtype: str | None = "float32", keep_values: bool = True) -> None:
        self.dtype = dtype
        self.keep_values = keep_values
        self.calls: list[list[tuple[str, torch.Tensor | None]]] = []
        """One entry per ``update_weights`` call: (name, copy of the tensor or None)."""
        self.call_bytes: list[int] = []
        self.finished = 0

    def start(self, policy: PolicyHandle) -> None:
        pass

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        raise NotImplementedError("a weight recorder does not sample")

    def weight_group(self, name: str) -> str:
        return fused_module_key(name, QWEN2_5_VL_PACKED_MODULES)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        received = list(named_tensors)
        self.calls.append([(n, t.clone() if self.keep_values else None) for n, t in received])
        self.call_bytes.append(sum(t.numel() * t.element_size() for _, t in received))

    def finish_weight_update(self) -> None:
        self.finished += 1

    def received(self) -> dict[str, torch.Tensor | None]:
        """Every name handed over, with its tensor (a name twice is an error)."""
        names = [name for call in self.calls for name, _ in call]
        assert len(names) == len(set(names)), "a parameter was handed over twice"
        return {name: tensor for call in self.calls for name, tensor in call}


class CallRecorder(TransformersEngine):
    """The Transformers engine (it samples with the policy itself) as a colocated engine would be
    driven: it takes weight syncs, and logs each engine call in ``calls`` (a list the test shares)."""

    needs_weight_sync = True

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def start(self, policy: PolicyHandle) -> None:
        self.calls.append("start")
        super().start(policy)

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        self.calls.append("generate")
        return super().generate(requests, sampling)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.calls.append("update_weights")

    def finish_weight_update(self) -> None:
        self.calls.append("finish_weight_update")

    def sleep(self) -> None:
        self.calls.append("sleep")

    def wake(self) -> None:
        self.calls.append("wake")


class FlakyEngine(RolloutEngine):
    """A real engine's life cycle with scripted failures: raises on the first ``fail`` generations,
    or sleeps ``hang_s`` in each; raises on the first ``fail_sync`` weight loads."""

    def __init__(self, fail: int = 0, hang_s: float = 0.0, fail_sync: int = 0) -> None:
        self.fail, self.hang_s, self.fail_sync = fail, hang_s, fail_sync
        self.starts: list[str] = []
        self.pushed: list[list[str]] = []

    def start(self, policy: PolicyHandle) -> None:
        self.starts.append(policy.model_path)

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        time.sleep(self.hang_s)
        if self.fail:
            self.fail -= 1
            raise ConnectionError("engine core died")
        return [RolloutResult() for _ in requests]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.fail_sync:
            self.fail_sync -= 1
            raise ConnectionError("engine core died loading weights")
        self.pushed.append([name for name, _ in named_tensors])
