"""CPU seconds a training step of a zoom bench stage costs on this machine: what a stage's step
budget is sized by before it runs (docs/tool-use.md's protocol: dense 256 trains to its plateau or
to at least 3 times the tool path's compute).

Each stage is trained twice from the bench's own config (:func:`bench.zoom.stage_config`, seed 0,
the bench's data and small model), ``--short`` then ``--long`` steps, with no checkpoints and no
validation; each command's CPU seconds are counted whole (:func:`bench.grpo_runs.run_lvrl`:
the trainer and every process it starts, the dataloader's included), as the bench counts its
stages. The difference over the difference in steps is the cost of a step: the start (imports, the
model load, the first batches) and the export at the end cancel. Run it alone on the machine (a
second process's threads make each step dearer: torch's worker threads spin while they wait).

Usage: python bench/zoom_pace.py --data D [--oracle-data O] --model M [--stages sft-tool sft-dense-256]
       [--short 5] [--long 15] [--out bench/results/zoom_protocol/pace.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grpo_runs import run_lvrl  # noqa: E402
from bench.process_usage import Usage  # noqa: E402
from bench.zoom import STAGE_NAMES, STAGES, Stage, stage_config  # noqa: E402


def pace_config(stage: Stage, run_dir: Path, model: Path, data: str, steps: int) -> dict:
    """The bench's config of ``stage`` for ``steps`` steps, training only: no checkpoint (its
    writes would be charged to the steps), no validation, no plateau stop."""
    config = stage_config(stage, run_dir, model, data, seed=0, steps=steps, min_steps=steps)
    trainer = config["trainer"]
    trainer["limit_val_batches"] = 0
    trainer["callbacks"] = [
        c for c in trainer["callbacks"] if not c["class_path"].endswith(("RunCheckpoint", "EarlyStopping"))
    ]
    return config


def fit(config: dict, run_dir: Path) -> Usage:
    """``lvrl fit`` on ``config`` in ``run_dir``, counted as the bench counts a stage's attempt
    (:func:`bench.grpo_runs.run_lvrl`, which ends this script with the log's last line if it fails)."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_lvrl(run_dir, ["fit", "--config", str(run_dir / "config.yaml")])


def main() -> None:
    from evaluation.provenance import provenance

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the bench's --data (its zoom build)")
    parser.add_argument("--oracle-data", help="the bench's --oracle-data (the oracle crop's copy)")
    parser.add_argument("--model", required=True, help="the bench's small model (OUT/model-small)")
    parser.add_argument("--stages", nargs="+", choices=STAGE_NAMES, default=["sft-tool", "sft-dense-256"])
    parser.add_argument("--short", type=int, default=5, help="steps of the first run")
    parser.add_argument("--long", type=int, default=15, help="steps of the second run")
    parser.add_argument("--out", default="bench/results/zoom_protocol/pace.json")
    args = parser.parse_args()
    if not 0 < args.short < args.long:
        parser.error("--short and --long: 0 < short < long")
    stages = {stage.folder: stage for stage in STAGES}
    paces = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.stages:
            if stages[name].after:
                parser.error(f"--stages: {name} starts from another stage's export; only SFT stages")
            if stages[name].oracle and not args.oracle_data:
                parser.error(f"--stages: {name} trains on the oracle copy: give --oracle-data")
            data = args.oracle_data if stages[name].oracle else args.data
            runs = {}
            for steps in (args.short, args.long):
                run_dir = Path(tmp) / f"{name}-{steps}"
                runs[steps] = fit(pace_config(stages[name], run_dir, Path(args.model), data, steps), run_dir)
                print(f"{name}, {steps} steps: {runs[steps].cpu_seconds:.1f} CPU s", flush=True)
            extra = args.long - args.short
            paces[name] = {
                "cpu_seconds": {str(steps): round(usage.cpu_seconds, 2) for steps, usage in runs.items()},
                "wall_seconds": {str(steps): round(usage.wall_seconds, 2) for steps, usage in runs.items()},
                "cpu_seconds_a_step": round(
                    (runs[args.long].cpu_seconds - runs[args.short].cpu_seconds) / extra, 3
                ),
                "wall_seconds_a_step": round(
                    (runs[args.long].wall_seconds - runs[args.short].wall_seconds) / extra, 3
                ),
            }
            print(f"{name}: {paces[name]['cpu_seconds_a_step']} CPU s a step", flush=True)
    report = {**provenance([Path(sys.argv[0]).name, *sys.argv[1:]]), "steps": [args.short, args.long]}
    report["stages"] = paces
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
