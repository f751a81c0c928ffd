"""bench/mismatch.py's perturbed-weights engine: the engine samples from weights the trainer does
not have (each times 1 + N(0, std^2), drawn anew at each sync, seeded) and reports its own
log-probs untouched, so the behaviour policy really differs from the trainer's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from bench.mismatch import Outcome, PerturbedWeights, verdict
from rollout.base import (
    Completion,
    PolicyHandle,
    RolloutEngine,
    RolloutRequest,
    RolloutResult,
    SamplingConfig,
)


class Recording(RolloutEngine):
    def __init__(self) -> None:
        self.received: list[dict[str, torch.Tensor]] = []
        self.finished = 0
        self.started = False

    def start(self, policy: PolicyHandle) -> None:
        self.started = True

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        return [RolloutResult([Completion([5, 6], [-0.25, -1.5], "x", "stop")]) for _ in requests]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.received.append({name: tensor.clone() for name, tensor in named_tensors})

    def finish_weight_update(self) -> None:
        self.finished += 1


def test_the_engine_gets_perturbed_weights_at_start_and_at_every_sync() -> None:
    model = torch.nn.Linear(64, 32)
    with torch.no_grad():
        model.weight.fill_(1.0)
    inner = Recording()
    engine = PerturbedWeights(inner, std=0.05, seed=3)
    engine.start(PolicyHandle("dir", model, None))
    assert inner.started and inner.finished == 1  # the policy it starts from is perturbed too
    weight = torch.cat([bucket["weight"].flatten() for bucket in inner.received if "weight" in bucket])
    relative = weight - 1.0
    assert weight.shape == (64 * 32,) and relative.abs().max() > 0
    # 2,048 draws of N(0, 0.05^2): their spread is 0.05 within a few percent (sd of the sd ~1.6%).
    assert abs(float(relative.std()) - 0.05) < 0.005 and abs(float(relative.mean())) < 0.005
    first = dict(inner.received[0])
    engine.update_weights(model.named_parameters())  # a later sync: a fresh draw
    assert not torch.equal(
        inner.received[-1]["weight"], first.get("weight", inner.received[-1]["weight"] * 0)
    )
    # Another engine with the same seed perturbs the same way.
    again = Recording()
    PerturbedWeights(again, std=0.05, seed=3).start(PolicyHandle("dir", model, None))
    assert all(
        torch.equal(a[name], b[name])
        for a, b in zip(inner.received, again.received, strict=False)
        for name in a
    )


def test_its_log_probs_are_its_own() -> None:
    engine = PerturbedWeights(Recording(), std=0.05, seed=0)
    (result,) = engine.generate([None], SamplingConfig(n=1))  # type: ignore[list-item]
    assert result.completions[0].logprobs == [-0.25, -1.5]


def outcomes(sampled: dict[str, list[float]]) -> dict[str, list[Outcome]]:
    """Runs of each setting with the given held-out sampled accuracies (one per seed)."""
    return {
        setting: [
            Outcome(seed, [0.3], 0.0, float("nan"), float("nan"), {"greedy": 0.0, "sampled": value}, {})
            for seed, value in enumerate(values)
        ]
        for setting, values in sampled.items()
    }


def test_the_verdict_reads_the_stated_target() -> None:
    # Uncorrected falls 0.10 short of float32; TIS wins back 0.06 (60%), MIS 0.04 (40%).
    runs = outcomes(
        {
            "float32": [0.40, 0.40, 0.40],
            "mismatch": [0.30, 0.30, 0.30],
            "mismatch+TIS": [0.36, 0.36, 0.36],
            "mismatch+MIS": [0.34, 0.34, 0.34],
        }
    )
    assert verdict(runs).startswith("target not met") and "TIS 60%, MIS 40%" in verdict(runs)
    runs["mismatch+MIS"] = outcomes({"m": [0.35, 0.35, 0.35]})["m"]  # exactly half: met
    assert verdict(runs).startswith("target met")
    # A mismatch that costs less than 3 points leaves nothing to win back: not met, whatever follows.
    runs["mismatch"] = outcomes({"m": [0.38, 0.38, 0.39]})["m"]
    assert verdict(runs).startswith("target not met: the mismatch cost uncorrected GRPO +0.017")
    del runs["mismatch+MIS"]
    assert verdict(runs).startswith("target not judged")
