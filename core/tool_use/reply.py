"""The frames tool's reply: a user turn holding the requested frames as a video segment.

After a turn that ends with a frame request (``</tool_call>``, a stop token of the engines), the
tool writes, in Qwen's tool-reply form::

    <|im_end|>
    <|im_start|>user
    <tool_response>
    frames 00:12.0-00:19.0, 8 frames, 1.00 s apart
    <|vision_start|><|video_pad|><|vision_end|>
    </tool_response><|im_end|>
    <|im_start|>assistant

(a rejected request gets ``no frames (reason): ...`` and no video). The model's own processor
tokenises it and expands the video, as the collator does for the prompt, with the frames' source
indices as metadata: Qwen3-VL's processor writes each frame's true time before it. The segment's
``second_per_grid`` is its frames' true interval times the temporal patch size, so its temporal
positions advance with real time (:mod:`core.tool_use.episode`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from core.tool_use.episode import ToolReply
from core.tool_use.requests import RESPONSE_CLOSE, RESPONSE_OPEN, FramePlan
from core.video import VideoEmbedding

VIDEO_PART = "<|vision_start|><|video_pad|><|vision_end|>"
REPLY_OPEN = f"<|im_end|>\n<|im_start|>user\n{RESPONSE_OPEN}\n"
REPLY_CLOSE = f"\n{RESPONSE_CLOSE}<|im_end|>\n<|im_start|>assistant\n"


class ReplyFamily(Protocol):
    """What the reply needs of the model's family (:class:`families.ModelFamily` has it)."""

    @property
    def temporal_patch_size(self) -> int: ...

    def engine_template_ids(self, tokenizer: Any, prompt_text: str) -> list[int] | None: ...

    def patch_timestamps(self, metadata: Mapping[str, Any]) -> list[float] | None: ...


def reply_text(message: str, with_video: bool) -> str:
    """The reply's text: ``message`` (what the tool says of the request), then the video."""
    return REPLY_OPEN + message + ("\n" + VIDEO_PART if with_video else "") + REPLY_CLOSE


@dataclass
class ReplyInputs:
    """A reply tokenised, with what its video needs to be encoded."""

    token_ids: list[int]
    video_slots: list[bool]
    template_ids: list[int] | None
    pixel_values_videos: torch.Tensor | None
    video_grid_thw: torch.Tensor | None
    """``(3,)``."""
    second_per_grid: float | None
    timestamps: list[float] | None

    def reply(self, embeds: torch.Tensor | None) -> ToolReply:
        """The :class:`ToolReply` once the video is encoded (``embeds``: its visual tokens)."""
        video = None
        if self.video_grid_thw is not None:
            if embeds is None or self.second_per_grid is None:
                raise ValueError("a reply with frames needs their encoding")
            video = VideoEmbedding(embeds, self.video_grid_thw, self.second_per_grid, self.timestamps)
        return ToolReply(self.token_ids, self.video_slots, video, self.template_ids, self.pixel_values_videos)


def segment_metadata(plan: FramePlan, frames: np.ndarray) -> dict[str, Any]:
    """The processor's ``video_metadata`` of served frames: their source indices and rate."""
    return {
        "fps": plan.source_fps,
        "frames_indices": list(plan.frame_indices),
        # The processor reads a rate from indices over the whole video; lvrl sets the segment's
        # second_per_grid itself (its true interval), so the total only needs to be consistent.
        "total_num_frames": plan.frame_indices[-1] + 1,
        "duration": (plan.frame_indices[-1] + 1) / plan.source_fps,
        "height": int(frames.shape[1]),
        "width": int(frames.shape[2]),
    }


def tokenize_reply(
    processor: Any,
    family: ReplyFamily,
    message: str,
    served: tuple[FramePlan, np.ndarray] | None = None,
) -> ReplyInputs:
    """The reply saying ``message``, holding ``served`` (the plan and its decoded frames) if given."""
    text = reply_text(message, served is not None)
    tokenizer = processor.tokenizer
    if served is None:
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return ReplyInputs(ids, [False] * len(ids), None, None, None, None, None)
    plan, frames = served
    if len(frames) != len(plan.frame_indices):
        raise ValueError(f"{len(frames)} frames for a plan of {len(plan.frame_indices)}")
    metadata = segment_metadata(plan, frames)
    encoded = processor(text=[text], videos=[frames], video_metadata=[metadata], return_tensors="pt")
    ids = encoded["input_ids"][0].tolist()
    video_token = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    return ReplyInputs(
        ids,
        [token == video_token for token in ids],
        family.engine_template_ids(tokenizer, text),
        encoded["pixel_values_videos"],
        encoded["video_grid_thw"][0],
        family.temporal_patch_size * plan.interval,
        family.patch_timestamps(metadata),
    )
