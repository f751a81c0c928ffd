"""What to change when a memory plan does not fit, each change priced by planning it again.

The changes are tried in a fixed order, cheapest in training quality and speed first:
activation checkpointing, a larger sequence-parallel group, fewer rows per micro-batch, the
reference model on the host, optimizer offload, fewer frames, a smaller vLLM share. When the
engine's own KV cache does not fit its share, raising the share comes first. Each
suggestion carries the plan with that one change (so its saving is exact under the planner's
arithmetic), and :func:`combined_changes` applies them in order until the plan fits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.memory import Architecture, MemoryPlan, RunSettings, ceil_fraction, plan_memory

MAX_ENGINE_SHARE = 0.95


@dataclass(frozen=True)
class Suggestion:
    """One config change, the plan it gives, and the memory it saves at the peak."""

    change: str
    """The config key and its new value, as a user would write it."""
    plan: MemoryPlan
    saving: float


Change = Callable[[Architecture, RunSettings, MemoryPlan], tuple[str, RunSettings] | None]


def _checkpointing(arch: Architecture, run: RunSettings, plan: MemoryPlan) -> tuple[str, RunSettings] | None:
    if run.gradient_checkpointing:
        return None
    return "model.init_args.gradient_checkpointing: true", replace(run, gradient_checkpointing=True)


def _sequence_parallel(
    arch: Architecture, run: RunSettings, plan: MemoryPlan
) -> tuple[str, RunSettings] | None:
    if run.kind != "grpo":
        return None  # SFT does not split sequences
    larger = [s for s in range(run.sequence_parallel_size + 1, run.world_size + 1) if run.world_size % s == 0]
    if not larger:
        return None
    size = larger[0]
    attention = run.sequence_parallel_attention
    heads = arch.text.num_heads
    change = f"trainer.strategy.init_args.sequence_parallel_size: {size}"
    if attention == "ulysses" and heads % size:
        attention = "ring"
        change += f" with sequence_parallel_attention: ring ({heads} heads do not divide by {size})"
    shared = run.shared_prompt_pass and size == 1
    return change, replace(
        run, sequence_parallel_size=size, sequence_parallel_attention=attention, shared_prompt_pass=shared
    )


def _micro_batch(arch: Architecture, run: RunSettings, plan: MemoryPlan) -> tuple[str, RunSettings] | None:
    if run.kind == "grpo":
        rows = plan.tokens.rows
        if rows <= 1:
            return None
        return f"model.init_args.micro_batch_rows: {rows // 2}", replace(run, micro_batch_rows=rows // 2)
    if run.batch_size <= 1:
        return None
    smaller = run.batch_size // 2
    return (
        f"data.init_args.batch_size: {smaller} (trainer.accumulate_grad_batches keeps the batch)",
        replace(run, batch_size=smaller),
    )


def _reference_on_host(
    arch: Architecture, run: RunSettings, plan: MemoryPlan
) -> tuple[str, RunSettings] | None:
    if run.reference != "sharded":
        return None
    return "model.init_args.reference_placement: cpu", replace(run, reference="cpu")


def _offload(arch: Architecture, run: RunSettings, plan: MemoryPlan) -> tuple[str, RunSettings] | None:
    if run.cpu_offload or run.sharding == "replicated":
        return None
    return "trainer.strategy.init_args.cpu_offload: true", replace(run, cpu_offload=True)


def _fewer_frames(arch: Architecture, run: RunSettings, plan: MemoryPlan) -> tuple[str, RunSettings] | None:
    if run.num_frames < 4:
        return None
    frames = run.num_frames // 2
    return f"data.init_args.num_frames: {frames}", replace(run, num_frames=frames)


def _engine_share(arch: Architecture, run: RunSettings, plan: MemoryPlan) -> tuple[str, RunSettings] | None:
    """A smaller vLLM share when it reserves more than its need (a larger one when it lacks)."""
    if plan.engine is None or run.engine is None:
        return None
    needed = ceil_fraction(plan.engine.utilization_needed / plan.device.memory)
    current = run.engine.gpu_memory_utilization
    # Lower a share larger than the need; raise one too small for its KV cache (within reason).
    useful = needed < current if plan.engine.fits else current < needed <= MAX_ENGINE_SHARE
    if not useful:
        return None
    engine = replace(run.engine, gpu_memory_utilization=needed)
    return f"engine init_args.gpu_memory_utilization: {needed:g}", replace(run, engine=engine)


CHANGES: tuple[Change, ...] = (
    _checkpointing,
    _sequence_parallel,
    _micro_batch,
    _reference_on_host,
    _offload,
    _fewer_frames,
    _engine_share,
)


def suggestions(plan: MemoryPlan) -> list[Suggestion]:
    """Each applicable change on its own, in :data:`CHANGES` order (the engine share first when
    the engine's KV cache does not fit its share)."""
    order = CHANGES if plan.engine_fits else (_engine_share, *CHANGES[:-1])
    out = []
    for change in order:
        proposed = change(plan.architecture, plan.settings, plan)
        if proposed is None:
            continue
        text, settings = proposed
        new = plan_memory(plan.architecture, settings, plan.device)
        out.append(Suggestion(text, new, plan.peak - new.peak))
    return out


def combined_changes(plan: MemoryPlan) -> list[Suggestion]:
    """The changes applied one after another, in order, until the plan fits (all of them if it
    never does); each entry's plan includes the ones before it."""
    applied: list[Suggestion] = []
    current = plan
    order = CHANGES if plan.engine_fits else (_engine_share, *CHANGES[:-1])
    for change in order:
        if current.fits:
            break
        proposed = change(current.architecture, current.settings, current)
        if proposed is None:
            continue
        text, settings = proposed
        new = plan_memory(current.architecture, settings, current.device)
        applied.append(Suggestion(text, new, current.peak - new.peak))
        current = new
    return applied
