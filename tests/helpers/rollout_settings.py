"""How the tests choose a rollout engine, in one place.

Every test that picks the engine (a ``RolloutCallback`` built in Python, or the callback's
``init_args`` in a config) goes through :func:`engine_init_args`, so a change of the callback's
engine arguments is made here and nowhere else.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from helpers.cli import REPO_ROOT
from helpers.tolerances import EPS32, FORWARD_ULPS

ROLLOUT_CLASS_PATH = "callbacks.rl_rollout.RolloutCallback"


ENGINE_CONFIGS: dict[str, dict[str, Any]] = {
    "vllm": {"class_path": "rollout.vllm_engine.VLLMEngine", "init_args": {}},
    "transformers": {"class_path": "rollout.hf_engine.TransformersEngine"},
}
"""The rollout engines by name, as a config's ``engine:`` entry (the demo config's vLLM settings)."""


def engine_config(engine: str) -> dict[str, Any]:
    """``engine`` ("vllm" or "transformers") as the callback's ``engine:`` entry in a config."""
    return dict(ENGINE_CONFIGS[engine])


def engine_init_args(engine: str) -> dict[str, Any]:
    """The ``RolloutCallback`` keyword arguments that select ``engine`` when built in Python."""
    from rollout.hf_engine import TransformersEngine
    from rollout.vllm_engine import VLLMEngine

    init_args = ENGINE_CONFIGS[engine].get("init_args", {})
    return {"engine": VLLMEngine(**init_args) if engine == "vllm" else TransformersEngine()}


def tiny_rollout_settings(source: str, engine: str = "vllm") -> dict:
    """A demo GRPO config with rollouts small enough for the tiny model: 4 completions of 8 tokens."""
    config = yaml.safe_load((REPO_ROOT / source).read_text())
    rollout = config["trainer"]["callbacks"][0]
    assert rollout["class_path"] == ROLLOUT_CLASS_PATH
    rollout["init_args"].update(
        engine=engine_config(engine), num_generations=4, max_new_tokens=8, log_samples_every_n_steps=1
    )
    return config


def engine_gap_bar(model_dir: Path) -> float:
    """The bar for ``rollout/logprob_diff_max``, the largest |trainer - engine| log-prob of a run.

    Trainer and engine compute the same float32 log-probs with other kernels, so they differ by
    rounding: FORWARD_ULPS of the log-probs' scale. The log only carries the gap, so the scale
    is stated: 2 ln V (13.9 for the tiny model's 1024 tokens), since log p = z - logsumexp(z)
    rounds with the log-sum-exp (~ln V for the near-uniform tiny model) and a sampled token's
    |log p| stays below 2 ln V. That is 4e-4, while stale weights after a sync or a wrong
    position give gaps >= 1e-2.
    """
    from transformers import AutoConfig

    vocab_size = AutoConfig.from_pretrained(model_dir).text_config.vocab_size
    return FORWARD_ULPS * EPS32 * 2 * math.log(vocab_size)
