"""CoT-SFT targets that demonstrate frame requests: the tool traces of the zoom task's rows.

A row may carry ``extra["tool_trace"]`` (:mod:`datatools.zoom_task` writes one): ``turns`` that
each reason and end with a request for a span, the ``final_reasoning`` of the last turn about what
the replies show, and its ``answer`` (the row's when absent). The target taught is the whole
episode, as a rollout would play it: each turn (ending with its request), the tool's reply with
the requested frames decoded from the sample's video (tokenised and placed exactly as
:mod:`rollout.episodes` does, so SFT and RL see the same layout; read, not trained), then the last
turn with the answer. A first turn given with the question (every trace's, with
:attr:`ToolTraces.given_first_turn`, or a trace marked ``first_turn_given``) is in the target but
not trained.

A trace the tool could not serve (its request is rejected, or the video cannot be read there)
is not taught: the row falls back to its direct target (reasoning and answer), with a warning
naming the sample and the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from core.tool_use.reply import tokenize_reply
from core.tool_use.requests import (
    MALFORMED,
    UNREADABLE_FRAMES,
    EpisodeFrames,
    FrameBudget,
    RequestRejected,
    request_body,
    served_text,
)
from datamodules.stream import VideoQASample
from datamodules.video import VideoDecodeError, decode_frames
from families import ModelFamily

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolTraces:
    """How traces are served: the frames at the data's pixel budget, within the tool's budget."""

    max_pixels: int
    factor: int
    budget: FrameBudget = field(default_factory=FrameBudget)
    given_first_turn: bool = False
    """Every trace's first turn (its first request) is given with the question, not the model's:
    in the target but not trained, and written for the model in episodes (``meta["given_turn"]``).
    A trace marked ``first_turn_given`` has its first turn untrained whatever this says; episodes
    give a turn only when this is set (a row's mark is a teaching device of CoT-SFT, so an RL or
    validation episode of that row still starts from the question alone)."""


def marked_first_turn_given(trace: object) -> bool:
    """Whether a row's tool trace marks its first turn ``first_turn_given`` (CoT-SFT's teaching
    device: the request is context written for the model, in the target but not trained)."""
    return isinstance(trace, dict) and trace.get("first_turn_given") is True


def given_turn(sample: VideoQASample, settings: ToolTraces | None) -> str | None:
    """The turn given with ``sample``'s question (its trace's first), when the settings give one."""
    if settings is None or not settings.given_first_turn:
        return None
    trace = sample.row.extra.get("tool_trace")
    turns = trace_turns(trace) if isinstance(trace, dict) else []
    return turns[0] if turns else None


class StoredVideo:
    """A sample's encoded video, kept for the frames tool (a :class:`~core.tool_use.requests.FrameSource`):
    requested frames are decoded at the data's pixel budget and patch rounding, so a segment
    looks like the rest of the video.

    The bytes are held in a uint8 tensor: from a dataloader worker a tensor travels through
    shared memory, while plain bytes would be pickled into the worker's result pipe (slow for a
    long video, and a worker whose parent was killed then never exits: its queue's feeder thread
    blocks on the full pipe). A plain class, not a dataclass, so that Lightning's batch transfer
    passes it through as it is.
    """

    def __init__(
        self, key: str, data: bytes, source_fps: float, num_frames: int, max_pixels: int, factor: int
    ) -> None:
        self.key = key
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.source_fps = source_fps
        self.num_frames = num_frames
        self.max_pixels = max_pixels
        self.factor = factor

    def __repr__(self) -> str:
        size = f"{self.data.numel()} bytes, {self.num_frames} frames at {self.source_fps:g} fps"
        return f"StoredVideo({self.key!r}, {size})"

    def read(self, frame_indices: Sequence[int]) -> np.ndarray:
        try:
            return decode_frames(
                self.data.numpy().tobytes(), frame_indices, self.max_pixels, factor=self.factor
            ).frames
        except VideoDecodeError as error:
            raise RequestRejected(UNREADABLE_FRAMES, f"the video cannot be read there: {error}") from None


def stored_video(sample: VideoQASample, settings: ToolTraces) -> StoredVideo | None:
    """The sample's frame source (None when its stream did not keep the video)."""
    if sample.video_bytes is None:
        return None
    video = sample.video
    return StoredVideo(
        sample.key,
        sample.video_bytes,
        video.fps,
        video.total_num_frames,
        settings.max_pixels,
        settings.factor,
    )


@dataclass
class TraceTarget:
    """What follows the prompt in a trace's teacher-forcing row."""

    token_ids: list[int]
    trained: list[bool]
    """False at the tool's replies (labels ignore them)."""
    video_slots: list[bool]
    pixel_values_videos: torch.Tensor
    """The replies' segments, in order."""
    video_grid_thw: torch.Tensor
    """``(segments, 3)``."""
    seconds_per_grid: list[float]
    """Per segment."""


def trace_turns(trace: dict[str, Any]) -> list[str]:
    """A trace's turns, each ending with a request (``turns``; a trace written before several
    requests were taught has one ``first_turn``)."""
    turns = trace.get("turns", [trace["first_turn"]] if "first_turn" in trace else [])
    return [str(turn) for turn in turns] if isinstance(turns, list) else []


def trace_target(
    processor: Any, family: ModelFamily, sample: VideoQASample, settings: ToolTraces, end_of_turn: str
) -> TraceTarget | None:
    """The trace's target for ``sample``, or None when it has no trace or the tool cannot serve it.

    Each turn's request is served as a rollout serves it (:class:`~core.tool_use.requests.EpisodeFrames`:
    the calls and frames counted against ``settings.budget``), so a trace the budget would refuse
    is not taught.
    """
    trace = sample.row.extra.get("tool_trace")
    if not isinstance(trace, dict):
        return None  # before the video's bytes are copied for the tool
    source = stored_video(sample, settings)
    if source is None:
        return None
    tokenizer = processor.tokenizer
    state = EpisodeFrames(settings.budget)
    token_ids: list[int] = []
    trained: list[bool] = []
    slots: list[bool] = []
    pixels, grids, seconds = [], [], []
    try:
        turns = trace_turns(trace)
        if not turns:
            raise RequestRejected(MALFORMED, "the trace has no turns")
        for index, turn in enumerate(turns):
            body = request_body(turn)
            if body is None:
                raise RequestRejected(MALFORMED, "a turn of the trace does not end with a request")
            plan = state.serve(body, source_fps=source.source_fps, num_frames=source.num_frames)
            frames = source.read(plan.frame_indices)
            reply = tokenize_reply(processor, family, served_text(plan), (plan, frames))
            assert reply.pixel_values_videos is not None and reply.video_grid_thw is not None
            assert reply.second_per_grid is not None
            asked = list(tokenizer(turn, add_special_tokens=False)["input_ids"])
            token_ids += asked + reply.token_ids
            learned = not (index == 0 and (settings.given_first_turn or marked_first_turn_given(trace)))
            trained += [learned] * len(asked) + [False] * len(reply.token_ids)
            slots += [False] * len(asked) + reply.video_slots
            pixels.append(reply.pixel_values_videos)
            grids.append(reply.video_grid_thw.reshape(1, 3))
            seconds.append(reply.second_per_grid)
    except RequestRejected as error:
        log.warning(
            "sample %r: its tool trace cannot be served (%s); its direct target is taught", sample.key, error
        )
        return None
    reasoning = str(trace.get("final_reasoning", "")).strip()
    answer = str(trace.get("answer", sample.row.answer))
    last_text = f"<think>{reasoning}</think>\n<answer>{answer}</answer>"
    last = list(tokenizer(last_text + end_of_turn, add_special_tokens=False)["input_ids"])
    return TraceTarget(
        token_ids + last,
        trained + [True] * len(last),
        slots + [False] * len(last),
        torch.cat(pixels),
        torch.cat(grids),
        seconds,
    )
