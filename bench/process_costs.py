"""What one ``lvrl`` process costs before its work: the fixed CPU seconds that dominate the test
suite's subprocess tests (docs/testing.md renders this file's results).

Each case is a real command, run ``--repeats`` times, its CPU seconds counted whole
(:func:`bench.process_usage.run_counted`: the command and every process it started, the
dataloader's fork server included); the median is reported, with the range:

- ``python``: an interpreter that does nothing (the floor);
- ``trainer imports``: what ``lvrl fit`` imports before it parses its config (Lightning, which
  imports torchmetrics and with it torchvision and torch._dynamo; transformers' model code; vLLM);
- ``fork server preload``: what the dataloader's fork server imports before it forks a worker
  (:data:`datamodules.fork_server.PRELOADED`);
- ``lvrl fit, no workers`` and ``lvrl fit, 1 worker``: the SFT demo config on the tiny model, 3
  steps of 2 samples of 8 frames and a validation batch, as the suite's CLI tests run it; their
  difference is what the worker and its fork server cost;
- ``vLLM engine start, tiny vocabulary`` and ``..., real vocabulary``: one
  :class:`rollout.vllm_engine.VLLMEngine` started on the tiny model with its 1,024-token vocabulary
  and with Qwen's 151,643-rank one (``lvrl model build --tokenizer qwen``); the CPU seconds of
  ``start`` alone, measured inside the process.

Usage: python bench/process_costs.py [--repeats 3] [--out bench/results/process_costs]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.process_usage import children_cpu_seconds, run_counted  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TRAINER_IMPORTS = "import app.lightning_cli, models.grpo, callbacks.rl_rollout, datamodules.longvideo_reason"
FORK_SERVER_PRELOAD = (
    "import importlib\nfrom datamodules.fork_server import PRELOADED\nfor name in PRELOADED:\n"
    "    importlib.import_module(name)"
)


def own_cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def engine_start(model_dir: str) -> None:
    """Start a vLLM engine on ``model_dir`` and print the CPU seconds ``start`` took (this process:
    the engine runs in it)."""
    from transformers import AutoProcessor

    from models.loading import load_model
    from rollout.base import PolicyHandle
    from rollout.vllm_engine import VLLMEngine

    model = load_model(model_dir)
    tokenizer = AutoProcessor.from_pretrained(model_dir).tokenizer
    engine = VLLMEngine(dtype="float32", max_num_seqs=8)
    before = own_cpu_seconds()
    engine.start(PolicyHandle(model_dir, model, tokenizer))
    print(json.dumps({"start_cpu_seconds": own_cpu_seconds() - before}))
    engine.shutdown()


def build_inputs(root: Path) -> tuple[Path, Path, Path]:
    """The suite's synthetic shards (24 train, 8 val samples of 20 frames), the tiny model, and the
    tiny model with Qwen's vocabulary, under ``root``."""
    from datatools.shard_writer import write_shards
    from datatools.synthetic import SynthConfig, encoded_samples
    from models.build import build_model_dir

    synth = root / "synth"
    config = SynthConfig(num_frames=20, fps=2.0, size=56, seed=7)
    for split, count in (("train", 24), ("val", 8)):
        write_shards(
            encoded_samples(config, split, count), synth, split, max_samples_per_shard=4, progress=False
        )
    tiny = build_model_dir("tiny", root / "tiny", seed=0)
    real = build_model_dir("tiny", root / "real-vocab", tokenizer="qwen")
    return synth, Path(tiny), Path(real)


def fit_command(run_dir: Path, synth: Path, model: Path, workers: int) -> list[str]:
    return [
        sys.executable, "-m", "app", "fit", "--config", str(REPO / "configs/demo/sft.yaml"),
        "--trainer.default_root_dir", str(run_dir), "--trainer.max_steps", "3",
        "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1",
        "--model.init_args.model_path", str(model),
        "--data.init_args.train_shards", str(synth / "train-*.tar"),
        "--data.init_args.val_shards", str(synth / "val-*.tar"),
        "--data.init_args.num_frames", "8", "--data.init_args.batch_size", "2",
        "--data.init_args.val_batch_size", "2", "--data.init_args.num_workers", str(workers),
    ]  # fmt: skip


def trainer_imports_pace(repeats: int = 3) -> dict[str, float]:
    """The machine's pace now, as the suite feels it: the CPU seconds of ``trainer imports`` (what
    every ``lvrl`` process of the suite pays first), run ``repeats`` times from this checkout's
    interpreter. The suite's process-heavy files slow down with it at the machine's slower hours
    (docs/testing.md), so a suite record carries it, taken before and after the run."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    seconds = []
    for _ in range(repeats):
        # One process that starts none: its own CPU, counted when it is waited for. Not
        # run_counted, which would make the caller a subreaper that waits for whatever else it
        # adopts (a pytest worker adopts other tests' orphans).
        before = children_cpu_seconds()
        subprocess.run(
            [sys.executable, "-c", TRAINER_IMPORTS],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        seconds.append(children_cpu_seconds() - before)
    return {key: round(value, 2) for key, value in summary(seconds).items()}


def measure(root: Path, repeats: int) -> dict[str, dict[str, float]]:
    synth, tiny, real = build_inputs(root)
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(REPO)}
    quiet = {"cwd": REPO, "env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    python = [sys.executable, "-c"]
    # Each case's command for its k-th run (the fits each write to a folder of their own).
    cases: dict[str, Callable[[int], list[str]]] = {
        "python": lambda k: [*python, "pass"],
        "trainer imports": lambda k: [*python, TRAINER_IMPORTS],
        "fork server preload": lambda k: [*python, FORK_SERVER_PRELOAD],
        "lvrl fit, no workers": lambda k: fit_command(root / f"fit0-{k}", synth, tiny, 0),
        "lvrl fit, 1 worker": lambda k: fit_command(root / f"fit1-{k}", synth, tiny, 1),
    }
    results: dict[str, dict[str, float]] = {}
    for name, command in cases.items():
        seconds = []
        for k in range(repeats):
            usage = run_counted(command(k), **quiet)
            assert usage.exit_status == 0 and usage.orphans_left == 0, (name, usage)
            seconds.append(usage.cpu_seconds)
        results[name] = summary(seconds)
    for name, model in (
        ("vLLM engine start, tiny vocabulary", tiny),
        ("vLLM engine start, real vocabulary", real),
    ):
        seconds = []
        for _ in range(repeats):
            out = run_capture(
                [sys.executable, str(Path(__file__).resolve()), "--engine-start", str(model)], env
            )
            seconds.append(json.loads(out.strip().splitlines()[-1])["start_cpu_seconds"])
        results[name] = summary(seconds)
    return results


def run_capture(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def summary(seconds: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(seconds),
        "min": min(seconds),
        "max": max(seconds),
        "runs": len(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "process_costs")
    parser.add_argument("--engine-start", help=argparse.SUPPRESS)  # the child of the engine cases
    args = parser.parse_args()
    if args.engine_start:
        engine_start(args.engine_start)
        return
    from evaluation.provenance import provenance

    with tempfile.TemporaryDirectory(prefix="process-costs-") as root:
        results = measure(Path(root), args.repeats)
    report = {
        **provenance([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "cpu_seconds": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "process_costs.json").write_text(json.dumps(report, indent=1) + "\n")
    for name, cost in results.items():
        print(f"{name:40s} {cost['median']:6.2f} CPU-s (range {cost['min']:.2f}-{cost['max']:.2f})")


if __name__ == "__main__":
    main()
