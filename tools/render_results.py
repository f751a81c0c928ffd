"""Render the docs' result blocks from the results files that hold them.

A block sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` in README.md or a
page of docs/ and is rewritten from ``bench/results/...`` by the renderer of that name;
``--check`` rewrites nothing and exits 1 when a block differs from what its files give
(``tests/unit/test_docs.py`` checks the same), so a figure cannot outlive the result it came from.

Usage: python tools/render_results.py [--check]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def demo_block(root: Path) -> str:
    """The table `make demo` printed on a fresh clone, with the run's commit, machine, load and times."""
    folder = root / "bench" / "results" / "demo"
    run = json.loads((folder / "run.json").read_text())
    table = (folder / run["table"]).read_text().strip()
    machine = run["machine"]
    seconds = run["wall_seconds"]
    return "\n".join(
        [
            f"Printed at the end of `make demo` on a fresh clone (commit {run['commit']}, {run['date']}, an "
            f"{machine['cpu']} machine with {machine['cores']} cores; `bench/results/demo/`):",
            "",
            table,
            "",
            f"It took **{seconds['demo']} s** ({seconds['demo'] / 60:.0f} min: SFT + evaluation "
            f"{seconds['sft_and_evaluation']} s, GRPO + evaluation {seconds['grpo_and_evaluation']} s, data "
            f"rendering and the model build included; `make setup` {seconds['setup']} s before it). Load: "
            f"{run['load']}. Left behind: {run['left_behind']}.",
        ]
    )


DEMO_OVERALL = re.compile(r"\| \*\*overall\*\* \| ([0-9.]+)% \| ([0-9.]+)% \|")
DEMO_TEST = re.compile(r"same 400 questions: ([+-][0-9.]+)% \([^)]*\); exact McNemar (p [<=] [0-9.e-]+)")


def demo_runs_block(root: Path) -> str:
    """Every saved `make demo` run side by side (bench/results/demo/ and its folders): the spread
    of one command's table, run to run."""
    folder = root / "bench" / "results" / "demo"
    rows = [
        "| run (`bench/results/demo/`) | commit | conditions | after SFT | after GRPO | GRPO gain |",
        "|---|---|---|---:|---:|---:|",
    ]
    for run_file in [folder / "run.json", *sorted(folder.glob("*/run.json"))]:
        run = json.loads(run_file.read_text())
        table = (run_file.parent / run["table"]).read_text()
        sft, grpo = (float(x) for x in DEMO_OVERALL.search(table).groups())  # type: ignore[union-attr]
        test = DEMO_TEST.search(table)
        name = "(the table above)" if run_file.parent == folder else f"`{run_file.parent.name}/`"
        conditions = run["load"].split(":")[0]
        rows.append(
            f"| {name} | {run['commit']} | {conditions} | {sft:.1f}% | {grpo:.1f}% | "
            + (f"{test.group(1)} points ({test.group(2)}) |" if test else f"{grpo - sft:+.1f} points |")
        )
    return "\n".join(rows)


ZOOM_SEED0 = Path("bench/results/zoom_protocol/given-share-0.5-seed0-budget3000")
ZOOM_BENCH = Path("bench/results/zoom_protocol/bench-given-share-0.5")


def gpu_check_block(root: Path) -> str:
    """The planner against a real GPU: bench/gpu_check.py's ring attention and GRPO step."""
    report = json.loads((root / "bench" / "results" / "gpu_check" / "gpu_check.json").read_text())
    ring, step = report["ring"], report["grpo_step"]

    def row(check: str, part: dict) -> str:
        planned, measured = part["predicted"] / 2**30, part["measured"] / 2**30
        return f"| {check} | {planned:.2f} GiB | {measured:.2f} GiB | {part['error']:+.1%} |"

    dtype = ring["dtype"].removeprefix("torch.")
    return "\n".join(
        [
            f"Measured with `{report['command']}` (commit {report['commit']}, {report['date']}, one "
            f"{report['machine']['gpu']}; `bench/results/gpu_check/`):",
            "",
            "| check | planned | measured (`max_memory_allocated`) | error |",
            "|---|---:|---:|---:|",
            row(
                f"ring attention, one rank's slice of {ring['slice_tokens']:,} positions, "
                f"{ring['heads']} heads of {ring['head_dim']}, {dtype}, forward and backward",
                ring,
            ),
            row(f"GRPO step at the 7B widths, {step['layers']} layers, {step['frames']} frames", step),
            "",
            f"At ring attention's peak: {ring['score_chunks_alive']:.2f} float32 score chunks (query "
            f"chunks of {ring['query_chunk']:,} and {2 * ring['query_chunk']:,} differ by that many) "
            f"and {ring['slice_copies_alive']:.2f} float32 tensors the slice's size.",
        ]
    )


def zoom_cuda_block(root: Path) -> str:
    """The zoom task's tool-use episodes on a lent GPU (bench/results/zoom_cuda/given50/run.sh)
    against the same model's CPU evaluation and GRPO run."""
    folder = root / "bench" / "results" / "zoom_cuda" / "given50"
    call = json.loads((folder / "gpu_check.json").read_text())  # written by the same device call
    log = (folder / "run.log").read_text().splitlines()
    versions = next(line for line in log if line.startswith("python "))
    cuda = {
        r["problem_id"]: r for r in map(json.loads, (folder / "predictions.jsonl").read_text().splitlines())
    }
    with gzip.open(folder / "cpu-predictions.jsonl.gz", "rt") as lines:
        cpu = {r["problem_id"]: r for r in map(json.loads, lines)}
    shared = sorted(cuda.keys() & cpu.keys())
    same = sum(cuda[k]["turns"] == cpu[k]["turns"] for k in shared)
    cpu_run = ZOOM_SEED0 / "grpo-lr1e-4-kl0.2-requests-metrics.csv.gz"
    with gzip.open(root / cpu_run, "rt") as rows:
        cpu_steps = [r for r in csv.DictReader(rows) if r.get("time/rollout_s")]
    with (folder / "grpo-metrics.csv").open() as rows:
        cuda_steps = [r for r in csv.DictReader(rows) if r.get("time/rollout_s")]

    def answers(records: dict[str, dict[str, Any]]) -> str:
        correct, hit = (
            sum(bool(records[k][field]) for k in shared) / len(shared) for field in ("correct", "span_hit")
        )
        return f"{correct:.1%} / {hit:.1%}"

    def values(rows: list[dict[str, str]], field: str) -> list[float]:
        return sorted(float(r[field]) for r in rows)

    def gap(rows: list[dict[str, str]]) -> str:
        means = values(rows, "rollout/logprob_diff_mean")
        return f"{means[0]:.1e}-{means[-1]:.1e}; {values(rows, 'rollout/logprob_diff_max')[-1]:.1e}"

    def seconds(rows: list[dict[str, str]]) -> str:
        rollout, train = (
            statistics.median(values(rows, f"time/{phase}_s")) for phase in ("rollout", "train")
        )
        return f"{rollout:.1f} / {train:.1f}"

    memory = [values(cuda_steps, f"memory/{phase}_peak_gib")[-1] for phase in ("rollout", "train")]
    return "\n".join(
        [
            f"`bench/results/zoom_cuda/given50/run.sh`, one device call (commit {call['commit'][:7]}, "
            f"{call['date']}, one {call['machine']['gpu']}; {versions}; the transformers engine, no vLLM "
            "there): seed 0's recipe-5 GRPO export on the given-oracle zoom data, greedy, up to two "
            "requests of 16 frames. The CPU's: the seed's validation evaluation (`cpu-predictions.jsonl.gz`) "
            f"and GRPO run (`{cpu_run}`), on a machine shared with other work.",
            "",
            "| | CPU (vLLM, 2 cores) | CUDA (transformers engine) |",
            "|---|---:|---:|",
            f"| validation questions with the other's transcript, character for character | "
            f"{same} of {len(shared)} | {same} of {len(shared)} |",
            f"| accuracy / span hit on them | {answers(cpu)} | {answers(cuda)} |",
            f"| GRPO steps of 8 x 8 episodes, recipe 5 | {len(cpu_steps)} (the seed's run) | "
            f"{len(cuda_steps)} (continued from its export) |",
            f"| engine/trainer log-prob gap per token: step means; largest | {gap(cpu_steps)} | "
            f"{gap(cuda_steps)} |",
            f"| median seconds a step, rollout / training | {seconds(cpu_steps)} | {seconds(cuda_steps)} |",
            f"| peak allocated GiB, rollout / training | (CPU) | {memory[0]:.2f} / {memory[1]:.2f} |",
        ]
    )


def real_vocab_block(root: Path) -> str:
    """What Qwen's vocabulary costs a tiny GRPO step (bench/real_vocab_step.py), per shape run."""
    rows = [
        "| step (prompts x completions x tokens) | vocabulary | step | rollout | training | peak RSS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for path in sorted((root / "bench" / "results" / "real_vocab").glob("*.json")):
        report = json.loads(path.read_text())
        for run in report["grpo_steps"]:
            shape = " x ".join(str(n) for n in run["prompts_x_completions_x_new_tokens"])
            rows.append(
                f"| {shape} | {run['vocabulary_rows']:,} | {run['median_step_s']:.3f} s | "
                f"{run['median_rollout_s']:.3f} s | {run['median_training_s']:.3f} s | "
                f"{run['peak_resident_mib']:,.0f} MiB |"
            )
        pattern = {r["way"]: r for r in report["scoring_pattern"]["runs"]}
        index, unbind = pattern["index"], pattern["unbind"]
        notes.append(
            f"- `{path.name}` ({report['commit']}, {report['date']}, {report['machine']['cpu']}): the real "
            f"step {report['real_over_local_step']}x the local one, the arithmetic of a scored position "
            f"{report['real_over_local_macs_per_position']}x; scoring pattern "
            f"{' x '.join(str(n) for n in report['scoring_pattern']['shape'])}: indexed rows "
            f"{index['seconds']} s / {index['peak_above_start_mib']:,} MiB, unbind "
            f"{unbind['seconds']} s / {unbind['peak_above_start_mib']:,} MiB, gradients "
            f"{'bit-identical' if report['scoring_pattern']['gradients_identical'] else 'DIFFERENT'}"
        )
    return "\n".join([*rows, "", *notes])


def suite_block(root: Path) -> str:
    """The suite's count and time from CI's script on a fresh clone (bench/results/suite)."""
    run = json.loads((root / "bench" / "results" / "suite" / "ci.json").read_text())
    machine = run["machine"]
    workers = ""
    if "worker_seconds" in run:
        over = f"its {run['workers']} workers" if "workers" in run else "both workers"
        workers = f", {run['worker_seconds']:,} worker-seconds over {over}"
    if run.get("cpu_seconds"):
        cpu = run["cpu_seconds"]
        workers += (
            f" ({cpu['total']:,} CPU-seconds counted: {cpu['tests']:,} in the tests' own processes, "
            f"{cpu['their_commands']:,} in the commands they waited for)"
        )
    whole = ""
    if run.get("ci_run_cpu_seconds"):
        whole = (
            f" The whole `.ci/run` used {run['ci_run_cpu_seconds']:,} CPU-seconds: besides the tests' count, "
            "the set-up, pytest's collection, and the processes that outlive the command that started "
            "them, which the per-test count misses (each `lvrl` run's fork server and its dataloader "
            "workers)."
        )
    return (
        f"{run['passed']:,} passed, {run['skipped']} skipped; pytest {run['pytest_seconds']:,} s{workers}, "
        f"`.ci/run` {run['total_seconds']:,} s in all (the `.venv` set-up included) on a fresh clone of "
        f"{run['commit']} ({run['date']}, {machine['cpu']}, {machine['cores']} cores, {run['conditions']})."
        f"{whole}{pace_sentence(root, run)}"
    )


def pace_sentence(root: Path, run: dict[str, Any]) -> str:
    """The machine's pace around a suite record (``bench/suite_run.py`` takes it before and after:
    the CPU seconds of what every ``lvrl`` process imports first), beside the same measure in
    ``bench/results/process_costs`` (a record's pace is missing before the recorder took it)."""
    if "pace" not in run:
        return ""
    pace = run["pace"]["trainer_imports_cpu_seconds"]
    costs = json.loads((root / "bench" / "results" / "process_costs" / "process_costs.json").read_text())
    reference = costs["cpu_seconds"]["trainer imports"]["median"]
    return (
        f" The machine's pace: the imports every `lvrl` process starts with took "
        f"{pace['before']['median']:.1f} CPU-seconds before the run and {pace['after']['median']:.1f} "
        f"after (medians of {pace['before']['runs']}), against {reference:.1f} in "
        f"`bench/results/process_costs/` ({costs['date']})."
    )


SUITE_AIM = 480
"""Seconds: the 8 minutes asked of `make test` on a fresh clone of the 2-core machine, idle."""


def suite_comparison_block(root: Path) -> str:
    """Two commits' suite records, run back to back on an idle machine: what a cut changed
    (``bench/results/suite/comparison.json`` names the two record folders)."""
    suite = root / "bench" / "results" / "suite"
    spec = json.loads((suite / "comparison.json").read_text())
    before, after = (json.loads((suite / spec[key] / "ci.json").read_text()) for key in ("before", "after"))

    def figures(run: dict[str, Any]) -> str:
        return (
            f"pytest {run['pytest_seconds']:,} s, {run['worker_seconds']:,} worker-seconds, "
            f"{run['cpu_seconds']['total']:,} CPU-seconds counted"
        )

    def less(key: str, pick: Callable[[dict[str, Any]], float]) -> str:
        return f"{1 - pick(after) / pick(before):.0%} less {key}"

    return (
        f"Back to back, {spec['when']}: {before['commit']} ({spec['before_is']}) {figures(before)}; "
        f"{after['commit']} ({spec['after_is']}) {figures(after)}: "
        f"{less('pytest time', lambda r: r['pytest_seconds'])}, "
        f"{less('CPU', lambda r: r['cpu_seconds']['total'])} "
        f"(`bench/results/suite/{spec['before']}/`, `bench/results/suite/{spec['after']}/`). "
        f"At that pace {against_the_aim(after, SUITE_AIM)}"
    )


def suite_aim_block(root: Path) -> str:
    """The latest suite record against the aim, beside the comparison's later record: nearly the
    same tests, so what differs between them is the pace of the machine each ran on (the CPU
    seconds the same work took)."""
    suite = root / "bench" / "results" / "suite"
    latest = json.loads((suite / "ci.json").read_text())
    folder = json.loads((suite / "comparison.json").read_text())["after"]
    earlier = json.loads((suite / folder / "ci.json").read_text())
    text = f"On {latest['date']} (`bench/results/suite/ci.json`), {against_the_aim(latest, SUITE_AIM)}"
    if earlier["commit"] == latest["commit"]:
        return text
    pace = latest["cpu_seconds"]["total"] / earlier["cpu_seconds"]["total"]
    return (
        f"{text} The earlier record of nearly the same tests ({earlier['passed']:,} passed against "
        f"{latest['passed']:,}; `bench/results/suite/{folder}/`, alone on the machine too): "
        f"{against_the_aim(earlier, SUITE_AIM)} Its tests took {earlier['cpu_seconds']['total']:,} "
        f"CPU-seconds, the latest {latest['cpu_seconds']['total']:,}: the same work took "
        f"{abs(pace - 1):.0%} {'more' if pace > 1 else 'less'} CPU time on the machine of the later record."
    )


def against_the_aim(run: dict[str, Any], aim: int) -> str:
    """Where a suite record stands against the aim of ``aim`` seconds, for pytest alone and for
    `.ci/run` as a whole (the fresh clone's set-up included)."""

    def stand(seconds: int) -> str:
        if seconds == aim:  # recorded in whole seconds: at the aim, not under it
            return f"{seconds:,} s is at it, not under"
        if seconds < aim:
            return f"{seconds:,} s is under it by {aim - seconds:,} s"
        return f"{seconds:,} s is over it: the aim is {1 - aim / seconds:.0%} below"

    return (
        f"against the aim of {aim} s, {run['commit']}'s pytest time of {stand(run['pytest_seconds'])}, "
        f"and its whole `.ci/run` of {stand(run['total_seconds'])}."
    )


def suite_cpu_block(root: Path) -> str:
    """The files of the suite that cost the most CPU, from the comparison's later record
    (``cpu.jsonl``: each test's CPU seconds, its own and its commands')."""
    suite = root / "bench" / "results" / "suite"
    folder = json.loads((suite / "comparison.json").read_text())["after"]
    lines = [json.loads(line) for line in (suite / folder / "cpu.jsonl").read_text().splitlines()]
    files: dict[str, list[float]] = {}
    for line in lines:
        spent = files.setdefault(line["test"].split("::")[0], [0.0, 0.0, 0])
        spent[0] += line["own"]
        spent[1] += line["children"]
        spent[2] += 1
    total = sum(own + children for own, children, _ in files.values())
    rows = [
        "| file | tests | CPU-seconds | in its own process | in commands it waited for |",
        "|---|---:|---:|---:|---:|",
    ]
    ranked = sorted(files.items(), key=lambda item: -(item[1][0] + item[1][1]))
    for name, (own, children, count) in ranked[:10]:
        rows.append(f"| `{name}` | {count} | {own + children:.0f} | {own:.0f} | {children:.0f} |")
    rest = ranked[10:]
    rows.append(
        f"| the other {len(rest)} files | {sum(c for _, (_, _, c) in rest)} "
        f"| {sum(o + ch for _, (o, ch, _) in rest):.0f} | {sum(o for _, (o, _, _) in rest):.0f} "
        f"| {sum(ch for _, (_, ch, _) in rest):.0f} |"
    )
    rows.append(f"\n{total:.0f} CPU-seconds counted in all, from `bench/results/suite/{folder}/cpu.jsonl`.")
    return "\n".join(rows)


def short_commit(commit: str) -> str:
    """A recorded commit shortened, its mark of uncommitted changes kept (``abc1234+changes``)."""
    name, _, changes = commit.partition("+")
    return name[:7] + (f"+{changes}" if changes else "")


def process_costs_block(root: Path) -> str:
    """What one lvrl process costs before its work (bench/process_costs.py)."""
    report = json.loads((root / "bench" / "results" / "process_costs" / "process_costs.json").read_text())
    rows = [
        f"Measured with `python bench/{report['command']}` (commit {short_commit(report['commit'])}, "
        f"{report['date']}, {report['machine']['cpu']}, {report['machine']['cores']} cores, "
        f"threads: {report['threads']}; "
        "each the median of its runs, with their range; `bench/results/process_costs/`):",
        "",
        "| what | CPU-seconds | range |",
        "|---|---:|---:|",
    ]
    for name, cost in report["cpu_seconds"].items():
        rows.append(f"| {name} | {cost['median']:.1f} | {cost['min']:.1f}-{cost['max']:.1f} |")
    return "\n".join(rows)


def plan_configs_block(root: Path) -> str:
    """The plan of every shipped real-size config (bench/plan_configs.py's results)."""
    report = json.loads((root / "bench" / "results" / "plan" / "configs.json").read_text())
    lines = [
        "| config | model | frames (visual tokens) | sequence-parallel | peak per GPU (phase) | headroom "
        "| vLLM: KV needed / left in its share |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for row in report["rows"]:
        name, _, variant = row["config"].partition(" ")
        model = row["architecture"].rsplit("-", 1)[1].upper()
        sp = (
            f"{row['sequence_parallel']}, {row['attention'].capitalize()}"
            if row["sequence_parallel"] > 1
            else "1"
        )
        fits = "" if row["fits"] else " (does not fit)"
        engine = row["vllm"]
        kv = "no engine"
        if engine:
            needed, left = engine["kv_needed_gib"], engine["kv_available_gib"]
            kv = f"{needed:.1f} / {left:.1f} GiB of {engine['reserved_gib']:.1f}"
        label = f"`{name}`" + (f" {variant}" if variant else "")
        peak = f"{row['peak_gib']:.1f} GiB ({row['peak_phase']})"
        frames = f"{row['frames']:,} ({row['video_tokens']:,})"
        lines.append(
            f"| {label} | {model} | {frames} | {sp} | {peak} | {row['headroom_gib']:.1f} GiB{fits} | {kv} |"
        )
    return "\n".join(lines)


def plan_check_block(root: Path) -> str:
    """The planner against measured peaks on the CPU (bench/plan_check.py's results)."""
    lines = [
        "| attention | frames | processes | sequence-parallel | step: planned | measured | error "
        "| validation: planned | measured | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    mib = 2**20
    for name in ("ulysses-8f", "ulysses-64f", "ring-8f", "ring-64f"):
        report = json.loads((root / "bench" / "results" / "plan_check" / f"{name}.json").read_text())
        settings = report["settings"]
        for row in report["rows"]:
            lines.append(
                f"| {settings['attention']} | {settings['frames']} | {row['world']} | {row['sp']} "
                f"| {row['predicted'] / mib:.1f} MiB | {row['measured'] / mib:.1f} MiB | {row['error']:+.1%} "
                f"| {row['predicted_validation'] / mib:.1f} MiB | {row['measured_validation'] / mib:.1f} MiB "
                f"| {row['validation_error']:+.1%} |"
            )
    return "\n".join(lines)


def data_pipeline_block(root: Path) -> str:
    """Decoding memory and input-path throughput of an hour-long video (bench/data.py's results)."""
    report = json.loads((root / "bench" / "results" / "input_pipeline" / "pipeline.json").read_text())
    video = report["video"]
    count = int(video["minutes"] * 60 * video["fps"])
    side = int(video["max_pixels"] ** 0.5)
    lines = [
        f"Measured with `{report['command']}` (commit {report['commit']}, {report['date']}, "
        f"{report['machine']['cpu']}, {report['machine']['cores']} cores; an hour-long synthetic video, "
        f"{count:,} frames of {video['size']}x{video['size']} at {video['fps']:g} fps, H.264, frames resized "
        f"into {side}x{side} as in the demo):",
        "",
        "| sampled frames | peak RSS | growth over the process after imports | the frames themselves "
        "| decode time |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in report["memory"]:
        growth = (row["peak_kib"] - row["before_kib"]) / 1024
        lines.append(
            f"| {row['frames']:,} | {row['peak_kib'] / 1024:.1f} MiB | +{growth:.1f} MiB "
            f"| {row['frames_bytes'] / 2**20:.1f} MiB | {row['seconds']:.2f} s |"
        )
    workers = list(report["throughput"][0]["delivered"])
    lines += [
        "",
        "Throughput of the training input path (`VideoQAStream` in a `DataLoader`: read, decode, resize)",
        "against what a CoT-SFT step of the `small` model consumes (frames per batch / step time,",
        "measured in the same run):",
        "",
        "| sampled frames | step consumes | "
        + " | ".join(f"{w} worker{'s' if w != '1' else ''}" for w in workers)
        + " |",
        "|---:|---:|" + "---:|" * len(workers),
    ]
    for row in report["throughput"]:
        cells = [
            f"{row['delivered'][w]:,.0f} frames/s (x{row['delivered'][w] / row['consumed']:.2f})"
            for w in workers
        ]
        lines.append(
            f"| {row['frames']:,} | {row['consumed']:,.0f} frames/s ({row['step_seconds']:.2f} s/step) | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def probe_block(root: Path) -> str:
    """The build's video probe cost by decoded frames (bench/probe.py's results)."""
    report = json.loads((root / "bench" / "results" / "input_pipeline" / "probe.json").read_text())
    counts = list(next(iter(report["best_seconds"].values())))
    lines = [
        f"**Probe cost** per video, measured with `{report['command']}` (best of {report['repeats']} probes; "
        f"commit {report['commit']}, {report['date']}, {report['machine']['cpu']}, "
        f"{report['machine']['cores']} cores):",
        "",
        "| video | "
        + " | ".join(f"`--probe-frames {n}`" + (" (default)" if n == "16" else "") for n in counts)
        + " |",
        "|---|" + "---:|" * len(counts),
    ]
    for name, best in report["best_seconds"].items():
        lines.append(f"| {name} | " + " | ".join(f"{best[n] * 1000:.0f} ms" for n in counts) + " |")
    return "\n".join(lines)


def lora_block(root: Path) -> str:
    """LoRA against full fine-tuning on the small preset (bench/lora.py's results)."""
    report = json.loads((root / "bench" / "results" / "lora" / "small.json").read_text())
    settings, mib = report["settings"], 2**20
    lines = [
        f"On the `small` preset (built by the script, as `lvrl model build --preset small` does), one SFT "
        f"step (forward, backward, AdamW) on {settings['batch']} synthetic video QA samples of "
        f"{settings['frames']} frames, float32, CPU seconds on {settings['threads']} thread(s), median of "
        f"{settings['steps']} steps; `{report['command']}` at {report['commit']} ({report['date']}, "
        f"{report['machine']['cpu']}):",
        "",
        "| | trainable parameters | gradient bytes | AdamW state bytes | GRPO reference copy "
        "| step (CPU s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["modes"]:
        share = row["trainable"] / row["parameters"]
        lines.append(
            f"| {row['mode']} | {row['trainable']:,} ({share:.1%}) | {row['grad_bytes'] / mib:.2f} MiB "
            f"| {row['adam_bytes'] / mib:.2f} MiB | {row['reference_bytes'] / mib:.2f} MiB "
            f"| {row['step_s']:.3f} |"
        )
    return "\n".join(lines)


def run_line(report: dict) -> str:
    """Where a results file's figures came from: its command, commit, date and machine."""
    machine = report["machine"]
    head, _, changes = report["commit"].partition("+")
    commit = head[:7] + (f"+{changes}" if changes else "")
    return f"`{report['command']}` at {commit} ({report['date']}, {machine['cpu']}, {machine['cores']} cores)"


def rollout_block(root: Path) -> str:
    """Encoding once against re-encoding, at a real-width vision tower (bench/rollout.py's results)."""
    report = json.loads((root / "bench" / "results" / "rollout" / "cpu.json").read_text())
    generations = report["settings"]["generations"]
    passes = report["frames"][0]["naive_encodes"]
    lines = [
        f"Measured with {run_line(report)}; {report['wall_seconds']:,} s of wall time. CPU seconds "
        "of the process on one thread, one run:",
        "",
        "| frames (video tokens) | vision-tower pass | vLLM rollouts | reference + policy passes "
        f"| RL step, encode once | re-encoding ({passes} passes) | ratio | ratio, engine encodes once |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    extras = []
    for row in report["frames"]:
        lines.append(
            f"| {row['frames']:,} ({row['video_tokens']:,}) | {row['encode']:.1f} s | {row['vllm']:.1f} s "
            f"| {row['passes']:.1f} s | {row['step_encode_once']:.1f} s | {row['step_re_encoding']:,.0f} s "
            f"| **x{row['ratio']:.1f}** | x{row['ratio_engine_encodes_once']:.1f} |"
        )
        if "hf_rate" in row:
            extras.append(
                f"at {row['frames']} frames vLLM {row['vllm_rate']:.0f} against the transformers engine's "
                f"{row['hf_rate']:.0f} completion tokens/s (x{row['vllm_rate'] / row['hf_rate']:.1f})"
            )
        if "whole_rows" in row:
            extras.append(
                f"at {row['frames']} frames the reference + policy passes {row['passes']:.2f} s with the "
                f"prompt shared against {row['whole_rows']:.2f} s with every row whole "
                f"(x{row['whole_rows'] / row['passes']:.1f})"
            )
    return "\n".join([*lines, "", f"G = {generations}. Also measured: " + "; ".join(extras) + "."])


def mr_sp_report(root: Path) -> dict:
    return json.loads((root / "bench" / "results" / "mr_sp" / "cpu.json").read_text())


def mr_sp_memory_block(root: Path) -> str:
    """Saved activations per rank by sequence-parallel size (bench/mr_sp.py's memory part)."""
    report = mr_sp_report(root)
    settings = report["settings"]
    lines = [
        f"Measured with {run_line(report)}: the `{settings['preset']}` model, {settings['attention']} "
        "attention, forward + backward of one row:",
        "",
        f"| sequence-parallel size | saved activations per rank, {settings['tokens']:,}-token row "
        f"| peak RSS growth | longest row within {settings['budget_mib']} MiB per rank |",
        "|---:|---:|---:|---:|",
    ]
    for row in report["memory"]:
        lines.append(
            f"| {row['size']} | {row['saved_mib']:.1f} MiB (x{row['saved_over_first']:.2f}) "
            f"| {row['peak_rss_growth_mib']:.1f} MiB | {row['longest_tokens_within_budget']:,} tokens |"
        )
    lines += [
        "",
        "The peak RSS growth is the rise of the process's peak resident memory over the pass: 0 when the "
        "pass stayed under the peak the process had already reached, so only the saved bytes compare "
        "exactly.",
    ]
    return "\n".join(lines)


def mr_sp_step_block(root: Path) -> str:
    """The MR-SP step against re-encoding, per frame count (bench/mr_sp.py's step part)."""
    report = mr_sp_report(root)
    settings = report["settings"]
    lines = [
        f"Measured with {run_line(report)}, {report['wall_seconds']:,} s of wall time for all "
        f"three parts; G = {settings['generations']}, {settings['attention']} attention, per-rank CPU "
        "seconds, one thread a rank:",
        "",
        "| ranks | frames (video tokens) | encoding share per rank | all-gather | passes, prompt shared "
        "| MR-SP step | re-encoding step | ratio | passes with rows whole |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["step"]:
        whole = row.get("passes_rows_whole_s")
        rows_whole = f"{whole:.2f} s (x{whole / row['passes_s']:.1f})" if whole is not None else "not run"
        lines.append(
            f"| {row['size']} | {row['frames']:,} ({row['video_tokens']:,}) | {min(row['share_s']):.1f}-"
            f"{max(row['share_s']):.1f} s | {row['gather_s']:.2f} s | {row['passes_s']:.2f} s "
            f"| {row['mr_sp_step_s']:.1f} s | {row['re_encoding_step_s']:,.0f} s | **x{row['ratio']:.0f}** "
            f"| {rows_whole} |"
        )
    encodings = " / ".join(f"{row['whole_video_encoding_s']:.1f}" for row in report["step"])
    lines += ["", f"The whole-video encodings these count (the sum of the shares): {encodings} s."]
    return "\n".join(lines)


def ring_layouts_block(root: Path) -> str:
    """Contiguous against zigzag ring layouts, per rank (bench/mr_sp.py's ring part)."""
    report = mr_sp_report(root)
    settings = report["settings"]
    lines = [
        f"Measured with {run_line(report)}: one {settings['ring_tokens']:,}-token text row, the "
        f"`{settings['preset']}` model, forward + backward, per-rank CPU seconds (the best of "
        f"{settings['ring_repeats']} runs, the layouts taking turns):",
        "",
        "| ranks | layout | CPU per rank | slowest rank | attention scores per rank (x rank 0's) | wall |",
        "|---:|---|---|---:|---|---:|",
    ]
    slowest: dict[tuple[int, str], float] = {}
    for row in report["ring"]:
        slowest[row["size"], row["layout"]] = max(row["cpu_s"])
    for row in report["ring"]:
        mark = ""
        if row["layout"] == "zigzag":
            mark = f" (x{slowest[row['size'], 'contiguous'] / slowest[row['size'], 'zigzag']:.2f} faster)"
        lines.append(
            f"| {row['size']} | {row['layout']} | {' / '.join(f'{c:.2f}' for c in row['cpu_s'])} s "
            f"| {max(row['cpu_s']):.2f} s{mark} | {' / '.join(f'{x:g}' for x in row['scores_over_rank0'])} "
            f"| {row['wall_s']:.1f} s |"
        )
    return "\n".join(lines)


def zoom_cost_block(root: Path) -> str:
    """What asking for frames saves one GRPO group's scoring at Qwen3-VL widths (bench/zoom_cost.py)."""
    folder = root / "bench" / "results" / "zoom_cost"
    report = json.loads((folder / "cost_4b.json").read_text())
    cases = {case["case"]: case for case in report["cases"]}
    tool = cases["tool"]
    lines = [
        f"On one {report['device']} (torch {report['torch']}, transformers {report['transformers']}; "
        "`bench/results/zoom_cost/cost_4b.json`, written before results files recorded their commit):",
        "",
        "| case (frames seen) | video tokens | row length | encode | scoring fwd+bwd "
        "| scoring peak above weights |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, case in cases.items():
        label = "tool (16 + 32)" if name == "tool" else name.replace("-", " ")
        ratio = "" if name == "tool" else f" ({case['score_ms'] / tool['score_ms']:.1f}x)"
        peak = "" if name == "tool" else f" ({case['score_peak_gib'] / tool['score_peak_gib']:.1f}x)"
        lines.append(
            f"| {label} | {case['video_tokens']:,} | {case['seq_len']:,} | {case['encode_ms']:.0f} ms "
            f"| {case['score_ms'] / 1000:.1f} s{ratio} | {case['score_peak_gib']:.1f} GiB{peak} |"
        )
    small = json.loads((folder / "cost_2b.json").read_text())
    figures = ", ".join(
        f"{case['case'].replace('-', ' ')} {case['score_ms'] / 1000:.1f} s / {case['score_peak_gib']:.1f} GiB"
        for case in small["cases"]
    )
    distinct = json.loads((folder / "cost_4b_distinct.json").read_text())
    spread_cases = {case["case"]: case for case in distinct["cases"]}
    spread, dense = spread_cases["tool"], spread_cases["dense-256"]
    lines += [
        "",
        f"With Qwen3-VL-2B's widths (`cost_2b.json`, {small['parameters']['total'] / 1e9:.2f}B parameters): "
        f"{figures}. The table's eight episodes ask for the same stretch (encoded once, the segment "
        f"cache); with eight different stretches (`--spans distinct`, `cost_4b_distinct.json`) the tower "
        f"encodes {spread['frames_encoded']} frames in {spread['encode_ms']:.0f} ms (dense 256 in the "
        f"same run: {dense['encode_ms']:.0f} ms), and the scoring pass is {spread['score_ms'] / 1000:.1f} s, "
        f"{spread['score_peak_gib']:.1f} GiB.",
    ]
    return "\n".join(lines)


def logged(folder: Path, name: str) -> list[float]:
    """Every value of ``name`` in a CSV logger's ``version_N/metrics.csv`` files, in step order."""
    rows = [
        row for path in sorted(folder.glob("version_*/metrics.csv")) for row in csv.DictReader(path.open())
    ]
    rows.sort(key=lambda row: int(row["step"]))
    return [float(row[name]) for row in rows if row.get(name)]


def mismatch_calibration_block(root: Path) -> str:
    """The short uncorrected runs the mismatch bench's weight noise was chosen on (their CSV logs)."""
    folder = root / "bench" / "results" / "mismatch_weights" / "calibration"
    lines = [
        "| weight noise | steps | trainer-engine gap, nats/token (min - max) | rollout accuracy (mean) |",
        "|---|---:|---|---:|",
    ]
    runs = sorted(folder.glob("noise-*"), key=lambda run: float(run.name.removeprefix("noise-")))
    for run in runs:
        gap, accuracy = (
            logged(run / "csv", "rollout/logprob_diff_mean"),
            logged(run / "csv", "rollout/accuracy"),
        )
        lines.append(
            f"| {run.name.removeprefix('noise-')} | {len(gap)} | {min(gap):.3f} - {max(gap):.3f} "
            f"| {sum(accuracy) / len(accuracy):.3f} |"
        )
    lines.append(
        "\nFrom the CSV logs in `bench/results/mismatch_weights/calibration/` (the commands and commit "
        "in its README)."
    )
    return "\n".join(lines)


def mismatch_block(root: Path) -> str:
    """The correction bench's comparison over seeds (bench/mismatch.py's ``mismatch.md``, with where
    it came from)."""
    folder = root / "bench" / "results" / "mismatch_weights"
    report = json.loads((folder / "mismatch.json").read_text())
    table = (folder / "mismatch.md").read_text().strip()
    return (
        f"{table}\n\nRun by {run_line(report)}; every run's config, CSV log, rollout samples and "
        "held-out predictions are in `bench/results/mismatch_weights/`, the rollout accuracy over "
        "the steps in [its plot](../bench/results/mismatch_weights/rollout_accuracy.png)."
    )


def qwen3_bisect_block(root: Path) -> str:
    """The Qwen3-VL demo's SFT stage at each commit of its first days, on one copy of the data
    (bench/sft_at_commit.py's records; ``commits.txt`` gives their order, oldest first)."""
    folder = root / "bench" / "results" / "demo-qwen3_vl" / "bisect"
    categories = ["Temporal", "Goal and Purpose", "Spatial", "Plot"]
    lines = [
        "| commit | date | what it changed | " + " | ".join(categories) + " | overall |",
        "|---|---|---|" + "---:|" * (len(categories) + 1),
    ]
    records = []
    for entry in (folder / "commits.txt").read_text().splitlines():
        commit, day, time_of_day, subject = entry.split(" ", 3)
        record = json.loads((folder / f"{commit}.json").read_text())
        records.append(record)
        cells = [f"{record['accuracy'][name]['accuracy']:.1%}" for name in [*categories, "overall"]]
        subject = subject if len(subject) <= 70 else subject[:67].rsplit(" ", 1)[0] + " ..."
        lines.append(f"| {commit} | {day} {time_of_day} | {subject} | " + " | ".join(cells) + " |")
    lines.append(
        f"\nEach row by `{records[0]['command'].replace(records[0]['evaluated_commit'], 'REV')}` "
        f"({records[0]['date']}, {records[0]['machine']['cpu']}, {records[0]['machine']['cores']} cores, "
        "each alone on the machine; the records, with the three commands' output, are in "
        "`bench/results/demo-qwen3_vl/bisect/`)."
    )
    return "\n".join(lines)


def zoom_bench_block(root: Path) -> str:
    """The zoom bench's report over the most seeds so far (``report-seeds-*.md`` that
    ``bench/zoom.py --records`` writes; of two over as many seeds, the later date, then the larger
    name), as it printed it, with where it came from."""
    folder = root / ZOOM_BENCH
    reports = []
    for path in folder.glob("report-seeds-*.md"):
        # The provenance lines come before the fenced report, whose own lines may start with "- ".
        above, body = path.read_text().split("```\n", 1)
        header = dict(line[2:].split(": ", 1) for line in above.splitlines() if line.startswith("- "))
        seeds = path.stem.removeprefix("report-seeds-").split("-")
        reports.append(
            ((len(seeds), header["date"], path.name), path, header, body.rsplit("```", 1)[0].strip())
        )
    _, path, header, body = max(reports, key=lambda report: report[0])
    machine = json.loads(header["machine"])
    return "\n".join(
        [
            f"`{path.relative_to(root)}`, printed by `python bench/{header['command']}` at commit "
            f"{header['commit'][:7]} on {header['date']} ({machine['cpu']}, {machine['cores']} cores; "
            "every stage's config, attempts, metrics and predictions in the seed folders beside it):",
            "",
            "```",
            body,
            "```",
        ]
    )


RENDERERS: dict[str, Callable[[Path], str]] = {
    "zoom_bench": zoom_bench_block,
    "qwen3_bisect": qwen3_bisect_block,
    "mismatch_calibration": mismatch_calibration_block,
    "mismatch": mismatch_block,
    "rollout": rollout_block,
    "mr_sp_memory": mr_sp_memory_block,
    "mr_sp_step": mr_sp_step_block,
    "ring_layouts": ring_layouts_block,
    "zoom_cost": zoom_cost_block,
    "lora": lora_block,
    "probe": probe_block,
    "data_pipeline": data_pipeline_block,
    "plan_configs": plan_configs_block,
    "plan_check": plan_check_block,
    "gpu_check": gpu_check_block,
    "zoom_cuda": zoom_cuda_block,
    "demo": demo_block,
    "demo_runs": demo_runs_block,
    "real_vocab": real_vocab_block,
    "suite": suite_block,
    "suite_aim": suite_aim_block,
    "suite_comparison": suite_comparison_block,
    "suite_cpu": suite_cpu_block,
    "process_costs": process_costs_block,
}


def render(text: str, root: Path) -> tuple[str, set[str]]:
    """``text`` with every block it holds rewritten from its files, and the names of those blocks."""
    found = set()
    for name, renderer in RENDERERS.items():
        pattern = re.compile(rf"(<!-- results:{name} -->\n).*?(\n<!-- /results:{name} -->)", re.DOTALL)
        if not pattern.search(text):
            continue
        found.add(name)
        block = renderer(root)
        text = pattern.sub(lambda match, block=block: match.group(1) + block + match.group(2), text)
    return text, found


def pages(root: Path) -> list[Path]:
    """The Markdown pages that may hold blocks: README.md and every page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def stale_pages(root: Path, write: bool) -> list[Path]:
    """The pages whose blocks differ from their files (rewritten when ``write``); every block must
    be somewhere."""
    stale, found = [], set()
    for page in pages(root):
        current = page.read_text()
        rendered, names = render(current, root)
        found |= names
        if rendered != current:
            stale.append(page)
            if write:
                page.write_text(rendered)
    missing = set(RENDERERS) - found
    if missing:
        raise ValueError(f"no page holds the results block(s) {sorted(missing)}")
    return stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block is not what its files give")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository (README.md, docs/, bench/)")
    args = parser.parse_args()
    stale = stale_pages(args.root, write=not args.check)
    if args.check and stale:
        names = ", ".join(str(p.relative_to(args.root)) for p in stale)
        print(f"{names}: a results block differs from its files: python tools/render_results.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
