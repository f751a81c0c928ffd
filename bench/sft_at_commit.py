"""The demo's SFT stage and its greedy evaluation at a given commit, on one fixed copy of the
data: what bisects a change in the SFT figure between code versions.

Clones the repository at ``--commit`` into ``--work`` and runs there, with this checkout's
virtual environment (the dependencies did not change over the commits this is meant for; the
record says so), what ``make demo``'s first stage runs: ``lvrl model build --family F --preset
small`` on the data's first training shard, ``lvrl fit --config configs/demo/sft.yaml`` and
``lvrl validate`` of the export on the validation and test splits (400 questions), greedy answers
only. The data is ``--data`` as it is (not rebuilt by the commit's generator, whose output was
not byte-stable before 617409d), so two commits differ only by their code.

Writes ``--out/<commit>.json`` (command, the recorder's and the evaluated commit, machine, date,
load, seconds, overall and per-category accuracy as ``lvrl validate`` printed them) and the three
commands' output beside it.

Usage: python bench/sft_at_commit.py --work /tmp/sft-at --out bench/results/NAME --commit REV
       --data DIR [--family qwen3_vl] [--beside-other-work]
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fresh_clone import LoadSampler, clean_environment, fresh_clone, machine, recorder_arguments, timed  # noqa: E402
from evaluation.provenance import commit as recorder_commit  # noqa: E402

ACCURACY_ROW = re.compile(r"^\s*(\S[^\n]*?)\s+(\d+)\s+([0-9.]+)%\s*$", re.MULTILINE)
"""A row of ``lvrl validate``'s accuracy table: the category (or ``overall``), questions, accuracy."""


def accuracy_rows(output: str) -> dict[str, dict[str, float]]:
    """``{category: {"questions": n, "accuracy": fraction}}`` from ``lvrl validate``'s table.

    >>> accuracy_rows("Temporal   100   88.0%\\noverall   400   61.0%\\n")["overall"]
    {'questions': 400, 'accuracy': 0.61}
    """
    return {
        name.strip(): {"questions": int(count), "accuracy": round(float(percent) / 100, 6)}
        for name, count, percent in ACCURACY_ROW.findall(output)
    }


def main() -> None:
    parser = recorder_arguments(__doc__, "<commit>.json and the commands' output")
    parser.add_argument("--data", type=Path, required=True, help="the synthetic shards, used as they are")
    parser.add_argument("--family", default="qwen3_vl")
    args = parser.parse_args()

    data = args.data.resolve()
    commit, clone = fresh_clone(args.commit, args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    # This checkout's environment runs the clone's code: the clone first on the path.
    env = clean_environment(PYTHONPATH=str(clone), WANDB_MODE="offline")
    lvrl = [sys.executable, "-m", "app"]
    run = clone / "runs" / "sft-at"
    shards = ["--data.init_args.train_shards", f"{data}/train-*.tar"]
    commands = {
        "build": [
            *lvrl, "model", "build", "--family", args.family, "--preset", "small",
            "--out", str(run / "model-small"), "--corpus", f"{data}/train-00000.tar",
        ],
        "sft": [
            *lvrl, "fit", "--config", "configs/demo/sft.yaml", "--trainer.default_root_dir", str(run / "sft"),
            "--model.init_args.model_path", str(run / "model-small"), *shards,
            "--data.init_args.val_shards", f"{data}/val-*.tar",
        ],
        "evaluation": [
            *lvrl, "validate", "--config", "configs/demo/sft.yaml",
            "--trainer.default_root_dir", str(run / "sft-eval"), "--trainer.limit_val_batches", "null",
            "--model.init_args.model_path", str(run / "sft" / "hf"), "--model.init_args.val_samples", "0",
            *shards, "--data.init_args.val_shards", f"{data}/{{val,test}}-*.tar",
        ],
    }  # fmt: skip
    print(f"sft_at_commit: {commit} in {clone}", flush=True)
    seconds = {}
    with LoadSampler() as load:
        for name, command in commands.items():
            seconds[name] = timed(command, clone, args.out / f"{commit}-{name}.log", env)
    accuracy = accuracy_rows((args.out / f"{commit}-evaluation.log").read_text())
    if "overall" not in accuracy:
        raise SystemExit(
            f"lvrl validate printed no overall accuracy: see {args.out / f'{commit}-evaluation.log'}"
        )
    record = {
        "command": "python " + " ".join(["bench/sft_at_commit.py", *sys.argv[1:]]),
        "commit": recorder_commit(),
        "evaluated_commit": commit,
        "environment": f"{sys.prefix} (the recorder's virtual environment, not one built at {commit})",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "family": args.family,
        "data": str(data),
        "load": load.describe("the SFT stage", alone=not args.beside_other_work),
        "wall_seconds": seconds,
        "accuracy": accuracy,
    }
    (args.out / f"{commit}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"sft_at_commit: {commit} overall {accuracy['overall']['accuracy']:.1%}", flush=True)


if __name__ == "__main__":
    main()
