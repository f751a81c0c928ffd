"""The zoom bench's report (:mod:`bench.zoom`): the settings side by side per split, the paired
tests on the test split (per question and over seeds), how each training ended and what it
cost, and the verdict of the target stated before the runs (docs/tool-use.md, "Where to look,
learned"). Reads :class:`SeedResult` records; runs nothing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from app.commands.report import paired_comparison
from bench.grpo_runs import markdown, mean_and_spread
from evaluation.significance import paired_seeds


@dataclass(frozen=True)
class Cost:
    """CPU seconds a stage cost over its attempts (the trainer and every process it started,
    :mod:`bench.process_usage`): unlike wall time, untouched by pauses and by other work on the
    machine. ``estimated``: part of it was charged at the measured rate per training step, for
    attempts made before CPU time was counted (see :func:`bench.zoom.stage_cost`)."""

    cpu_seconds: float
    estimated: bool = False
    machines: tuple[str, ...] = ()
    """The CPUs its attempts ran on (their records' ``machine.cpu``), sorted: CPU seconds of two
    CPU models are not the same unit."""


def summed(costs: Iterable[Cost]) -> Cost:
    listed = list(costs)
    machines = tuple(sorted({m for c in listed for m in c.machines}))
    return Cost(sum(c.cpu_seconds for c in listed), any(c.estimated for c in listed), machines)


def machine_line(costs: dict[str, list[Cost]], seeds: list[int]) -> str:
    """Where the CPU seconds were counted: one CPU for every stage, or, when the bench moved
    between machines, which CPU ran each stage of each seed (``costs[name][i]`` is seed
    ``seeds[i]``'s), since a second of one CPU model is not a second of another."""
    every = {m for listed in costs.values() for c in listed for m in c.machines}
    if len(every) <= 1:
        return f"CPU seconds counted on one CPU: {next(iter(every), 'not recorded')}"
    parts = []
    for name, listed in costs.items():
        by_machine: dict[str, list[int]] = {}
        for seed, cost in zip(seeds, listed, strict=False):
            by_machine.setdefault(" + ".join(cost.machines) or "not recorded", []).append(seed)
        parts.append(
            f"{name}: " + "; ".join(f"{m} (seed {', '.join(map(str, s))})" for m, s in by_machine.items())
        )
    heading = "CPU seconds counted on different CPUs (not one unit; compare across them only roughly): "
    return heading + ", ".join(parts)


def cost_cell(costs: list[Cost]) -> str:
    """Mean ± spread of CPU seconds over seeds, ``~`` before it when any part is estimated."""
    cell = mean_and_spread([c.cpu_seconds for c in costs], 0)
    return ("~" if any(c.estimated for c in costs) else "") + cell


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


GIVEN_ORACLE = "val-given-oracle"
"""The tool SFT's reading check: the validation questions (the oracle copy's) with the oracle
request given, so that the right stretch is served whatever the model would ask for."""


@dataclass
class SeedResult:
    """One stage of one seed: what the report reads."""

    seed: int
    accuracy: dict[str, float]
    """Per evaluation (``val``, ``test``, ``probe``; the tool SFT's also :data:`GIVEN_ORACLE`)."""
    answers: dict[str, bool]
    """Test questions: right or not."""
    frames: dict[str, float]
    """Frames seen per answer, per evaluation (``val``, ``test``)."""
    trainer: Cost
    steps: int = 0
    """Training steps the stage ran (its last logged step)."""
    requests: dict[str, float] = field(default_factory=dict)
    """Requests per answer, per evaluation (tool settings only)."""
    span_hit: dict[str, float] = field(default_factory=dict)
    """Span hit rate, per evaluation (tool settings only)."""
    hits: dict[str, bool] | None = None
    """Test questions: whether the answer's requests covered half the answer's stretch."""
    val_loss: list[float] = field(default_factory=list)
    """A baseline's validation-loss checks during training, in step order."""


@dataclass(frozen=True)
class Plateau:
    """The rule that ends a baseline's training (Lightning's ``EarlyStopping`` on ``val/loss``):
    ``patience`` checks in a row without a fall of more than ``min_delta`` below the best so far."""

    patience: int
    min_delta: float

    def checks_without_gain(self, losses: list[float]) -> int:
        """How many checks at the end of ``losses`` brought no gain, counted as the rule counts:
        in float32, as Lightning compares the logged values (the CSV log holds them exactly), so a
        fall of about ``min_delta`` is judged as it was during training."""
        best, waited = torch.tensor(float("inf")), 0
        for loss in losses:
            current = torch.tensor(loss, dtype=torch.float32)
            if bool(current + self.min_delta < best):
                best, waited = current, 0
            else:
                waited += 1
        return waited

    def state(self, losses: list[float]) -> str:
        """``plateaued``, ``still falling`` or ``too few checks``, for the end of a run's curve."""
        if len(losses) <= self.patience:
            return "too few checks"
        return "plateaued" if self.checks_without_gain(losses) >= self.patience else "still falling"


NOT_TOOL = float("nan")
"""Requests and span hit of a setting that asks for no frames (shown as nan)."""


def report(results: dict[str, list[SeedResult]], tokens: float, split: str) -> str:
    """The settings side by side on ``split`` (``val``: where recipes are chosen; ``test``: the
    comparison, with the reading probe)."""
    headers = ["setting", "accuracy", "per seed", "frames / answer", "visual tokens / answer"]
    headers += ["training steps", "trainer CPU s"]
    headers += ["requests / answer", "span hit rate"] + (
        ["another video's frames"] if split == "test" else []
    )
    rows = []
    for label, seeds in results.items():
        if not seeds:
            continue
        accuracy = [r.accuracy[split] for r in seeds]
        frames = [r.frames[split] for r in seeds]
        row = [
            label,
            mean_and_spread(accuracy),
            ", ".join(f"{r.seed}: {r.accuracy[split]:.3f}" for r in seeds),
            mean_and_spread(frames, 1),
            mean_and_spread([f * tokens for f in frames], 0),
            mean_and_spread([float(r.steps) for r in seeds], 0),
            cost_cell([r.trainer for r in seeds]),
            mean_and_spread([r.requests.get(split, NOT_TOOL) for r in seeds], 2),
            mean_and_spread([r.span_hit.get(split, NOT_TOOL) for r in seeds]),
        ]
        if split == "test":
            row.append(mean_and_spread([r.accuracy["probe"] for r in seeds]))
        rows.append(row)
    return markdown(headers, rows)


def comparisons(results: dict[str, list[SeedResult]]) -> list[str]:
    """Test-split tests: per question (exact McNemar, per seed and pooled) and over seeds (paired
    t-test), for tool GRPO against its SFT start, against dense at its budget and against each
    dense baseline; tool SFT against dense at its budget; and the span hit rate, GRPO vs SFT."""
    lines = []
    pairs = [("tool GRPO", "tool SFT"), ("tool SFT", "dense 48")]
    pairs += [
        ("tool GRPO", label) for label in results if label.startswith("dense") or label == "oracle crop"
    ]
    for new, base in pairs:
        if not results.get(new) or not results.get(base):
            continue
        seeds = [r.seed for r in results[new]]
        if seeds != [r.seed for r in results[base]]:
            continue
        lines.append(
            paired_line(
                f"{new} vs {base}",
                seeds,
                [r.answers for r in results[base]],
                [r.answers for r in results[new]],
            )
        )
        if len(seeds) > 1:
            over = paired_seeds(
                [r.accuracy["test"] for r in results[base]], [r.accuracy["test"] for r in results[new]]
            )
            lines.append(f"  over seeds: {over.line()}")
    grpo, sft = results.get("tool GRPO"), results.get("tool SFT")
    if grpo and sft and all(r.hits for r in grpo + sft):
        seeds = [r.seed for r in grpo]
        lines.append(
            paired_line(
                "span hit, tool GRPO vs tool SFT",
                seeds,
                [r.hits or {} for r in sft],
                [r.hits or {} for r in grpo],
            )
        )
        if len(seeds) > 1:
            over = paired_seeds([r.span_hit["test"] for r in sft], [r.span_hit["test"] for r in grpo])
            lines.append(f"  over seeds: {over.line()}")
    return lines


def reading_lines(results: dict[str, list[SeedResult]]) -> list[str]:
    """The tool SFT's validation accuracy on its own requests and with the oracle request given,
    per seed: a start GRPO can teach where to look reads the right stretch when given it."""
    seeds = [r for r in results.get("tool SFT", []) if GIVEN_ORACLE in r.accuracy]
    if not seeds:
        return []
    cells = ", ".join(
        f"seed {r.seed} {100 * r.accuracy['val']:.1f}% -> {100 * r.accuracy[GIVEN_ORACLE]:.1f}%"
        for r in seeds
    )
    return [f"tool SFT on validation, on its own requests -> given the oracle request: {cells}"]


def training_lines(
    results: dict[str, list[SeedResult]],
    caps: dict[str, int],
    budget: int,
    budgeted: Iterable[str],
    plateau: Plateau,
) -> list[str]:
    """How each SFT setting's training ended (the settings in ``budgeted``, the tool SFT, at their
    ``budget``; a baseline after at least that many steps, at its plateau or at its most steps,
    ``caps[label]``, and whether its validation loss had plateaued by then), and what the baselines
    cost against the tool path (tool SFT + tool GRPO, mean CPU seconds over seeds): the protocol
    trains dense 256 to its plateau or to at least 3 times the tool path's compute."""

    def mean_cpu(label: str) -> float:
        seeds = results.get(label, [])
        return sum(r.trainer.cpu_seconds for r in seeds) / len(seeds) if seeds else float("nan")

    lines = ["\nhow each SFT setting's training ended, and its compute against the tool path:"]
    tool_path = mean_cpu("tool SFT") + mean_cpu("tool GRPO")
    for label, seeds in results.items():
        if not seeds or label == "tool GRPO":
            continue
        if label in set(budgeted):
            short = [f"seed {r.seed} at step {r.steps}" for r in seeds if r.steps < budget]
            lines.append(
                f"- {label}: ran its budget of {budget} steps in {len(seeds) - len(short)} of "
                f"{len(seeds)} seeds" + (f" ({', '.join(short)})" if short else "")
            )
            continue
        steps = ", ".join(f"seed {r.seed} {r.steps}" for r in seeds)
        ended = f"steps {steps} (at least {budget}, at most {caps[label]})"
        states: dict[str, list[int]] = {}
        for r in seeds:
            states.setdefault(plateau.state(r.val_loss), []).append(r.seed)
        loss = "; ".join(f"{state} in seeds {found}" for state, found in states.items())
        rule = f"no fall of more than {plateau.min_delta:g} in its last {plateau.patience} checks"
        against = (
            f"{mean_cpu(label) / tool_path:.2f} times the tool path's CPU seconds"
            if tool_path > 0  # NaN (a setting not run) compares false
            else "the tool path was not run"
        )
        lines.append(f"- {label}: {ended}; validation loss at the end ({rule}: plateaued): {loss}; {against}")
    return lines


def verdict(results: dict[str, list[SeedResult]]) -> list[str]:
    """The target stated before the runs (docs/tool-use.md), point by point, on the test split. A
    point whose settings were not run (``--stages``) says so: it is neither met nor missed."""

    def mean_accuracy(label: str) -> float:
        values = [r.accuracy["test"] for r in results.get(label, [])]
        return sum(values) / len(values) if values else float("nan")

    if not results.get("tool GRPO"):
        return ["- no verdict: tool GRPO was not run"]
    grpo = mean_accuracy("tool GRPO")
    lines = []
    if results.get("dense 48"):
        lines.append(
            f"- target: tool GRPO {grpo:.3f} vs dense 48 {mean_accuracy('dense 48'):.3f}: "
            + ("met" if grpo - mean_accuracy("dense 48") >= 0.10 else "NOT met")
            + " (at least +0.10)"
        )
    else:
        lines.append("- target: tool GRPO at least +0.10 over dense 48: no verdict, dense 48 was not run")
    dense = {label: seeds for label, seeds in results.items() if label.startswith("dense") and seeds}
    # A dense baseline reads when the probe (another video's frames) costs it 10 points or more.
    reading = {
        label: mean_accuracy(label)
        for label, seeds in dense.items()
        if mean_accuracy(label) - sum(r.accuracy["probe"] for r in seeds) / len(seeds) >= 0.10
    }
    within = "- target: within 0.05 of the best dense baseline that reads"
    if reading:
        best = max(reading, key=reading.__getitem__)
        lines.append(
            f"{within} ({best}, {reading[best]:.3f}): "
            + ("met" if grpo >= reading[best] - 0.05 else "NOT met")
        )
    elif dense:
        lines.append(f"{within}: no dense baseline reads")
    else:
        lines.append(f"{within}: no verdict, no dense baseline was run")
    grpo_runs, sft_runs = results.get("tool GRPO", []), results.get("tool SFT", [])
    span = "- target: span hit rate above the SFT start across seeds: "
    if [r.seed for r in grpo_runs] != [r.seed for r in sft_runs]:
        lines.append(span + "no verdict, tool SFT and tool GRPO were not run on the same seeds")
    elif len(grpo_runs) < 2:
        # A paired test over seeds needs two of them; one seed's McNemar test is printed above.
        lines.append(span + f"no verdict, a test across seeds needs two or more ({len(grpo_runs)} run)")
    else:
        over = paired_seeds([r.span_hit["test"] for r in sft_runs], [r.span_hit["test"] for r in grpo_runs])
        higher = over.mean > 0 and over.p_value < 0.05
        lines.append(span + f"{'met' if higher else 'NOT met'} ({over.line()})")
    return lines
