"""A run config as the memory planner sees it, and the start-up check that refuses what cannot fit.

:func:`run_settings` reads the keys that decide memory from a ``lvrl fit`` config (a YAML
file's dict, or the dict LightningCLI parsed). A key the YAML leaves out takes its class's
default, listed in :data:`DEFAULTS` (a unit test keeps them equal to the classes' signatures).
:func:`memory_problem` is the check ``lvrl fit`` runs before anything is loaded on a CUDA
GPU: it returns the reason to refuse, with the plan's suggestions, or None.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from core.settings import settings_block
from core.tool_use.requests import FrameBudget
from families.published import UnknownArchitecture, published_names
from planner.advice import combined_changes, suggestions
from planner.architectures import architecture_from_config, published_architecture
from planner.memory import (
    GIB,
    Architecture,
    Device,
    EngineSettings,
    MemoryPlan,
    RunSettings,
    ValidationSettings,
    format_gib,
    plan_memory,
    token_counts,
)
from rollout.engine_limits import RolloutShape, batched_tokens_for

SEQUENCE_PARALLEL_STRATEGY = "parallel.strategy.SequenceParallelStrategy"
ROLLOUT_CALLBACK = "callbacks.rl_rollout.RolloutCallback"
VLLM_ENGINE = "rollout.vllm_engine.VLLMEngine"
TRANSFORMERS_ENGINE = "rollout.hf_engine.TransformersEngine"

UNBOUNDED_TEXT_TOKENS = 1024
"""Text tokens assumed for a prompt when ``data.max_prompt_tokens`` is null (no bound)."""
UNBOUNDED_TARGET_TOKENS = 4096
"""Target tokens assumed for SFT when ``data.max_target_tokens`` is null."""


class PlanInputError(ValueError):
    """The config (with the command-line overrides) does not say enough to plan."""


def _class_path(spec: Any) -> str:
    return spec.get("class_path", "") if isinstance(spec, dict) else str(spec or "")


def _init_args(spec: Any) -> dict[str, Any]:
    return dict(spec.get("init_args") or {}) if isinstance(spec, dict) else {}


class _Parsed(dict):  # type: ignore[type-arg]
    """Init arguments of a parsed config: a key missing means the config was not parsed."""

    def __init__(self, where: str, args: dict[str, Any]) -> None:
        super().__init__(args)
        self.where = where

    def __missing__(self, key: str) -> Any:
        raise PlanInputError(
            f"{self.where} has no {key!r}: plan a config as LightningCLI parses it "
            "(app.lightning_cli.parsed_fit_config), which fills in every class's defaults"
        )


def _engine_defaults() -> dict[str, Any]:
    """``VLLMEngine``'s own defaults: a rollout callback without ``engine`` builds one so."""
    import inspect

    from rollout.vllm_engine import VLLMEngine

    parameters = inspect.signature(VLLMEngine.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def _devices(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, list):
        return len(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None  # "auto", -1: only the machine knows


def run_settings(
    config: dict[str, Any],
    gpus: int | None = None,
    nodes: int | None = None,
    text_tokens: int | None = None,
) -> RunSettings:
    """The :class:`RunSettings` of a ``lvrl fit`` config; ``gpus`` (per node) and ``nodes``
    override ``trainer.devices`` and ``trainer.num_nodes``, ``text_tokens`` the prompt's text
    bound (``data.max_prompt_tokens``)."""
    trainer = _Parsed("trainer", config.get("trainer") or {})
    model, data = config.get("model") or {}, config.get("data") or {}
    devices = gpus if gpus is not None else _devices(trainer.get("devices"))
    if devices is None:
        raise PlanInputError(
            f"trainer.devices is {trainer.get('devices')!r}: pass --gpus N (GPUs per node) to plan"
        )
    num_nodes = nodes if nodes is not None else int(trainer.get("num_nodes") or 1)
    kind = "grpo" if _class_path(model).endswith("GRPOModule") else "sft"
    module = _Parsed("model.init_args", _init_args(model))
    data_args = _Parsed("data.init_args", _init_args(data))
    strategy = trainer.get("strategy")
    precision = str(trainer.get("precision") or "32-true")
    # "-true" precisions convert the module, master weights included; "-mixed" ones compute in half.
    half = "bfloat16" if precision.startswith("bf16") else "float16" if precision.startswith("16") else None
    master = half if half and precision.endswith("-true") else module["dtype"]
    if _class_path(strategy) == SEQUENCE_PARALLEL_STRATEGY:
        args = _Parsed("trainer.strategy.init_args", _init_args(strategy))
        layout = {
            "sequence_parallel_size": int(args["sequence_parallel_size"]),
            "sequence_parallel_attention": args["sequence_parallel_attention"],
            "sharding": args["sharding"],
            "param_dtype": master if master != "float32" else args["param_dtype"],
            "reduce_dtype": args["reduce_dtype"],
            "cpu_offload": bool(args["cpu_offload"]),
        }
    else:  # DDP or a single device: every rank holds everything
        compute = half or master
        layout = {"sharding": "replicated", "param_dtype": compute, "reduce_dtype": master}
    rollout = next((c for c in trainer.get("callbacks") or [] if _class_path(c) == ROLLOUT_CALLBACK), None)
    rollout_args = _Parsed("the rollout callback's init_args", _init_args(rollout))
    engine = _engine_settings(rollout_args["engine"]) if kind == "grpo" else None
    policy_generates = kind == "grpo" and _class_path(rollout_args["engine"]) == TRANSFORMERS_ENGINE
    max_prompt = data_args["max_prompt_tokens"]
    text = text_tokens if text_tokens is not None else (max_prompt or UNBOUNDED_TEXT_TOKENS)
    if kind == "grpo":
        completion = int(rollout_args["max_new_tokens"])
    else:
        completion = int(data_args["max_target_tokens"] or UNBOUNDED_TARGET_TOKENS)
    size = layout.get("sequence_parallel_size", 1)
    # Frames on request: planned at the episode's budgets (every request made and served).
    tools = settings_block(FrameBudget, rollout_args["tool_use"], "tool_use") if kind == "grpo" else None
    tool_frames = (
        0 if tools is None else min(tools.frames_per_episode, tools.max_calls * tools.frames_per_call)
    )
    # LoRA (models.lora): the adapters train, the base (and the tower, unless adapted) is frozen,
    # and the reference is the policy with its adapters disabled.
    from models.lora import LoraSettings  # (torch: imported only when a plan is made)

    lora = LoraSettings.of(module["lora"])
    freeze_vision = bool(module["freeze_vision"]) or (lora is not None and not lora.vision)
    reference = "none"
    if kind == "grpo" and float(module["kl_coef"]) > 0 and lora is None:
        reference = "cpu" if module["reference_placement"] == "cpu" else "sharded"
    return RunSettings(
        kind=kind,
        world_size=devices * num_nodes,
        devices_per_node=devices,
        num_frames=int(data_args["num_frames"]),
        max_pixels_per_frame=int(data_args["max_pixels_per_frame"]),
        text_tokens=int(text),
        completion_tokens=completion,
        master_dtype=master,
        freeze_vision=freeze_vision,
        lora_rank=None if lora is None else lora.r,
        lora_targets=() if lora is None else lora.target_modules,
        gradient_checkpointing=bool(module["gradient_checkpointing"]),
        reference=reference,
        micro_batch_rows=module["micro_batch_rows"] if kind == "grpo" else None,
        batch_size=int(data_args["batch_size"]),
        num_generations=int(rollout_args["num_generations"]) if kind == "grpo" else 1,
        # Sequence-parallel ranks pack each prompt with its completions into one row
        # (parallel.packing); planned here as whole rows, an upper bound (the one-rank shared
        # pass model does not split tokens over ranks).
        shared_prompt_pass=kind == "grpo"
        and bool(module["share_prompt_prefix"])
        and size == 1
        and not bool(module["gradient_checkpointing"]),
        # The sharded strategy keeps a frozen tower in the compute dtype (models.vlm_module.shard).
        frozen_vision_dtype=layout["param_dtype"] if "sequence_parallel_size" in layout else None,
        engine=engine,
        policy_generates=policy_generates,
        tool_calls=0 if tools is None else tools.max_calls,
        tool_frames=tool_frames,
        validation=_validation_settings(trainer, module, data_args),
        vision_patches_per_pass=module["vision_patches_per_pass"],
        **layout,
    )


def _validation_settings(
    trainer: dict[str, Any], module: dict[str, Any], data: dict[str, Any]
) -> ValidationSettings | None:
    """The validation a fit makes between its steps; None without validation shards or batches."""
    limit = trainer["limit_val_batches"]
    if not data["val_shards"] or limit in (0, 0.0):
        return None
    frames = data["val_num_frames"] or [data["num_frames"]]
    return ValidationSettings(
        batch_size=int(data["val_batch_size"] or data["batch_size"]),
        num_frames=int(max(frames)),
        samples=int(module["val_samples"]),
        max_new_tokens=int(module["max_new_tokens"]),
        target_tokens=int(data["max_target_tokens"] or UNBOUNDED_TARGET_TOKENS),
        sanity_check=trainer["num_sanity_val_steps"] != 0,
    )


def _engine_settings(spec: Any) -> EngineSettings | None:
    """The vLLM engine's settings; None for an engine that holds no GPU memory of its own
    (the transformers engine generates with the policy itself)."""
    if spec is not None and _class_path(spec) != VLLM_ENGINE:
        return None
    args = _Parsed("the engine's init_args", _init_args(spec) if spec is not None else _engine_defaults())
    return EngineSettings(
        dtype=args["dtype"],
        gpu_memory_utilization=float(args["gpu_memory_utilization"]),
        max_model_len=int(args["max_model_len"]) if args["max_model_len"] is not None else None,
        max_num_seqs=int(args["max_num_seqs"]),
        sleep_mode=bool(args["enable_sleep_mode"]),
        batched_tokens=int(args["max_num_batched_tokens"]) if args["max_num_batched_tokens"] else None,
    )


def with_engine_limits(arch: Architecture, run: RunSettings) -> RunSettings:
    """``run`` with its engine's ``max_model_len`` and ``max_num_batched_tokens`` as the engine
    derives them from the run's shape (:mod:`rollout.engine_limits`), where the config leaves
    them to it."""
    if run.engine is None:
        return run
    tokens = token_counts(arch, run)
    shape = RolloutShape(video_tokens=max(tokens.video, tokens.served_video), row_tokens=tokens.row)
    engine = replace(
        run.engine,
        max_model_len=run.engine.max_model_len or shape.row_tokens,
        batched_tokens=batched_tokens_for(shape, run.engine.batched_tokens),
    )
    return replace(run, engine=engine)


def model_config_file(config: dict[str, Any]) -> Path | None:
    """The ``config.json`` of the config's ``model_path``, if it is on this machine."""
    path = _init_args(config.get("model")).get("model_path")
    if not path:
        return None
    file = Path(str(path)).expanduser() / "config.json"
    return file if file.is_file() else None


def architecture_for(config: dict[str, Any], name: str | None = None) -> Architecture:
    """The model's sizes: from ``name`` (a built-in published config) when given, else from the
    ``model_path``'s ``config.json``; an error that lists the built-in names when neither exists."""
    if name:
        return published_architecture(name)
    file = model_config_file(config)
    if file is None:
        path = _init_args(config.get("model")).get("model_path")
        raise UnknownArchitecture(
            f"model.init_args.model_path {path!r} has no config.json here: pass --architecture NAME "
            f"(built-in: {', '.join(published_names())})"
        )
    return architecture_from_config(json.loads(file.read_text()), str(file.parent))


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gib|gb|g|mib|mb|m|b)?\s*$", re.IGNORECASE)


def parse_memory(text: str) -> int:
    """Bytes of a memory size such as ``80GB``, ``79.2GiB``, ``81920MiB`` or ``1073741824``.

    GPU memory is sold in binary units (an "80 GB" card has 80 GiB of memory), so GB and GiB
    both mean 2**30 bytes here, MB and MiB 2**20.

    >>> parse_memory("80GB") == 80 * 2**30
    True
    >>> parse_memory("512 MiB")
    536870912
    """
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"cannot read a memory size from {text!r} (e.g. 80GB, 79.2GiB, 81920MiB)")
    unit = (match.group(2) or "b").lower()
    scale = {"gib": GIB, "gb": GIB, "g": GIB, "mib": 2**20, "mb": 2**20, "m": 2**20, "b": 1}[unit]
    return int(float(match.group(1)) * scale)


def cuda_memory() -> tuple[int, str, int] | None:
    """``(total bytes, name, GPUs visible)`` of the GPU this process will use, None without CUDA.

    Every rank runs the start-up check before Lightning assigns it a device, so it asks about
    its own GPU (``LOCAL_RANK``) and, where NVML is installed (``nvidia-ml-py``, which vLLM
    brings), through NVML, which creates no CUDA context: a context opened on GPU 0 by each of 8
    ranks would cost GPU 0 several GiB for the whole run.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    index = int(os.environ.get("LOCAL_RANK", "0")) % max(count, 1)
    found = _nvml_memory(index, count)
    if found is None:
        properties = torch.cuda.get_device_properties(index)
        found = int(properties.total_memory), str(properties.name)
    memory, name = found
    return memory, f"cuda:{index} ({name})", count


def _nvml_memory(index: int, count: int) -> tuple[int, str] | None:
    """Total memory and name of visible GPU ``index`` through NVML; None where NVML cannot say
    (not installed, no driver, GPUs named by UUID in ``CUDA_VISIBLE_DEVICES``)."""
    try:
        import pynvml
    except ImportError:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = (
        list(range(count)) if visible is None else [int(d) for d in visible.split(",") if d.strip().isdigit()]
    )
    if index >= len(physical):
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(physical[index])
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), str(pynvml.nvmlDeviceGetName(handle))
    except pynvml.NVMLError:
        return None


def check_enabled(config: dict[str, Any]) -> bool:
    """Whether the start-up check applies: the sequence-parallel strategy with ``check_memory_plan``."""
    strategy = (config.get("trainer") or {}).get("strategy")
    if _class_path(strategy) != SEQUENCE_PARALLEL_STRATEGY:
        return False
    return bool(_Parsed("trainer.strategy.init_args", _init_args(strategy))["check_memory_plan"])


def refusal(plan: MemoryPlan, device_name: str) -> str:
    """Why a config is refused, and what would make it fit (the plan's suggestions)."""
    reasons = []
    if plan.headroom < 0:
        reasons.append(
            f"the peak per GPU ({plan.peak_phase} phase) is {format_gib(plan.peak)} of "
            f"{format_gib(plan.device.memory)} on {device_name}"
        )
    if plan.engine is not None and not plan.engine.fits:
        reasons.append(
            f"vLLM's KV cache needs {format_gib(plan.engine.kv_needed)} and only "
            f"{format_gib(plan.engine.kv_available)} of its gpu_memory_utilization share is left for it"
        )
    lines = [f"the memory plan says this run cannot fit: {'; '.join(reasons)}."]
    ideas = suggestions(plan)
    if ideas:
        lines.append("Each change alone (memory saved at the peak):")
        lines += [
            f"    {s.change}: "
            + (f"saves {format_gib(s.saving)}" if s.saving >= 0 else f"costs {format_gib(-s.saving)}")
            for s in ideas
        ]
    combined = combined_changes(plan)
    if combined and combined[-1].plan.fits:
        steps = " + ".join(s.change.split(" (")[0] for s in combined)
        lines.append(f"Applied in that order, these fit: {steps}.")
    lines.append(
        "`lvrl plan --config FILE` prints the table; to start anyway set "
        "trainer.strategy.init_args.check_memory_plan: false"
    )
    return "\n    ".join(lines)


def memory_problem(
    config: dict[str, Any],
    model_config: dict[str, Any],
    device_memory: int,
    device_name: str = "cuda:0",
    gpus: int | None = None,
) -> str | None:
    """The reason to refuse ``config`` on CUDA GPUs of ``device_memory`` bytes, or None when it
    fits (or the check is off). ``model_config`` is the model directory's ``config.json``;
    ``gpus`` stands in for ``trainer.devices`` when that is ``auto``."""
    if not check_enabled(config):
        return None
    try:
        settings = run_settings(config, gpus=gpus)
        arch = architecture_from_config(model_config)
    except (PlanInputError, UnknownArchitecture, KeyError):
        return None  # a model family the planner does not know: nothing to check against
    plan = plan_memory(arch, with_engine_limits(arch, settings), Device("cuda", device_memory))
    return None if plan.fits else refusal(plan, device_name)
