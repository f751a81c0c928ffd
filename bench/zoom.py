"""Frames on request, measured: the zoom task's acceptance comparison over seeds.

Per seed, from one small model built for the task: CoT-SFT on the tool traces
(``configs/zoom/sft_tool.yaml``: a 16-frame overview, one request of up to 16 frames, 32 frames
seen in all), CoT-SFT on dense 256-frame input with the same steps (``sft_dense.yaml``), and
GRPO with frame requests from the trace SFT export (``grpo_tool.yaml``); each export then
answers the 400 held-out questions (validation and test splits) greedily, the tool-using ones
with episodes (the rollout code). Printed: accuracy per setting (mean ± spread over seeds, and
per seed), the dense model at 16, 64 and 256 frames, requests and frames per answer, and exact
McNemar tests on the same questions, per seed and pooled over seeds: tool GRPO vs its SFT start
(the target: significantly above) and tool GRPO vs dense 256 frames (the target: at least as
accurate), with the wall time of each stage.

Every stage is skipped when its folder holds ``done``, and a training stage stopped part way
resumes from its last checkpoint (every 50 steps, and at a SIGTERM to its ``lvrl`` process), so
an interrupted comparison continues where it stopped (``make demo-zoom`` is one seed of this,
in ``runs/zoom``). A stage whose folder ran another recipe (its ``config.yaml`` differs from what
this command would train, apart from where files live) stops the bench with the keys that
differ. Per seed the tool runs go first (GRPO against its SFT start), then the dense baseline.

Usage: python bench/zoom.py [--data data/zoom] [--seeds 0 1 2] [--out runs/zoom-bench]
       [--family qwen3_vl] [--sft-steps 900] [--grpo-steps 200] [--longer-grpo 300 400]
       [--grpo-set data.init_args.batch_size=16 ...] [--skip-dense]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.commands.report import last_predictions, paired_comparison
from bench.grpo_runs import (
    REPO,
    column,
    fit_or_resume,
    markdown,
    mean_and_spread,
    run_lvrl,
    training_csv_logger,
)

CONFIGS = REPO / "configs" / "zoom"
CHECKPOINT_EVERY = 50
SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
STAGES = (  # in running order: GRPO starts from the tool SFT export
    ("tool SFT", "sft-tool", "sft_tool.yaml"),
    ("tool GRPO", "grpo-tool", "grpo_tool.yaml"),
    ("dense SFT, 256 frames", "sft-dense", "sft_dense.yaml"),
)


def stage_config(name: str, run_dir: Path, start: Path, data: str, seed: int, steps: int) -> dict[str, Any]:
    """``configs/zoom/<name>``: metrics as CSV in ``run_dir``, ``seed`` for the data order (the
    datamodule's shuffles: without it the SFT runs of every seed would be the same run) and the
    rollouts, the model it starts from, no validation during training."""
    config = yaml.safe_load((CONFIGS / name).read_text())
    config["seed_everything"] = seed
    trainer = config["trainer"]
    trainer.update(default_root_dir=str(run_dir), max_steps=steps, limit_val_batches=0)
    trainer["logger"] = [training_csv_logger(run_dir)]
    for callback in trainer["callbacks"]:
        if callback["class_path"].endswith("RolloutCallback"):
            callback["init_args"]["seed"] = seed
        if callback["class_path"].endswith("RunCheckpoint"):  # what a killed stage resumes from
            callback["init_args"]["every_n_train_steps"] = min(steps, CHECKPOINT_EVERY)
    config["model"]["init_args"]["model_path"] = str(start)
    config["data"]["init_args"].update(
        train_shards=f"{data}/train-*.tar", val_shards=f"{data}/val-*.tar", seed=seed
    )
    return config


def with_settings(config: dict[str, Any], settings: list[str]) -> dict[str, Any]:
    """``config`` with each ``dotted.key=VALUE`` of ``settings`` set (VALUE read as YAML). Every
    key but the last must name a mapping already there, or an item of a list by its index (the
    callbacks: ``trainer.callbacks.0.init_args.rewards=[...]``), so a misspelt section is an error
    here; a misspelt last key is refused by the CLI when the stage starts.

    >>> with_settings({"model": {"init_args": {"learning_rate": 3e-5}}},
    ...               ["model.init_args.learning_rate=5e-5", "model.init_args.micro_batch_rows=64"])
    {'model': {'init_args': {'learning_rate': 5e-05, 'micro_batch_rows': 64}}}
    >>> with_settings({"model": {}}, ["modle.init_args.learning_rate=1"])
    Traceback (most recent call last):
    ...
    ValueError: modle.init_args.learning_rate=1: the config has no mapping 'modle'
    >>> with_settings({"callbacks": [{"init_args": {"n": 8}}]}, ["callbacks.0.init_args.n=4"])
    {'callbacks': [{'init_args': {'n': 4}}]}
    >>> with_settings({"callbacks": [{"init_args": {"n": 8}}]}, ["callbacks.1.init_args.n=4"])
    Traceback (most recent call last):
    ...
    ValueError: callbacks.1.init_args.n=4: the config has no list item 'callbacks.1'
    """
    for setting in settings:
        key, separator, value = setting.partition("=")
        if not separator or not key:
            raise ValueError(f"{setting!r}: expected dotted.key=VALUE")
        *sections, leaf = key.split(".")
        node: Any = config
        for depth, section in enumerate(sections):
            if isinstance(node, list):
                if not section.isdigit() or int(section) >= len(node):
                    raise ValueError(
                        f"{setting}: the config has no list item {'.'.join(sections[: depth + 1])!r}"
                    )
                node = node[int(section)]
            elif isinstance(node.get(section), dict | list):
                node = node[section]
            else:
                raise ValueError(f"{setting}: the config has no mapping {section!r}")
        if not isinstance(node, dict):
            raise ValueError(f"{setting}: {key.rsplit('.', 1)[0]!r} is not a mapping")
        parsed = yaml.safe_load(value)
        # PyYAML reads YAML 1.1, where 5e-5 (no dot) is a string; a learning rate is meant.
        node[leaf] = float(parsed) if isinstance(parsed, str) and SCIENTIFIC.fullmatch(parsed) else parsed
    return config


def timed_once(out: Path, work: Any) -> float:
    """Run ``work()`` unless ``out/done`` exists; returns its wall time in seconds, over every
    attempt (an interrupted one records its time in ``out/elapsed``)."""
    done, elapsed = out / "done", out / "elapsed"
    if not done.exists():
        print(f"running {out} ...", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        total = float(elapsed.read_text()) if elapsed.exists() else 0.0
        started = time.perf_counter()
        try:
            work()
        finally:
            total += time.perf_counter() - started
            elapsed.write_text(str(total))
        done.write_text(json.dumps({"seconds": total}))
    return float(json.loads(done.read_text() or "{}").get("seconds", float("nan")))


def flattened(node: Any, prefix: str = "") -> dict[str, Any]:
    """A config as ``{"dotted.key": leaf}`` (list items by index).

    >>> flattened({"trainer": {"max_steps": 900, "callbacks": [{"init_args": {"seed": 1}}]}})
    {'trainer.max_steps': 900, 'trainer.callbacks.0.init_args.seed': 1}
    """
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
    if items is None:
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in items:
        flat.update(flattened(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def is_location(key: str, config: dict[str, Any]) -> bool:
    """Keys that say where a stage's files live (its folder, its logger's, the model it starts
    from, all under ``--out``) rather than what it trains: a folder restored from another
    ``--out`` differs there only. ``val_check_interval`` is inert while the stage validates
    nothing (``limit_val_batches: 0``, as every stage here)."""
    inert = key == "trainer.val_check_interval" and config["trainer"].get("limit_val_batches") == 0
    return (
        inert
        or key in {"trainer.default_root_dir", "model.init_args.model_path"}
        or (key.startswith("trainer.logger.") and key.endswith(".save_dir"))
    )


def recipe_changes(run_dir: Path, config: dict[str, Any]) -> list[str]:
    """What ``config`` would train differently from the run already in ``run_dir`` (its
    ``config.yaml``, finished or stopped part way), as ``key: recorded -> now`` lines; empty for a
    new folder. Reporting a finished stage, or resuming a stopped one, under another recipe would
    pass one recipe's results off as another's (a changed config default, ``--sft-steps``, or
    ``--grpo-set``)."""
    recorded_file = run_dir / "config.yaml"
    if not recorded_file.exists():
        return []
    recorded = flattened(yaml.safe_load(recorded_file.read_text()))
    # Compared as written: YAML reads back what it wrote, so only real changes differ.
    now = flattened(yaml.safe_load(yaml.safe_dump(config)))
    missing = object()
    return [
        f"{key}: {recorded.get(key, '(absent)')} -> {now.get(key, '(absent)')}"
        for key in sorted(set(recorded) | set(now))
        if recorded.get(key, missing) != now.get(key, missing) and not is_location(key, config)
    ]


def train(run_dir: Path, config: dict[str, Any], continuing: Path | None = None) -> float:
    changes = recipe_changes(run_dir, config)
    if changes:
        shown = "\n  ".join(changes[:8]) + (f"\n  ... {len(changes) - 8} more" if len(changes) > 8 else "")
        sys.exit(
            f"{run_dir} holds a run of another recipe than this command's:\n  {shown}\n"
            "give this recipe its own --out, or pass the settings that run used "
            "(--sft-steps, --grpo-set)"
        )

    def work() -> None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        fit_or_resume(run_dir, continuing)

    return timed_once(run_dir, work)


def evaluate(run_dir: Path, data: str) -> tuple[Path, float]:
    """The run's export answers every held-out question with the run's own validation settings
    (episodes for the tool-using runs, the frame sweep for the dense one); returns the
    evaluation's folder and its wall time."""
    out = run_dir.parent / f"{run_dir.name}-eval"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    trainer = config["trainer"]
    trainer.update(default_root_dir=str(out), limit_val_batches=None)
    # version 0 pinned: an evaluation is never resumed, and a rerun of a stopped one replaces it.
    trainer["logger"][0]["init_args"].update(save_dir=str(out), version=0)
    config["model"]["init_args"]["model_path"] = str(run_dir / "hf")
    config["data"]["init_args"]["val_shards"] = f"{data}/{{val,test}}-*.tar"

    def work() -> None:
        (out / "config.yaml").write_text(yaml.safe_dump(config))
        run_lvrl(out, ["validate", "--config", str(out / "config.yaml")], log_name="eval.log")

    return out, timed_once(out, work)


def last(metrics: Path, name: str) -> float:
    values = column(metrics, name)
    return values[-1] if values else float("nan")


def paired_line(label: str, seeds: list[int], base: list[dict[str, bool]], new: list[dict[str, bool]]) -> str:
    """Exact McNemar per seed and pooled (questions keyed by seed and id); ``base[i]`` and
    ``new[i]`` are the answers of seed ``seeds[i]``, named by that number, not by its place."""
    parts = []
    for seed, b, n in zip(seeds, base, new, strict=True):
        test = paired_comparison(b, n)
        parts.append(f"seed {seed}: {test.change:+.1%} (p = {test.p_value:.3g})")
    pooled_base = {f"{seed}/{k}": v for seed, b in zip(seeds, base, strict=True) for k, v in b.items()}
    pooled_new = {f"{seed}/{k}": v for seed, n in zip(seeds, new, strict=True) for k, v in n.items()}
    pooled = paired_comparison(pooled_base, pooled_new)
    return (
        f"- {label}: pooled over seeds {pooled.change:+.1%} on {pooled.questions} answers "
        f"({pooled.only_new} right only in the first, {pooled.only_base} only in the second), exact "
        f"McNemar p = {pooled.p_value:.3g}; " + "; ".join(parts)
    )


def split_of(question: str) -> str:
    """The split of a zoom question from its id (``synth-val-000012``: ``val``)."""
    parts = question.split("-")
    return parts[1] if len(parts) > 2 else ""


def on_split(answers: list[dict[str, bool]], split: str) -> list[dict[str, bool]]:
    kept = [{q: right for q, right in seed.items() if split_of(q) == split} for seed in answers]
    if not any(kept):
        raise ValueError(
            f"no {split} questions: ids like synth-{split}-000012, as `lvrl data zoom` writes them"
        )
    return kept


def longer_grpo_report(
    first: int, seeds: list[int], sft: list[dict[str, bool]], grpo: dict[int, list[dict[str, bool]]]
) -> str:
    """Each GRPO length's accuracy per split, the length with the best validation accuracy
    (pooled over seeds; the shorter on a tie), and that length against its SFT start on the test
    split, which played no part in the choice."""

    def accuracy(answers: list[dict[str, bool]]) -> float:
        values = [right for seed in answers for right in seed.values()]
        return sum(values) / len(values)

    rows = [
        [f"{steps} steps", *(f"{accuracy(on_split(answers, split)):.3f}" for split in ("val", "test"))]
        for steps, answers in sorted(grpo.items())
    ]
    rows.insert(0, ["SFT start", *(f"{accuracy(on_split(sft, split)):.3f}" for split in ("val", "test"))])
    chosen = max(sorted(grpo), key=lambda steps: accuracy(on_split(grpo[steps], "val")))
    test = paired_line(
        f"tool GRPO, {chosen} steps (chosen on validation) vs tool SFT, test split",
        seeds,
        on_split(sft, "test"),
        on_split(grpo[chosen], "test"),
    )
    table = markdown(["tool GRPO length", "validation accuracy", "test accuracy"], rows)
    title = f"GRPO length, chosen on the validation split (seeds pooled), from {first} steps on"
    return f"\n{title}\n{table}\n{test}"


def continue_grpo(
    first: Path,
    data: str,
    seed: int,
    lengths: list[int],
    seconds: dict[str, list[float]],
    settings: list[str] | None = None,
) -> list[tuple[int, dict[str, bool]]]:
    """The tool GRPO run ``first`` continued to each of ``lengths`` steps (``grpo-tool-N`` beside
    it, each from the one before's last checkpoint, with the same ``settings`` as the first:
    :func:`with_settings`), each evaluated: its held-out answers."""
    answers = []
    previous = first
    for steps in lengths:
        run_dir = first.parent / f"grpo-tool-{steps}"
        config = stage_config("grpo_tool.yaml", run_dir, first.parent / "sft-tool" / "hf", data, seed, steps)
        config = with_settings(config, settings or [])
        if config["model"]["init_args"].get("lr_schedule", "constant") != "constant":
            sys.exit("--longer-grpo continues a run: its learning rate must be constant")
        trained = train(run_dir, config, continuing=previous / "checkpoints" / "last.ckpt")
        eval_dir, evaluated = evaluate(run_dir, data)
        seconds.setdefault(f"tool GRPO to {steps} training", []).append(trained)
        seconds.setdefault(f"tool GRPO to {steps} evaluation", []).append(evaluated)
        predictions = last_predictions(eval_dir)
        if predictions is None:
            raise RuntimeError(f"{eval_dir} wrote no predictions")
        answers.append((steps, predictions))
        previous = run_dir
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/zoom", help="the zoom task's shards (built if missing)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/zoom-bench")
    parser.add_argument(
        "--family",
        default="qwen3_vl",
        help="model family of the small model (qwen3_vl writes each frame's time as text; docs/tool-use.md)",
    )
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=900,
        help="steps of each SFT (both configs' budget; 1,200 leave the tool GRPO nothing to learn: "
        "docs/tool-use.md)",
    )
    parser.add_argument("--grpo-steps", type=int, default=200)
    parser.add_argument(
        "--grpo-set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="change the tool GRPO's recipe (grpo_tool.yaml; the SFT configs stay as they are), e.g. "
        "data.init_args.batch_size=16; give each recipe its own --out: a finished stage is not run again",
    )
    parser.add_argument(
        "--longer-grpo",
        type=int,
        nargs="*",
        default=[],
        metavar="STEPS",
        help="also run the tool GRPO to these step counts, each continuing the one before from its last "
        "checkpoint (a constant learning rate: the same run, longer), and evaluate each; the step "
        "count is chosen on the validation split (pooled over seeds) and reported on the test split",
    )
    parser.add_argument(
        "--skip-dense",
        action="store_true",
        help="run each seed's tool path only (tool SFT, GRPO and its continuations); the dense baseline "
        "(the longest stage, ~2 h a seed on 2 cores) and the tool-vs-dense test are left out",
    )
    args = parser.parse_args()
    if sorted(set(args.longer_grpo)) != args.longer_grpo or any(
        n <= args.grpo_steps for n in args.longer_grpo
    ):
        parser.error("--longer-grpo: increasing step counts, each above --grpo-steps")
    out, data = Path(args.out), args.data
    if not (Path(data) / "dataset.json").exists():
        run_lvrl(out, ["data", "zoom", "--out", data], log_name="data.log")
    model = out / "model-small"
    # --reuse keeps the model the folder's finished stages were trained from and refuses one of
    # another family: mixing them would compare runs of two different models.
    build = ["model", "build", "--family", args.family, "--preset", "small", "--out", str(model), "--reuse"]
    run_lvrl(out, [*build, "--corpus", f"{data}/train-00000.tar"], log_name="model-build.log")
    accuracy: dict[str, list[float]] = {label: [] for label, _, _ in STAGES}
    answers: dict[str, list[dict[str, bool]]] = {label: [] for label, _, _ in STAGES}
    extra: dict[str, list[float]] = {"dense 16": [], "dense 64": [], "requests": [], "frames": []}
    seconds: dict[str, list[float]] = {}
    longer: dict[int, list[dict[str, bool]]] = {}
    stages = [stage for stage in STAGES if not (args.skip_dense and stage[1] == "sft-dense")]
    for seed in args.seeds:
        for label, folder, config_name in stages:
            run_dir = out / f"seed{seed}" / folder
            start = run_dir.parent / "sft-tool" / "hf" if folder == "grpo-tool" else model
            steps = args.grpo_steps if folder == "grpo-tool" else args.sft_steps
            config = stage_config(config_name, run_dir, start, data, seed, steps)
            if folder == "grpo-tool":
                config = with_settings(config, args.grpo_set)
            trained = train(run_dir, config)
            eval_dir, evaluated = evaluate(run_dir, data)
            seconds.setdefault(f"{label} training", []).append(trained)
            seconds.setdefault(f"{label} evaluation", []).append(evaluated)
            metrics = eval_dir / "csv"  # its CSV log, plain or gzipped as saved results keep it
            accuracy[label].append(last(metrics, "val/accuracy"))
            predictions = last_predictions(eval_dir)
            if predictions is None:
                raise RuntimeError(f"{eval_dir} wrote no predictions")
            answers[label].append(predictions)
            if folder == "sft-dense":
                extra["dense 16"].append(last(metrics, "val/frames_16/accuracy"))
                extra["dense 64"].append(last(metrics, "val/frames_64/accuracy"))
            if folder == "grpo-tool":
                extra["requests"].append(last(metrics, "val/requests_per_answer"))
                extra["frames"].append(last(metrics, "val/frames_per_answer"))
                # The continuations come next, before the dense baseline: the tool path of a seed
                # is then whole while its dense SFT (the longest stage) still runs.
                for steps, predictions in continue_grpo(
                    run_dir, data, seed, args.longer_grpo, seconds, args.grpo_set
                ):
                    longer.setdefault(steps, []).append(predictions)

    def row(label: str, values: list[float]) -> list[str]:
        return [label, mean_and_spread(values), ", ".join(f"{v:.3f}" for v in values)]

    seen, asked = mean_and_spread(extra["frames"], 1), mean_and_spread(extra["requests"], 2)
    rows = [
        row("dense SFT, 16 frames", extra["dense 16"]),
        row("dense SFT, 64 frames", extra["dense 64"]),
        row("dense SFT, 256 frames", accuracy["dense SFT, 256 frames"]),
        row("tool SFT", accuracy["tool SFT"]),
        row(f"tool GRPO ({seen} frames, {asked} requests per answer)", accuracy["tool GRPO"]),
    ]
    steps = f"{args.sft_steps} SFT / {args.grpo_steps} GRPO steps"
    print(f"\nzoom task, seeds {args.seeds}, {steps}, held-out questions")
    print(markdown(["setting", "accuracy", "per seed"], rows))
    print(paired_line("tool GRPO vs tool SFT", args.seeds, answers["tool SFT"], answers["tool GRPO"]))
    dense = answers["dense SFT, 256 frames"]
    if not args.skip_dense:
        print(paired_line("tool GRPO vs dense SFT (256 frames)", args.seeds, dense, answers["tool GRPO"]))
    if longer:
        print(
            longer_grpo_report(
                args.grpo_steps,
                args.seeds,
                answers["tool SFT"],
                {args.grpo_steps: answers["tool GRPO"], **longer},
            )
        )
    print(
        "\nwall time per seed (s): " + ", ".join(f"{k} {mean_and_spread(v, 0)}" for k, v in seconds.items())
    )


if __name__ == "__main__":
    main()
