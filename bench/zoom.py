"""Where to look, learned: the zoom task's comparison over seeds (docs/tool-use.md, "Where to
look, learned: the protocol and its target").

Per seed, from one small model built for the task (a seed sets the data order and the sampling):

- **tool SFT** on the random traces (``configs/zoom/sft_tool.yaml``: a 16-frame overview, up to
  two requests of 16 frames; with ``--given-oracle-share``, that share of the training rows given
  the oracle request, untrained, and read) and **tool GRPO** from its export (``grpo_tool.yaml``; rewarded for
  the answers, never for the span);
- **dense 48** (the tool's budget, trained at 48 uniform frames), **dense 128** (the fewest uniform
  frames that show every marker as a whole temporal patch) and **dense 256**, on the direct CoT
  targets (``sft_dense.yaml``);
- **oracle crop**: the overview and the right stretch given (the request of the oracle traces,
  ``lvrl data zoom --trace-requests oracle``, written for the model: ``data.tool_given_request``),
  on a copy of the random build with the oracle traces (``bench/zoom_oracle_data.py``: the same
  video bytes as every other setting).

The tool SFT runs a step budget (``--tool-sft-steps``, chosen on validation): its loss is mostly
the random first request, which no training lowers, so the loss flattens while the reading, a few
tokens of each trace, is still being learned (``TOOL_SFT_STEPS``). Every baseline SFT stage trains
at least that budget (in the tool runs the reading set in after the loss had nearly stopped
falling, so a plateau reached sooner would say nothing of it), then until its validation loss
plateaus (checked every ``PLATEAU_EVERY`` steps on ``PLATEAU_BATCHES`` validation batches, loss
only; stopped by the ``PLATEAU`` rule, or at ``--max-sft-steps``, at least the budget). At the
defaults both are 3,000: every SFT stage but dense 256 runs the same
3,000-step schedule, and the report says whether each baseline's validation loss had plateaued by
its end. Dense 256 runs ``--dense-256-steps`` (``DENSE_256_STEPS``: sized to 3 times the tool
path's compute), its plateau able to stop it from the budget on.
Each export then answers the validation split
(what recipes are chosen on) and the test split (what is reported), greedily, tool runs with
episodes (the rollout code); and the test questions again with every video swapped for another
question's (a reading probe: a model that reads its frames falls to about chance there). The
tool SFT also answers the validation split with the oracle request given (on the oracle copy):
GRPO, rewarded for answers, can only teach where to look to a model that reads the right
stretch once it has asked for it.

Printed (:mod:`bench.zoom_report`): per setting, accuracy (mean ± spread over seeds, and per
seed), frames and visual tokens per answer, trainer CPU seconds, requests, span hit rate and the
probe; on the test split, exact McNemar tests per seed and pooled, a paired t-test over the
seeds, and the verdict of the target stated before the runs. With ``--records``, the report is
also written there (``report-seeds-0-1-2.md``, with the command, commit, machine and date).

Every stage is skipped when its folder holds ``done``, and a training stage stopped part way
resumes from its last checkpoint, so an interrupted comparison continues where it stopped. A
stage whose folder ran another recipe (its ``config.yaml`` differs from what this command would
train, apart from where files live) stops the bench with the keys that differ. With
``--records``, each finished stage is also recorded in the repository (:mod:`bench.zoom_records`)
and a start puts back what ``--out`` lacks: the working folder can be lost (a new machine).

Usage: python bench/zoom.py [--data data/zoom] [--oracle-data data/zoom-oracle] [--seeds 0 1 2]
       [--given-oracle-share 0.5]
       [--out runs/zoom-bench] [--family qwen3_vl] [--max-sft-steps 3000] [--dense-256-steps 5000]
       [--tool-sft-steps 3000]
       [--grpo-steps 200]
       [--longer-grpo 300 400] [--grpo-set data.init_args.batch_size=16 ...] [--stages ...]
       [--records bench/results/zoom_protocol/NAME] [--status]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.cli import quiet_if_the_reader_leaves
from app.commands.report import last_predictions, last_records
from bench import zoom_oracle_data, zoom_records
from bench.grpo_runs import (
    REPO,
    attempts,
    column,
    csv_rows,
    fit_or_resume,
    run_lvrl,
    training_csv_logger,
)
from bench.zoom_report import (
    GIVEN_ORACLE,
    Cost,
    Plateau,
    SeedResult,
    comparisons,
    cost_cell,
    longer_grpo_report,
    machine_line,
    reading_lines,
    report,
    summed,
    training_lines,
    verdict,
)
from evaluation.provenance import provenance

CONFIGS = REPO / "configs" / "zoom"
CHECKPOINT_EVERY = 50
SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
PLATEAU_EVERY = 100
"""Steps between the validation-loss checks of an SFT stage."""
PLATEAU_BATCHES = 5
"""Validation batches each check reads (the first ones of the split: the same questions)."""
PLATEAU = Plateau(patience=3, min_delta=0.001)
"""The rule that ends a baseline's SFT stage (its callback's settings) and that the report applies
to each baseline's validation-loss curve."""
TOOL_SFT_STEPS = 3000
"""The tool SFT's budget, chosen on validation (seed 0, given-share 0.5 build): the plateau rule
stopped it at step 1,324, when given the oracle request it answered 27.0% of the validation
questions (chance 25%); trained on along the same 3,000-step schedule it answered 50.5% at step
2,000 and 96.5% at its end (bench/results/zoom_protocol/given-share-0.5-seed0-step1001/ and
given-share-0.5-seed0-budget3000/)."""
DENSE_256_STEPS = 5000
"""Dense 256's step budget (its schedule's length; its plateau can stop it from the tool SFT's
budget on): the protocol trains it to its plateau or to at least 3 times the tool path's compute.
Sized before it ran: the tool path's training cost 27,837 CPU seconds a seed (seeds 0 and 1,
``report-seeds-0-1.md``) and a dense 256 step 18.22 (``bench/zoom_pace.py``, alone on the
machine: bench/results/zoom_protocol/bench-given-share-0.5/pace.json), so 3 times is 4,583 steps;
5,000 leaves room for a third seed's tool path costing more. The report prints the ratio each
run reached."""
TOOL_SFT_VAL_EVERY = 300
"""Steps between the tool SFT's validation-loss checks: its curve, not a stop."""


@dataclass(frozen=True)
class Stage:
    """One setting of the comparison."""

    label: str
    folder: str
    config: str
    """Its config in ``configs/zoom``."""
    frames: int | None = None
    """Uniform frames of a dense setting (trained and evaluated at this count); None: tool use."""
    after: str | None = None
    """The folder of the stage whose export it starts from (None: the built model)."""
    oracle: bool = False
    """Trained and evaluated on the oracle traces, their request given with the question."""
    budget: bool = False
    """An SFT stage that runs its step budget (``--tool-sft-steps``) instead of to its plateau."""
    compute_sized: bool = False
    """A baseline whose most steps are ``--dense-256-steps`` (sized to 3 times the tool path's
    compute) instead of ``--max-sft-steps``."""

    @property
    def plateau(self) -> bool:
        """The baseline SFT stages train until their validation loss plateaus; the tool SFT runs
        its budget, GRPO its steps."""
        return self.after is None and not self.budget


STAGES = (  # GRPO starts from the tool SFT export; running_order says in which order they run
    Stage("tool SFT", "sft-tool", "sft_tool.yaml", budget=True),
    Stage("tool GRPO", "grpo-tool", "grpo_tool.yaml", after="sft-tool"),
    Stage("dense 48", "sft-dense-48", "sft_dense.yaml", frames=48),
    Stage("oracle crop", "sft-oracle", "sft_tool.yaml", oracle=True),
    Stage("dense 128", "sft-dense-128", "sft_dense.yaml", frames=128),
    Stage("dense 256", "sft-dense-256", "sft_dense.yaml", frames=256, compute_sized=True),
)
STAGE_NAMES = tuple(stage.folder for stage in STAGES)
BUDGETED = {stage.label for stage in STAGES if stage.budget}
GRPO = STAGES[1]


def stage_config(
    stage: Stage, run_dir: Path, start: Path, data: str, seed: int, steps: int, min_steps: int = 0
) -> dict[str, Any]:
    """``configs/zoom/<stage.config>`` for one run: metrics as CSV in ``run_dir``, ``seed`` for the
    data order (the datamodule's shuffles: without it the SFT runs of every seed would be the same
    run) and the rollouts, the model it starts from, at most ``steps`` steps; a dense stage at its
    frames, the oracle crop with its request given; an SFT stage validates its loss alone (on the
    first validation batches) and stops when it plateaus, the tool SFT validates its loss alone
    every ``TOOL_SFT_VAL_EVERY`` steps and runs all its steps, a GRPO stage validates nothing. A
    baseline trains at least ``min_steps`` (the tool SFT's budget) before its plateau can stop it
    (:class:`callbacks.early_stopping.DeferredEarlyStopping`)."""
    config = yaml.safe_load((CONFIGS / stage.config).read_text())
    config["seed_everything"] = seed
    trainer = config["trainer"]
    trainer.update(default_root_dir=str(run_dir), max_steps=steps, limit_val_batches=0)
    trainer["logger"] = [training_csv_logger(run_dir)]
    for callback in trainer["callbacks"]:
        if callback["class_path"].endswith("RolloutCallback"):
            callback["init_args"]["seed"] = seed
        if callback["class_path"].endswith("RunCheckpoint"):  # what a killed stage resumes from
            callback["init_args"]["every_n_train_steps"] = min(steps, CHECKPOINT_EVERY)
    model = config["model"]["init_args"]
    model["model_path"] = str(start)
    data_args = config["data"]["init_args"]
    data_args.update(train_shards=f"{data}/train-*.tar", val_shards=f"{data}/val-*.tar", seed=seed)
    if stage.frames is not None:
        data_args.update(num_frames=stage.frames, val_num_frames=None)
    if stage.oracle:
        data_args["tool_given_request"] = True
    if stage.after is None:  # an SFT stage: its validation loss on the first batches
        trainer.update(
            val_check_interval=min(steps, PLATEAU_EVERY if stage.plateau else TOOL_SFT_VAL_EVERY),
            check_val_every_n_epoch=None,
            limit_val_batches=PLATEAU_BATCHES,
        )
        model["val_answers"] = False
    if stage.plateau:
        trainer["callbacks"].append(
            {
                "class_path": "callbacks.early_stopping.DeferredEarlyStopping",
                "init_args": {
                    "monitor": "val/loss",
                    "mode": "min",
                    "patience": PLATEAU.patience,
                    "min_delta": PLATEAU.min_delta,
                    "after_step": min(min_steps, steps),
                },
            }
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


def run_once(out: Path, work: Callable[[], None]) -> None:
    """Run ``work()`` unless ``out/done`` exists (written once it has finished)."""
    done = out / "done"
    if not done.exists():
        print(f"running {out} ...", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        work()
        done.touch()


def stage_cost(run_dir: Path) -> Cost:
    """What the attempts recorded in ``run_dir`` cost (:func:`bench.grpo_runs.attempts`).

    A record whose ``cpu_seconds`` is null stands for attempts whose CPU time was not counted (run
    before the bench counted it, or ended with the bench before it waited for a stopped command),
    written by hand, with their commit and ``csv_versions``: how many of the run's first CSV
    version folders they logged. Those training steps are charged at the rate of
    the measured attempts of the same run, per step."""
    records = attempts(run_dir)
    measured = sum(r["cpu_seconds"] for r in records if r["cpu_seconds"] is not None)
    unmeasured = [r for r in records if r["cpu_seconds"] is None]
    machines = tuple(sorted({r["machine"]["cpu"] for r in records if r.get("machine")}))
    if not unmeasured:
        return Cost(measured, machines=machines)
    versions = max(int(r["csv_versions"]) for r in unmeasured)
    steps = last_steps(run_dir / "csv")
    before, total = max(steps[:versions], default=0), max(steps, default=0)
    if total <= before:
        return Cost(float("nan"), estimated=True, machines=machines)  # nothing measured to charge by
    return Cost(measured * total / (total - before), estimated=True, machines=machines)


def last_steps(csv_dir: Path) -> list[int]:
    """How many training steps each ``version_N`` attempt of a CSV logger's folder had reached, in
    N order. Lightning logs a step's metrics under its 0-based index (the global step before that
    step's update, so a 3,000-step run's last row reads 2999): the count is the last index + 1."""
    versions = sorted(csv_dir.glob("version_*/metrics.csv"), key=lambda f: int(f.parent.name.split("_")[1]))
    return [max((int(row["step"]) + 1 for row in csv_rows(version)), default=0) for version in versions]


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
    from, all under ``--out``) or which of its checkpoints stay on disk (``save_top_k``) rather
    than what it trains: a folder restored from another ``--out``, or a recipe run that kept
    every checkpoint for a probe, differs there only. ``val_check_interval`` is inert while the
    stage validates nothing (``limit_val_batches: 0``, as every stage here)."""
    inert = key == "trainer.val_check_interval" and config["trainer"].get("limit_val_batches") == 0
    return (
        inert
        or (key.startswith("trainer.callbacks.") and key.endswith(".init_args.save_top_k"))
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


def train(run_dir: Path, config: dict[str, Any], continuing: Path | None = None) -> Cost:
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

    run_once(run_dir, work)
    return stage_cost(run_dir)


def evaluate(run_dir: Path, shards: str, name: str, given_request: bool = False) -> tuple[Path, Cost]:
    """The run's export answers every question of ``shards`` with the run's own validation
    settings (episodes for the tool-using runs, its frames for a dense one), into
    ``<run>-<name>``; returns that folder and what it cost. ``given_request``: each episode starts
    with its trace's first request written for the model and served (shards with oracle traces)."""
    out = run_dir.parent / f"{run_dir.name}-{name}"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    trainer = config["trainer"]
    trainer.update(default_root_dir=str(out), limit_val_batches=None)
    trainer["callbacks"] = [c for c in trainer["callbacks"] if not c["class_path"].endswith("EarlyStopping")]
    # version 0 pinned: an evaluation is never resumed, and a rerun of a stopped one replaces it.
    trainer["logger"][0]["init_args"].update(save_dir=str(out), version=0)
    config["model"]["init_args"].update(model_path=str(run_dir / "hf"), val_answers=True)
    config["data"]["init_args"]["val_shards"] = shards
    if given_request:
        config["data"]["init_args"]["tool_given_request"] = True

    def work() -> None:
        (out / "config.yaml").write_text(yaml.safe_dump(config))
        run_lvrl(out, ["validate", "--config", str(out / "config.yaml")], log_name="eval.log")

    run_once(out, work)
    return out, stage_cost(out)


def swapped_videos(data: Path, split: str, out: Path) -> Path:
    """The reading probe's questions: ``split``'s shards rewritten into ``out`` with each
    question's video replaced by the next question's (in key order, the last by the first), the
    rows (questions, answers, traces) untouched. A model that reads its frames answers these at
    about chance; one that answers from the text alone does not move. Written once."""
    target = out / f"{split}-00000.tar"
    if target.exists():
        return out
    members: dict[str, dict[str, bytes]] = {}
    for shard in sorted(data.glob(f"{split}-*.tar")):
        members.update(zoom_oracle_data.shard_members(shard))
    keys = sorted(members)
    if len(keys) < 2:
        raise ValueError(f"{data}: the probe swaps videos between questions, {split} has {len(keys)}")
    out.mkdir(parents=True, exist_ok=True)
    swapped = {
        key: dict(members[key], mp4=members[keys[(i + 1) % len(keys)]]["mp4"]) for i, key in enumerate(keys)
    }
    zoom_oracle_data.write_members(target, swapped)
    return out


def last(metrics: Path, name: str) -> float:
    values = column(metrics, name)
    return values[-1] if values else float("nan")


def answered(eval_dirs: list[Path]) -> dict[str, bool]:
    """Every question's correctness over ``eval_dirs`` (question ids name their split)."""
    merged: dict[str, bool] = {}
    for eval_dir in eval_dirs:
        predictions = last_predictions(eval_dir)
        if predictions is None:
            raise RuntimeError(f"{eval_dir} wrote no predictions")
        merged.update(predictions)
    return merged


def continue_grpo(
    first: Path,
    data: str,
    seed: int,
    lengths: list[int],
    costs: dict[str, list[Cost]],
    settings: list[str] | None = None,
    record: Callable[[int, str, list[Path]], None] | None = None,
) -> list[tuple[int, dict[str, bool]]]:
    """The tool GRPO run ``first`` continued to each of ``lengths`` steps (``grpo-tool-N`` beside
    it, each from the one before's last checkpoint, with the same ``settings`` as the first:
    :func:`with_settings`), each evaluated on the validation and test splits: its answers. Each
    finished continuation is passed to ``record`` (seed, folder, its folders) when given."""
    answers = []
    previous = first
    for steps in lengths:
        run_dir = first.parent / f"grpo-tool-{steps}"
        config = stage_config(GRPO, run_dir, first.parent / "sft-tool" / "hf", data, seed, steps)
        config = with_settings(config, settings or [])
        if config["model"]["init_args"].get("lr_schedule", "constant") != "constant":
            sys.exit("--longer-grpo continues a run: its learning rate must be constant")
        trained = train(run_dir, config, continuing=previous / "checkpoints" / "last.ckpt")
        evaluations = [evaluate(run_dir, f"{data}/{split}-*.tar", split) for split in ("val", "test")]
        costs.setdefault(f"tool GRPO to {steps} training", []).append(trained)
        costs.setdefault(f"tool GRPO to {steps} evaluation", []).append(summed(c for _, c in evaluations))
        if record is not None:
            record(seed, run_dir.name, [run_dir, *(folder for folder, _ in evaluations)])
        answers.append((steps, answered([folder for folder, _ in evaluations])))
        previous = run_dir
    return answers


def span_hits(eval_dir: Path) -> dict[str, bool]:
    """Per question of an evaluation, whether its served spans hit the answer's stretch."""
    return {r["problem_id"]: bool(r["span_hit"]) for r in last_records(eval_dir) or [] if "span_hit" in r}


def tokens_per_frame(model: Path, frame_side: int, max_pixels: int) -> float:
    """Visual tokens one frame of the zoom task costs the built model (arithmetic: the frame as the
    data resizes it, merged patches per temporal patch, over the frames of one temporal patch)."""
    from transformers import AutoConfig

    from datamodules.video import fit_to_pixel_budget
    from families import family_of

    family = family_of(AutoConfig.from_pretrained(model))
    side = family.merged_patch_pixels
    height, width = fit_to_pixel_budget(frame_side, frame_side, max_pixels, factor=side)
    return (height // side) * (width // side) / family.temporal_patch_size


def stage_steps(stage: Stage, args: argparse.Namespace) -> int:
    """The most steps ``stage`` trains (its schedule's length): GRPO's, the tool SFT's budget, dense
    256's compute-sized budget, another baseline's cap."""
    if stage.after:
        return args.grpo_steps
    if stage.budget:
        return args.tool_sft_steps
    return args.dense_256_steps if stage.compute_sized else args.max_sft_steps


def running_order(stages: list[Stage], seeds: list[int]) -> list[tuple[int, Stage]]:
    """The (seed, stage) pairs in the order they run: the tool path (tool SFT, then GRPO) of every
    seed first, then each baseline over every seed, the cheapest first. GRPO against its SFT start
    over the seeds is then known before the baselines, the longest stages, have run; a seed's tool
    SFT export is needed by its GRPO right after, not a day later (a lost working folder loses
    it); and each baseline's comparison over the seeds (dense 48 first: the target's first clause)
    can be reported (``--stages``) while the dearer ones still run."""
    tool_path = [stage for stage in stages if stage.budget or stage.after]
    baselines = [stage for stage in stages if stage not in tool_path]
    return [(seed, stage) for seed in seeds for stage in tool_path] + [
        (seed, stage) for stage in baselines for seed in seeds
    ]


PROGRESS_PACE = re.compile(r"^train step \d+/\d+ .*?(\d+\.\d+ s/step(?:  ETA .+)?)$")
"""A training progress line's pace and ETA (:class:`callbacks.progress.ProgressLines`)."""


def last_pace(log: Path) -> str | None:
    """The seconds a step and the ETA of the last training progress line in ``log`` (a stage's
    ``run.log``, every attempt appended), ``ETA`` two spaces after the pace as printed; None
    before the first. The run's own estimate, from the steps of its latest attempt: stale once that
    attempt has stopped."""
    if not log.exists():
        return None
    paces = [
        match[1]
        for line in log.read_text(errors="replace").splitlines()
        if (match := PROGRESS_PACE.match(line))
    ]
    return paces[-1].replace("  ETA", ", ETA") if paces else None


def stage_state(run_dir: Path, steps: int, evaluations: list[str], recorded: bool) -> str:
    """One line of ``--status``: where a stage of a seed stands in the working folder and its record."""
    folder = run_dir.name
    evaluated = [name for name in evaluations if (run_dir.parent / f"{folder}-{name}" / "done").exists()]
    record = ", recorded" if recorded else ""
    if (run_dir / "done").exists():
        state = f"trained ({max(last_steps(run_dir / 'csv'), default=0)} steps)"
    elif recorded:
        return f"{folder}: recorded, not in this folder (put back at the next start)"
    elif (run_dir / "csv").exists():
        state = f"training: step {max(last_steps(run_dir / 'csv'), default=0)} of {steps}"
        pace = last_pace(run_dir / "run.log")
        state += f" (its last progress line: {pace})" if pace else ""
    else:
        return f"{folder}: not started"
    return (
        f"{folder}: {state}; evaluated: {', '.join(evaluated) or 'none'} of {', '.join(evaluations)}{record}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/zoom", help="the zoom task's shards (built if missing)")
    parser.add_argument(
        "--oracle-data",
        default="data/zoom-oracle",
        help="the same task with oracle traces, for the oracle crop (built if missing: the same videos)",
    )
    parser.add_argument(
        "--given-oracle-share",
        type=float,
        default=0.0,
        help="build --data with this share of training rows given the oracle request (lvrl data zoom "
        "--given-oracle-share: the tool SFT then learns to read the right stretch without a request to "
        "imitate); an existing --data must have been built with it",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/zoom-bench")
    parser.add_argument(
        "--family",
        default="qwen3_vl",
        help="model family of the small model (qwen3_vl writes each frame's time as text; docs/tool-use.md)",
    )
    parser.add_argument(
        "--max-sft-steps",
        type=int,
        default=3000,
        help="most steps of a baseline SFT stage but dense 256 (each trains at least --tool-sft-steps, "
        "then stops at its plateau or here; its learning-rate schedule's length)",
    )
    parser.add_argument(
        "--dense-256-steps",
        type=int,
        default=DENSE_256_STEPS,
        help="most steps of dense 256 (at least --tool-sft-steps; sized to 3 times the tool path's "
        "compute, DENSE_256_STEPS says how)",
    )
    parser.add_argument(
        "--tool-sft-steps",
        type=int,
        default=TOOL_SFT_STEPS,
        help="the tool SFT's step budget (its learning-rate schedule's length; no plateau stop)",
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
        "--records",
        help="keep each finished stage's record here (config, attempts, metrics, predictions; "
        "bench/zoom_records.py), and start by putting back the records of stages --out lacks: "
        "a lost --out then costs only the unfinished stages",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="print where each stage of each seed stands (trained, its step and last pace, evaluated, "
        "recorded) and exit",
    )
    parser.add_argument(
        "--stages",
        nargs="+",
        choices=STAGE_NAMES,
        default=list(STAGE_NAMES),
        help="the stages to run (all by default; tool GRPO needs tool SFT)",
    )
    args = parser.parse_args()
    if sorted(set(args.longer_grpo)) != args.longer_grpo or any(
        n <= args.grpo_steps for n in args.longer_grpo
    ):
        parser.error("--longer-grpo: increasing step counts, each above --grpo-steps")
    for flag in ("max_sft_steps", "dense_256_steps"):
        if getattr(args, flag) < args.tool_sft_steps:
            option = "--" + flag.replace("_", "-")
            parser.error(f"{option}: a baseline trains at least the tool SFT's budget (--tool-sft-steps)")
    if "grpo-tool" in args.stages and "sft-tool" not in args.stages:
        parser.error("--stages: grpo-tool starts from sft-tool's export")
    out, data, oracle_data = Path(args.out), args.data, args.oracle_data
    stages = [stage for stage in STAGES if stage.folder in args.stages]

    def steps_of(stage: Stage) -> int:
        return stage_steps(stage, args)

    if args.status:
        for seed, stage in running_order(stages, args.seeds):
            names = ["val", "test", "probe", *([GIVEN_ORACLE] if stage.folder == "sft-tool" else [])]
            recorded = bool(args.records) and zoom_records.recorded(Path(args.records), seed, stage.folder)
            run_dir = out / f"seed{seed}" / stage.folder
            print(f"seed {seed} " + stage_state(run_dir, steps_of(stage), names, recorded))
        return
    manifest = Path(data) / "dataset.json"
    if not manifest.exists():
        share = ["--given-oracle-share", str(args.given_oracle_share)]
        build_data = ["data", "zoom", "--out", data, "--trace-requests", "random", *share]
        run_lvrl(out, build_data, log_name="data-random.log")
    built_share = json.loads(manifest.read_text())["config"].get("given_oracle_share", 0.0)
    if built_share != args.given_oracle_share:
        parser.error(
            f"{data} gives {built_share} of its training rows the oracle request, "
            f"not --given-oracle-share {args.given_oracle_share}"
        )
    # The oracle copy serves the oracle crop and the tool SFT's reading check.
    needs_oracle = any(stage.oracle or stage.folder == "sft-tool" for stage in stages)
    if needs_oracle and not (Path(oracle_data) / "dataset.json").exists():
        # The random build's videos with oracle traces: the oracle crop sees the same pixels.
        zoom_oracle_data.build(Path(data), Path(oracle_data), out)
    model = out / "model-small"
    # --reuse keeps the model the folder's finished stages were trained from and refuses one of
    # another family: mixing them would compare runs of two different models.
    build = ["model", "build", "--family", args.family, "--preset", "small", "--out", str(model), "--reuse"]
    run_lvrl(out, [*build, "--corpus", f"{data}/train-00000.tar"], log_name="model-build.log")
    records = Path(args.records) if args.records else None
    restored: list[str] = []
    if records is not None:
        continuations = [f"grpo-tool-{steps}" for steps in args.longer_grpo]
        starts_from = {stage.folder: stage.after for stage in stages if stage.after}
        starts_from |= dict(zip(continuations, ["grpo-tool", *continuations], strict=False))
        folders = [stage.folder for stage in stages] + continuations
        restored = zoom_records.restore_finished(records, out, args.seeds, folders, starts_from)
        for name in restored:
            print(f"{name}: restored from its record in {records}", flush=True)

    def record(seed: int, stage: str, done: list[Path]) -> None:
        """Record a finished stage, unless it was just restored from its record."""
        if records is not None and f"seed{seed}/{stage}" not in restored:
            zoom_records.keep(records, seed, stage, done)

    results: dict[str, list[SeedResult]] = {stage.label: [] for stage in stages}
    costs: dict[str, list[Cost]] = {}
    longer: dict[int, list[dict[str, bool]]] = {}
    sft_answers: list[dict[str, bool]] = []
    first_grpo: list[dict[str, bool]] = []
    for seed, stage in running_order(stages, args.seeds):
        run_dir = out / f"seed{seed}" / stage.folder
        start = run_dir.parent / stage.after / "hf" if stage.after else model
        steps = steps_of(stage)
        stage_data = oracle_data if stage.oracle else data
        config = stage_config(stage, run_dir, start, stage_data, seed, steps, min_steps=args.tool_sft_steps)
        if stage.after:
            config = with_settings(config, args.grpo_set)
        trained = train(run_dir, config)
        probe = swapped_videos(
            Path(stage_data), "test", out / f"probe-{'oracle' if stage.oracle else 'random'}"
        )
        shards = {
            "val": f"{stage_data}/val-*.tar",
            "test": f"{stage_data}/test-*.tar",
            "probe": f"{probe}/test-*.tar",
        }
        evaluations = {name: evaluate(run_dir, glob, name) for name, glob in shards.items()}
        if stage.folder == "sft-tool":
            # GRPO rewards answers: it can teach where to look only to a model whose answers
            # are right when it looked there. Checked on validation, the oracle request given.
            evaluations[GIVEN_ORACLE] = evaluate(
                run_dir, f"{oracle_data}/val-*.tar", GIVEN_ORACLE, given_request=True
            )
        record(seed, stage.folder, [run_dir, *(folder for folder, _ in evaluations.values())])
        costs.setdefault(f"{stage.label} training", []).append(trained)
        evaluation_cost = summed(cost for _, cost in evaluations.values())
        costs.setdefault(f"{stage.label} evaluation", []).append(evaluation_cost)
        test_dir = evaluations["test"][0]
        tool = stage.frames is None
        splits = {split: evaluations[split][0] / "csv" for split in ("val", "test")}
        result = SeedResult(
            seed,
            {name: last(folder / "csv", "val/accuracy") for name, (folder, _) in evaluations.items()},
            answered([test_dir]),
            {
                split: last(csv, "val/frames_per_answer") if tool else float(stage.frames or 0)
                for split, csv in splits.items()
            },
            trained,
            max(last_steps(run_dir / "csv"), default=0),
        )
        if stage.plateau:
            result.val_loss = column(run_dir / "csv", "val/loss")
        if tool:
            result.requests = {split: last(csv, "val/requests_per_answer") for split, csv in splits.items()}
            result.span_hit = {split: last(csv, "val/span_hit_rate") for split, csv in splits.items()}
            result.hits = span_hits(test_dir)
        results[stage.label].append(result)
        if stage.folder == "sft-tool":
            sft_answers.append(answered([evaluations["val"][0], test_dir]))
        if stage.folder == "grpo-tool":
            first_grpo.append(answered([evaluations["val"][0], test_dir]))
            # The continuations come next, before the baselines (running_order says why).
            for more, answers in continue_grpo(
                run_dir, data, seed, args.longer_grpo, costs, args.grpo_set, record
            ):
                longer.setdefault(more, []).append(answers)

    config = yaml.safe_load((CONFIGS / "sft_tool.yaml").read_text())
    dataset = json.loads((Path(data) / "dataset.json").read_text())
    size = int(dataset["config"]["size"])
    tokens = tokens_per_frame(model, size, int(config["data"]["init_args"]["max_pixels_per_frame"]))
    lines = [f"zoom task, seeds {args.seeds}; visual tokens a frame: {tokens:g}"]
    lines += ["", "validation split (where recipes are chosen):", report(results, tokens, "val")]
    lines += reading_lines(results)
    lines += ["", "test split (the comparison; nothing was chosen on it):", report(results, tokens, "test")]
    lines += comparisons(results)
    caps = {stage.label: steps_of(stage) for stage in stages}
    lines += training_lines(results, caps, args.tool_sft_steps, BUDGETED, PLATEAU)
    if longer and sft_answers and first_grpo:
        lines.append(
            longer_grpo_report(
                args.grpo_steps, args.seeds, sft_answers, {args.grpo_steps: first_grpo, **longer}
            )
        )
    lines += ["", "the target stated before the runs:", *verdict(results)]
    lines.append("\nCPU seconds per seed: " + ", ".join(f"{k} {cost_cell(v)}" for k, v in costs.items()))
    lines.append(
        "(~: part charged per training step at the measured rate, for attempts whose CPU was not counted)"
    )
    lines.append(machine_line(costs, args.seeds))
    text = "\n".join(lines)
    print("\n" + text)
    if records is not None:
        # The report as a results file beside the records it was computed from, with where it
        # came from (the docs quote this file, not a terminal).
        name = f"report-seeds-{'-'.join(map(str, args.seeds))}.md"
        made = provenance([Path(sys.argv[0]).name, *sys.argv[1:]])
        header = [f"# bench/zoom.py report, seeds {args.seeds}", ""]
        header += [
            f"- {key}: {json.dumps(value) if isinstance(value, dict) else value}"
            for key, value in made.items()
        ]
        (records / name).write_text("\n".join([*header, "", "```", text, "```", ""]))
        print(f"written: {records / name}")


if __name__ == "__main__":
    with quiet_if_the_reader_leaves():  # `--status | head`
        main()
