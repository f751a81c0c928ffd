"""Where tool-use rollouts read the frames a model asks for: each prompt's own video.

The datamodule keeps every sample's encoded video in its batch (``data.init_args.tool_use:
true``); a request's frames are decoded from it with the same pixel budget and
patch rounding as the prompt's overview frames, so a segment looks like the rest of the video.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from core.frame_requests import UNREADABLE_FRAMES, RequestRejected
from datamodules.video import VideoDecodeError, decode_frames
from rollout.episodes import EpisodeVideo


class NoVideoBytes(ValueError):
    """Tool-use rollouts were asked for but the batch does not carry its videos."""


def episode_videos(meta: Sequence[Mapping[str, Any]], *, max_pixels: int, factor: int) -> list[EpisodeVideo]:
    """One frame source per prompt of a batch (its collator ``meta``)."""
    sources = []
    for sample in meta:
        video = sample.get("video_bytes")
        if video is None:
            raise NoVideoBytes(
                "tool-use rollouts decode the frames a model asks for from the sample's video, but the "
                "batch does not carry it: set data.init_args.tool_use: true"
            )

        def read(indices: Sequence[int], video: bytes = video) -> np.ndarray:
            try:
                return decode_frames(video, indices, max_pixels, factor=factor).frames
            except VideoDecodeError as error:
                raise RequestRejected(UNREADABLE_FRAMES, f"the video cannot be read there: {error}") from None

        sources.append(
            EpisodeVideo(str(sample["key"]), float(sample["source_fps"]), int(sample["source_frames"]), read)
        )
    return sources
