"""The largest inputs a run's rollouts give its engine, from the data and the model, before either loads.

The token counts are the memory planner's (:func:`planner.memory.token_counts`), so what
``lvrl plan`` prints and what the engine is sized for agree: the video of ``data.num_frames``
at ``data.max_pixels_per_frame``, the prompt text bound ``data.max_prompt_tokens`` (none: only
the video and the turns count, a lower bound), every turn at the rollouts' ``max_new_tokens``
and, with tool use, every reply at its frame budget.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from core.tool_use.requests import FrameBudget
from families.published import UnknownArchitecture
from models.loading import model_directory
from planner.architectures import architecture_from_config
from planner.memory import RunSettings, token_counts
from rollout.engine_limits import RolloutShape

log = logging.getLogger(__name__)


def rollout_shape(
    data_settings: dict[str, Any], model_path: str, max_new_tokens: int, tool_budget: FrameBudget | None
) -> tuple[RolloutShape, int | None] | None:
    """The run's :class:`RolloutShape` and the model's ``max_position_embeddings``; None when the
    data settings or the model are not ones the planner reads (nothing is checked then)."""
    try:
        num_frames, max_pixels = int(data_settings["num_frames"]), int(data_settings["max_pixels_per_frame"])
    except (KeyError, TypeError, ValueError):
        return None
    config = json.loads((model_directory(model_path) / "config.json").read_text())
    try:
        arch = architecture_from_config(config, name=model_path)
    except UnknownArchitecture as unknown:
        log.info("engine limits not checked before start-up: %s", unknown)
        return None
    run = RunSettings(
        kind="grpo",
        world_size=1,
        devices_per_node=1,
        num_frames=num_frames,
        max_pixels_per_frame=max_pixels,
        text_tokens=int(data_settings.get("max_prompt_tokens") or 0),
        completion_tokens=max_new_tokens,
        tool_calls=tool_budget.max_calls if tool_budget is not None else 0,
        tool_frames=tool_budget.frames_per_episode if tool_budget is not None else 0,
    )
    tokens = token_counts(arch, run)
    text_config = config.get("text_config") or config
    positions = text_config.get("max_position_embeddings")
    shape = RolloutShape(video_tokens=max(tokens.video, tokens.served_video), row_tokens=tokens.row)
    return shape, int(positions) if positions else None
