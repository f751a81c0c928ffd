"""Rollout correction under a forced engine/trainer mismatch, measured on the demo (one run, a table).

Settings, each a GRPO run from the same SFT export and seed (``--seeds`` of them):

    float32       engine and trainer both float32: no mismatch (the reference curve)
    mismatch      the mismatch, no correction (the engine's log-probs are the old policy)
    mismatch+TIS  the mismatch, truncated importance sampling (token level, C = 2)
    mismatch+MIS  the mismatch, masked importance sampling (geometric level, [0.5, 2])

The mismatch is the engine in bfloat16 (``--mismatch bf16``: what GPU runs do; the trainer
stays float32; the module refuses it uncorrected, so that setting is skipped), or the engine
sampling from perturbed weights (``--mismatch weights``, :class:`PerturbedWeights`: every
weight it receives times ``1 + N(0, weight_noise^2)``, drawn anew at each sync; it samples from
that policy and reports that policy's log-probs, so the behaviour policy really differs from the
trainer's and the importance weights have something to correct), or Gaussian noise on the
log-probs the engine reports (``--mismatch noise``, :class:`PerturbedLogprobs`; kept for the
November runs: the tokens stay the engine's own, so the right importance weight is 1 and
TIS/MIS weights are noise: it cannot show a correction restoring anything). Printed per
setting: the mean training-rollout accuracy over the last ``--tail`` steps (mean and spread over
seeds), the mean trainer-engine gap, and the correction's weight statistics.

Usage: python bench/mismatch.py --sft runs/demo/sft/hf [--steps 100] [--seeds 0 1 2]
       [--mismatch weights|bf16|noise] [--weight-noise 0.05] [--noise-std 0.3] [--out runs/mismatch]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.grpo_runs import column, demo_grpo_config, fit_once, markdown, mean_and_spread, rollout_callback  # noqa: E402
from rollout.base import PolicyHandle, RolloutEngine, RolloutRequest, RolloutResult, SamplingConfig  # noqa: E402

CORRECTIONS = {
    "TIS": {"mode": "truncate", "level": "token", "upper": 2.0},
    # Geometric: per-token noise summed over a completion would mask nearly every sequence.
    "MIS": {"mode": "mask", "level": "geometric", "upper": 2.0, "lower": 0.5},
}


class PerturbedLogprobs(RolloutEngine):
    """Another engine whose reported log-probs get N(0, std^2) noise (seeded per call): a
    behaviour policy that is not the trainer's, by a known amount. Sampling is untouched."""

    def __init__(self, engine: RolloutEngine, std: float = 0.3, seed: int = 0) -> None:
        self.engine = engine
        self.std = std
        self.generator = torch.Generator().manual_seed(seed)
        self.needs_weight_sync = engine.needs_weight_sync
        self.dtype = engine.dtype

    def start(self, policy: PolicyHandle) -> None:
        self.engine.start(policy)

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        results = self.engine.generate(requests, sampling)
        for result in results:
            for completion in result.completions:
                noise = torch.randn(len(completion.logprobs), generator=self.generator) * self.std
                # A log-probability stays <= 0 whatever the noise.
                completion.logprobs = [
                    min(0.0, lp + float(n)) for lp, n in zip(completion.logprobs, noise, strict=True)
                ]
        return results

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.update_weights(named_tensors)

    def weight_group(self, name: str) -> str:
        return self.engine.weight_group(name)

    def finish_weight_update(self) -> None:
        self.engine.finish_weight_update()

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    def shutdown(self) -> None:
        self.engine.shutdown()


class PerturbedWeights(PerturbedLogprobs):
    """Another engine that samples from perturbed weights: each floating-point weight it receives
    is multiplied by ``1 + N(0, std^2)`` (a fresh draw at every sync, seeded), and the engine's
    policy is perturbed the same way as soon as it starts. Its log-probs are its own policy's:
    the behaviour policy differs from the trainer's by a known amount, and is reported right."""

    def start(self, policy: PolicyHandle) -> None:
        from rollout.weight_sync import sync_weights

        self.engine.start(policy)
        if self.needs_weight_sync and policy.model is not None:
            sync_weights(self, policy.model.named_parameters())

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        return self.engine.generate(requests, sampling)

    def perturbed(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named_tensors:
            if tensor.is_floating_point():
                noise = torch.randn(tensor.shape, generator=self.generator, dtype=torch.float32)
                tensor = (tensor.float() * (1.0 + self.std * noise)).to(tensor.dtype)
            yield name, tensor

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.update_weights(list(self.perturbed(named_tensors)))


def engine_config(
    setting: str, mismatch: str, noise_std: float, seed: int, weight_noise: float = 0.05
) -> dict:
    vllm_args = {"max_model_len": 1024, "dtype": "float32"}
    vllm = {"class_path": "rollout.vllm_engine.VLLMEngine", "init_args": vllm_args}
    if setting == "float32":
        return vllm
    if mismatch == "bf16":
        vllm_args["dtype"] = "bfloat16"
        return vllm
    if mismatch == "weights":
        perturbed = {"engine": vllm, "std": weight_noise, "seed": seed}
        return {"class_path": "bench.mismatch.PerturbedWeights", "init_args": perturbed}
    noisy = {"engine": vllm, "std": noise_std, "seed": seed}
    return {"class_path": "bench.mismatch.PerturbedLogprobs", "init_args": noisy}


def run(setting: str, seed: int, args: argparse.Namespace) -> Path:
    run_dir = Path(args.out) / f"{setting}-seed{seed}"
    config = demo_grpo_config(run_dir, args.sft, args.data, seed, args.steps)
    rollout_callback(config)["init_args"]["engine"] = engine_config(
        setting, args.mismatch, args.noise_std, seed, args.weight_noise
    )
    correction = CORRECTIONS.get(setting.split("+")[-1]) if "+" in setting else None
    config["model"]["init_args"]["rollout_correction"] = correction
    return fit_once(run_dir, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft", required=True, help="the SFT export GRPO starts from")
    parser.add_argument("--data", default="data/synth", help="the synthetic shards")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--tail", type=int, default=20, help="steps at the end whose rollout accuracy is averaged"
    )
    parser.add_argument("--mismatch", choices=["weights", "bf16", "noise"], default="weights")
    parser.add_argument("--noise-std", type=float, default=0.3, help="--mismatch noise: the log-probs' noise")
    parser.add_argument(
        "--weight-noise",
        type=float,
        default=0.05,
        help="--mismatch weights: the relative noise on each weight",
    )
    parser.add_argument("--out", default="runs/mismatch")
    parser.add_argument(
        "--settings", nargs="+", default=["float32", "mismatch", "mismatch+TIS", "mismatch+MIS"]
    )
    args = parser.parse_args()
    rows = []
    for setting in args.settings:
        if setting == "mismatch" and args.mismatch == "bf16":
            print("skipping 'mismatch' for bf16: the module refuses a bf16 engine without rollout_correction")
            continue
        per_seed = [run(setting, seed, args) for seed in args.seeds]
        accuracy = [statistics.mean(column(m, "rollout/accuracy")[-args.tail :]) for m in per_seed]
        gap = [statistics.mean(column(m, "rollout/logprob_diff_mean")) for m in per_seed]
        weight = [statistics.mean(column(m, "correction/weight_mean") or [float("nan")]) for m in per_seed]
        masked = [
            statistics.mean(column(m, "correction/masked_fraction") or [float("nan")]) for m in per_seed
        ]
        rows.append([setting, *(mean_and_spread(v) for v in (accuracy, gap, weight, masked))])
    print(
        f"\n{args.mismatch} mismatch, {args.steps} steps, seeds {args.seeds}, "
        f"accuracy over the last {args.tail} steps"
    )
    print(
        markdown(["setting", "rollout accuracy", "mean gap (nats)", "weight mean", "masked fraction"], rows)
    )


if __name__ == "__main__":
    main()
