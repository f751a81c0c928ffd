"""Does the answer stay with the reasoning? The demo's GRPO with and without the
``reasoning_agreement`` reward, over seeds, each evaluated on the 400 held-out questions.

Run as a new user would, the demo's GRPO raised greedy accuracy while the share of answers
whose reasoning names the chosen option fell: the outcome reward reads only the answer. This
runs, per seed, the demo's GRPO config as it is (``outcome``: 0.9 accuracy + 0.1 format) and
with ``reasoning_agreement`` added (``outcome+agreement``, weight ``--weight``), evaluates
each export greedily on the validation and test splits (as ``make demo`` does), and prints
held-out accuracy and agreement per setting (mean ± spread over seeds), with the SFT start's.

Usage: python bench/agreement.py --sft runs/demo/sft/hf [--data data/synth] [--steps 300]
       [--seeds 0 1 2] [--weight 0.1] [--out runs/agreement]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grpo_runs import (
    column,
    demo_grpo_config,
    evaluate,
    fit_once,
    markdown,
    mean_and_spread,
    rollout_callback,
)


def held_out(metrics: Path) -> tuple[float, float]:
    """(greedy accuracy, share of decided answers whose reasoning names them)."""
    return column(metrics, "val/accuracy")[-1], column(metrics, "val/reasoning_agreement")[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft", required=True, help="the SFT export GRPO starts from")
    parser.add_argument("--data", default="data/synth", help="the synthetic shards")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--weight", type=float, default=0.1, help="reasoning_agreement's weight")
    parser.add_argument("--out", default="runs/agreement")
    args = parser.parse_args()
    out = Path(args.out)
    start = held_out(evaluate(args.sft, out / "sft-eval", args.data))
    rows = [["SFT start", f"{start[0]:.3f}", f"{start[1]:.3f}", ""]]
    settings = ("outcome", "outcome+agreement")
    scores: dict[str, list[tuple[float, float]]] = {setting: [] for setting in settings}
    # Seed by seed, both settings: a run cut short still leaves paired results.
    for seed in args.seeds:
        for setting in settings:
            run_dir = out / f"{setting}-seed{seed}"
            config = demo_grpo_config(run_dir, args.sft, args.data, seed, args.steps)
            if setting == "outcome+agreement":
                rewards = [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1}]
                rewards.append({"name": "reasoning_agreement", "weight": args.weight})
                rollout_callback(config)["init_args"]["rewards"] = rewards
            fit_once(run_dir, config, then=lambda d: evaluate(d / "hf", d / "eval", args.data))
            scores[setting].append(held_out(evaluate(run_dir / "hf", run_dir / "eval", args.data)))
    for setting in settings:
        per_seed = ", ".join(f"{a:.3f}/{g:.3f}" for a, g in scores[setting])
        rows.append(
            [
                setting,
                mean_and_spread([a for a, _ in scores[setting]]),
                mean_and_spread([g for _, g in scores[setting]]),
                per_seed,
            ]
        )
    print(f"\n{args.steps} GRPO steps, seeds {args.seeds}, 400 held-out questions, greedy answers")
    print(
        markdown(["setting", "accuracy", "reasoning names the answer", "per seed (accuracy/agreement)"], rows)
    )


if __name__ == "__main__":
    main()
