"""Start-up checks of a parsed ``lvrl fit|validate`` config: every impossible setting is reported at
once, before a logger, a model or an engine is created, with what to change.

Checked: the model directory (an HF directory with ``config.json``), the shard specs the
command will read, the sequence-parallel layout (size vs ``devices x num_nodes``, attention
heads vs Ulysses, read from the model's ``config.json``), the RL rollout settings (group size,
reward names, their arguments), a GRPO module without a rollout callback (or the reverse), and,
on a CUDA GPU with the sequence-parallel strategy's ``check_memory_plan`` on, whether the memory
plan (:mod:`planner.run_config`) fits the device.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from datamodules.shards import resolve_shards
from models.loading import model_directory
from parallel.mesh import check_attention_heads, mesh_shape
from planner.run_config import cuda_memory, memory_problem
from rewards.combine import RewardSpec
from rewards.registry import SAMPLE_FIELDS, available_rewards, get_reward
from rollout.experience import settings_problem

ROLLOUT_CALLBACK = "callbacks.rl_rollout.RolloutCallback"
SEQUENCE_PARALLEL_STRATEGY = "parallel.strategy.SequenceParallelStrategy"
SFT_CONFIG = "configs/demo/sft.yaml"
SFT_EXPORT = "runs/demo/sft/hf"


class ConfigError(ValueError):
    """The config cannot work; the message lists every problem found."""


def _class_path(spec: Any) -> str:
    return spec.get("class_path", "") if isinstance(spec, dict) else type(spec).__name__


def _init_args(spec: Any) -> dict[str, Any]:
    return dict(spec.get("init_args") or {}) if isinstance(spec, dict) else {}


def _world_size(trainer: dict[str, Any]) -> int | None:
    devices, nodes = trainer.get("devices"), trainer.get("num_nodes") or 1
    if isinstance(devices, int):
        return devices * nodes
    if isinstance(devices, list):
        return len(devices) * nodes
    if isinstance(devices, str) and devices.isdigit():
        return int(devices) * nodes
    return None  # "auto", -1: known only once the accelerator is


def _is_rl(trainer: dict[str, Any], model: dict[str, Any]) -> bool:
    callbacks = trainer.get("callbacks") or []
    return _class_path(model).endswith("GRPOModule") or any(
        _class_path(c) == ROLLOUT_CALLBACK for c in callbacks
    )


def _check_model(model: dict[str, Any], problems: list[str], rl: bool = False) -> dict[str, Any] | None:
    args = _init_args(model)
    path = args.get("model_path")
    if not path:
        problems.append("model.init_args.model_path is not set")
        return None
    directory = Path(path).expanduser()
    if rl and not (directory / "config.json").is_file():
        # RL starts from a trained policy: a freshly built random model is not what is missing.
        state = "does not exist" if not directory.exists() else "has no config.json"
        problems.append(
            f"model.init_args.model_path: {directory} {state}; GRPO starts from a CoT-SFT export "
            f"(the `hf/` folder of an SFT run): run `lvrl fit --config {SFT_CONFIG}` and set "
            f"model_path to its export ({SFT_EXPORT}), or to your own SFT model's HF directory"
        )
        return None
    try:
        directory = model_directory(path)
    except (OSError, ValueError) as error:
        problems.append(f"model.init_args.model_path: {error}")
        return None
    config_file = Path(directory) / "config.json"
    if not config_file.is_file():
        problems.append(
            f"model.init_args.model_path: {directory} has no config.json (not an HF model directory)"
        )
        return None
    return json.loads(config_file.read_text())


def _check_shards(data: dict[str, Any], subcommand: str, problems: list[str]) -> None:
    args = _init_args(data)
    needed = {"fit": ["train_shards"], "validate": ["val_shards"], "test": ["test_shards"]}.get(
        subcommand, []
    )
    if subcommand == "fit" and args.get("val_shards"):
        needed.append("val_shards")
    for name in needed:
        spec = args.get(name)
        if not spec:
            problems.append(f"data.init_args.{name} is not set (lvrl {subcommand} reads it)")
            continue
        try:
            resolve_shards(spec)
        except (FileNotFoundError, ValueError) as error:
            problems.append(f"data.init_args.{name}: {error}")


def _check_parallel(
    trainer: dict[str, Any], model_config: dict[str, Any] | None, problems: list[str]
) -> None:
    strategy = trainer.get("strategy")
    if _class_path(strategy) != SEQUENCE_PARALLEL_STRATEGY:
        return
    args = _init_args(strategy)
    size = int(args.get("sequence_parallel_size", 2))
    world = _world_size(trainer)
    if world is not None:
        try:
            mesh_shape(world, size)
        except ValueError as error:
            problems.append(f"trainer.strategy: {error}")
    text = (model_config or {}).get("text_config", model_config) or {}
    heads = text.get("num_attention_heads")
    if heads:
        try:
            check_attention_heads(
                heads,
                text.get("num_key_value_heads") or heads,
                size,
                args.get("sequence_parallel_attention", "ulysses"),
            )
        except ValueError as error:
            problems.append(f"trainer.strategy: {error}")


def _check_rewards(specs: list[Any], problems: list[str]) -> None:
    known = available_rewards()
    for raw in specs:
        spec = raw if isinstance(raw, RewardSpec) else RewardSpec(**raw) if isinstance(raw, dict) else None
        if spec is None:
            problems.append(f"rewards: {raw!r} is not {{name, weight, kwargs}}")
            continue
        if spec.name not in known:
            problems.append(
                f"rewards: {spec.name!r} is not a registered reward; available: {', '.join(known)}"
            )
            continue
        fn = get_reward(spec.name)
        parameters = inspect.signature(fn).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        named = {n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
        unknown = [k for k in spec.kwargs if k not in named] if not takes_any else []
        required = [
            n
            for n, p in parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
        ]
        # Keyword-only arguments without default that are not sample fields must come from kwargs.
        missing = [n for n in required if n not in SAMPLE_FIELDS and n not in spec.kwargs]
        if unknown or missing:
            what = [f"unknown kwargs {unknown}"] if unknown else []
            what += [f"missing kwargs {missing}"] if missing else []
            problems.append(f"rewards: {spec.name!r}: {'; '.join(what)}")
            continue
        validate = getattr(fn, "validate_kwargs", None)
        if validate is not None:
            try:
                validate(spec.kwargs)
            except (TypeError, ValueError) as error:
                problems.append(f"rewards: {spec.name!r}: {error}")


def _check_rl(trainer: dict[str, Any], model: dict[str, Any], problems: list[str]) -> None:
    callbacks = trainer.get("callbacks") or []
    rollouts = [c for c in callbacks if _class_path(c) == ROLLOUT_CALLBACK]
    is_grpo = _class_path(model).endswith("GRPOModule")
    if is_grpo and not rollouts:
        problems.append(
            f"model {_class_path(model)} trains on rollouts: add {ROLLOUT_CALLBACK} to trainer.callbacks"
        )
    if rollouts and not is_grpo:
        problems.append(f"{ROLLOUT_CALLBACK} drives a GRPOModule; model is {_class_path(model)}")
    for rollout in rollouts:
        args = _init_args(rollout)
        problem = settings_problem(str(args.get("advantage", "grpo")), int(args.get("num_generations", 8)))
        if problem:
            problems.append(f"RolloutCallback: {problem}")
        _check_rewards(list(args.get("rewards") or []), problems)


def cuda_device(trainer: dict[str, Any]) -> tuple[int, str, int] | None:
    """``(memory in bytes, name, GPUs visible)`` of this process's CUDA GPU when the run will
    use CUDA GPUs, None otherwise (see :func:`planner.run_config.cuda_memory`)."""
    if str(trainer.get("accelerator") or "auto") not in ("gpu", "cuda", "auto"):
        return None
    strategy = trainer.get("strategy")
    if isinstance(strategy, dict) and _init_args(strategy).get("start_method") == "fork":
        return None  # initialising CUDA before a fork would break the forked ranks
    return cuda_memory()


def _check_memory(
    config: dict[str, Any], model_config: dict[str, Any], problems: list[str], device_memory: int | None
) -> None:
    trainer = config.get("trainer") or {}
    if device_memory is not None:
        memory, name, visible = device_memory, "the device", None
    else:
        device = cuda_device(trainer)
        if device is None:
            return
        memory, name, visible = device
    gpus = visible if _world_size(trainer) is None else None  # devices: auto -> the visible GPUs
    problem = memory_problem(config, model_config, memory, name, gpus=gpus)
    if problem:
        problems.append(problem)


def validate_config(subcommand: str, config: dict[str, Any], device_memory: int | None = None) -> None:
    """Raise :class:`ConfigError` listing every problem of ``config`` for ``lvrl <subcommand>``.

    ``device_memory`` (bytes of one GPU) stands in for the CUDA device's memory in the memory
    check (tests; None reads the device, and skips the check where there is no CUDA GPU).
    """
    problems: list[str] = []
    trainer = config.get("trainer") or {}
    model = config.get("model") or {}
    model_config = _check_model(model, problems, rl=subcommand == "fit" and _is_rl(trainer, model))
    _check_shards(config.get("data") or {}, subcommand, problems)
    _check_parallel(trainer, model_config, problems)
    if subcommand == "fit":
        _check_rl(trainer, model, problems)
        # Planned only once everything else holds: a broken value would make the plan meaningless.
        if model_config is not None and not problems:
            _check_memory(config, model_config, problems, device_memory)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(
            f"the config cannot work ({len(problems)} problem{'s' * (len(problems) > 1)}):\n{listed}"
        )
