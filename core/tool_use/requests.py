"""Frames on request: the syntax of the model's request, its checks, and which frames it gets.

In a tool-use episode the assistant may stop its turn with a request for the frames of a time
span, written the way Qwen's chat templates write a tool call (Hermes style, one JSON object
between tool-call tags)::

    <tool_call>
    {"name": "get_frames", "arguments": {"start": "01:05", "end": 80, "fps": 2}}
    </tool_call>

``start`` and ``end`` are seconds from the start of the video, as a number or as ``mm:ss`` /
``h:mm:ss`` (the way the synthetic task and the prompts write times); ``fps`` is optional
(:attr:`FrameBudget.default_fps`). The reply is a tool turn holding the frames as a video
segment, which the engines and the trainer place with the frames' true times
(:func:`plan_frames` decides which source frames those are).

A request the tool cannot serve is not an error of the run: :func:`parse_request` and
:func:`plan_frames` raise :class:`RequestRejected` with a reason code (``REJECT_REASONS``),
which the episode counts and answers in text, so the model learns from the reply what was
wrong. Nothing is guessed: a span that reaches past the video is cut to the video and the
reply says so; a span with no frames in the video is rejected.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

TOOL_NAME = "get_frames"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"
TOOL_TAGS: tuple[str, ...] = (CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE)
"""One token each in Qwen2.5/Qwen3's tokenizers (and in lvrl's tiny one): the call's end is a
stop token of the engines, so generation halts exactly there."""

# Reason codes of requests that get no frames, in the order a request is checked.
MALFORMED = "malformed"
"""Not one JSON object ``{"name", "arguments"}`` between the tags."""
UNKNOWN_TOOL = "unknown_tool"
BAD_ARGUMENTS = "bad_arguments"
"""Missing, unknown or non-finite arguments, or a time that is not seconds or ``mm:ss``."""
EMPTY_SPAN = "empty_span"
"""``end`` not after ``start``."""
OUTSIDE_VIDEO = "outside_video"
"""No frame of the video lies in the span."""
TOO_MANY_CALLS = "too_many_calls"
NO_FRAMES_LEFT = "no_frames_left"
"""The episode's frame budget is spent."""
UNREADABLE_FRAMES = "unreadable_frames"
"""The video could not be decoded at the requested frames (a damaged file: the frames it
promised are not there)."""
REJECT_REASONS: tuple[str, ...] = (
    MALFORMED,
    UNKNOWN_TOOL,
    BAD_ARGUMENTS,
    EMPTY_SPAN,
    OUTSIDE_VIDEO,
    TOO_MANY_CALLS,
    NO_FRAMES_LEFT,
    UNREADABLE_FRAMES,
)

MAX_REQUEST_CHARS = 2_000
"""A request is a few dozen characters; anything far longer is not one."""
_TIME = re.compile(r"(?:(\d{1,3}):)?(\d{1,2}):(\d{2}(?:\.\d+)?)")
_ARGUMENTS = frozenset({"start", "end", "fps"})


class FrameSource(Protocol):
    """One prompt's source video, as the tool reads it (the datamodule provides one per sample
    with ``tool_use``: :class:`datamodules.tool_traces.StoredVideo`)."""

    key: str
    """Names the video (the sample key): with the frames' indices, the key of a served segment."""
    source_fps: float
    num_frames: int

    def read(self, frame_indices: Sequence[int]) -> np.ndarray:
        """The given source frames (ascending) as ``(n, h, w, 3)`` uint8, sized for the model;
        raises :class:`RequestRejected` (``unreadable_frames``) when the video cannot give them."""
        ...


class RequestRejected(ValueError):
    """A request that gets no frames; ``reason`` is one of ``REJECT_REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class FrameBudget:
    """What one episode may ask for.

    Args:
        max_calls: requests per episode (the model's turns are at most ``max_calls + 1``).
        frames_per_call: most frames one request returns; a denser request is thinned to this
            many, evenly over its span (the reply states the rate it got).
        frames_per_episode: most frames all requests of an episode return together.
        default_fps: rate of a request that names none.
    """

    max_calls: int = 3
    frames_per_call: int = 16
    frames_per_episode: int = 32
    default_fps: float = 1.0

    def __post_init__(self) -> None:
        if self.max_calls < 0 or self.frames_per_call < 1 or self.frames_per_episode < 1:
            raise ValueError("max_calls must be >= 0, frames_per_call and frames_per_episode >= 1")
        if not math.isfinite(self.default_fps) or self.default_fps <= 0:
            raise ValueError(f"default_fps must be a positive number, got {self.default_fps}")


@dataclass(frozen=True)
class FramesRequest:
    """A well-formed request: seconds ``start < end``, a positive rate."""

    start: float
    end: float
    fps: float


@dataclass(frozen=True)
class FramePlan:
    """The source frames a request gets: evenly spaced, so their times are exact."""

    frame_indices: tuple[int, ...]
    """Indices into the source video's frames, ascending."""
    source_fps: float

    @property
    def timestamps(self) -> tuple[float, ...]:
        """The true time of each frame, in seconds."""
        return tuple(i / self.source_fps for i in self.frame_indices)

    @property
    def span(self) -> tuple[float, float]:
        """The stretch the frames sample, in seconds: from the first frame's time to one interval
        past the last, so 16 frames at 1 fps from 32 s cover 32-48 s.

        >>> FramePlan((32, 40, 48), source_fps=8.0).span
        (4.0, 7.0)
        """
        return (self.timestamps[0], self.timestamps[-1] + self.interval)

    @property
    def interval(self) -> float:
        """Seconds between consecutive frames (one frame: one source frame)."""
        if len(self.frame_indices) < 2:
            return 1.0 / self.source_fps
        return (self.frame_indices[1] - self.frame_indices[0]) / self.source_fps


def parse_time(value: Any) -> float:
    """Seconds from a number or a ``mm:ss`` / ``h:mm:ss`` string (fractions allowed).

    >>> parse_time(12), parse_time("01:05"), parse_time("1:00:02.5")
    (12.0, 65.0, 3602.5)
    """
    if isinstance(value, bool):  # JSON true is not a time
        raise RequestRejected(BAD_ARGUMENTS, f"a time must be seconds or mm:ss, not {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _TIME.fullmatch(value.strip())):
        hours, minutes, secs = match.groups()
        if float(secs) >= 60 or (hours is not None and int(minutes) >= 60):
            raise RequestRejected(BAD_ARGUMENTS, f"{value!r} is not a valid time")
        seconds = int(hours or 0) * 3600 + int(minutes) * 60 + float(secs)
    else:
        raise RequestRejected(BAD_ARGUMENTS, f"a time must be seconds or mm:ss, not {str(value)[:40]!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise RequestRejected(BAD_ARGUMENTS, f"a time must be a finite number of seconds >= 0, got {value!r}")
    return seconds


def _no_constant(name: str) -> float:
    raise RequestRejected(BAD_ARGUMENTS, f"{name} is not a number")


def parse_request(body: str, budget: FrameBudget) -> FramesRequest:
    """The request in ``body`` (the text between the tool-call tags)."""
    if len(body) > MAX_REQUEST_CHARS:
        raise RequestRejected(MALFORMED, f"a request of {len(body)} characters (at most {MAX_REQUEST_CHARS})")
    try:
        call = json.loads(body, parse_constant=_no_constant)
    except (json.JSONDecodeError, RecursionError) as error:
        raise RequestRejected(MALFORMED, f"not JSON: {error}") from None
    if (
        not isinstance(call, dict)
        or set(call) != {"name", "arguments"}
        or not isinstance(call["arguments"], dict)
    ):
        raise RequestRejected(MALFORMED, 'a request is {"name": "get_frames", "arguments": {...}}')
    if call["name"] != TOOL_NAME:
        raise RequestRejected(
            UNKNOWN_TOOL, f"unknown tool {str(call['name'])[:40]!r}; the tool is {TOOL_NAME}"
        )
    arguments = call["arguments"]
    unknown = set(arguments) - _ARGUMENTS
    if unknown or not {"start", "end"} <= set(arguments):
        raise RequestRejected(
            BAD_ARGUMENTS, "the arguments are start, end (seconds or mm:ss) and fps (optional)"
        )
    start, end = parse_time(arguments["start"]), parse_time(arguments["end"])
    fps = arguments.get("fps", budget.default_fps)
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not math.isfinite(fps) or fps <= 0:
        raise RequestRejected(BAD_ARGUMENTS, f"fps must be a positive number, got {str(fps)[:40]!r}")
    if end <= start:
        raise RequestRejected(EMPTY_SPAN, f"the span ends ({end:g} s) before it starts ({start:g} s)")
    return FramesRequest(start, end, float(fps))


def request_body(completion_text: str) -> str | None:
    """The text of the last tool call a turn ends with (None: the turn makes no request).

    A turn that requests frames ends at the closing tag (the engines stop there); the call's
    body is what follows the last opening tag.
    """
    text = completion_text.rstrip()
    if not text.endswith(CALL_CLOSE):
        return None
    head = text[: -len(CALL_CLOSE)]
    opened = head.rfind(CALL_OPEN)
    return head[opened + len(CALL_OPEN) :].strip() if opened >= 0 else ""


def plan_frames(
    request: FramesRequest, *, source_fps: float, num_frames: int, frames_allowed: int
) -> FramePlan:
    """The source frames of ``request``'s span, at most ``frames_allowed`` of them.

    Frames are taken every ``step`` source frames from the first frame at or after ``start``
    while before ``end`` (cut to the video), ``step = round(source_fps / fps)`` (at least 1):
    evenly spaced in the source, so every frame's time is exact and the segment's rate is
    ``source_fps / step``. When that gives more than ``frames_allowed`` frames, ``step`` grows
    until they fit (a thinner sampling of the same span, never a shorter span).
    """
    if frames_allowed < 1:
        raise RequestRejected(NO_FRAMES_LEFT, "no frames are left in this episode's budget")
    first = math.ceil(request.start * source_fps - 1e-9)
    stop = min(num_frames, math.ceil(request.end * source_fps - 1e-9))  # exclusive
    if first >= stop:
        raise RequestRejected(
            OUTSIDE_VIDEO,
            f"no frame between {request.start:g} s and {request.end:g} s (the video lasts "
            f"{num_frames / source_fps:g} s)",
        )
    span = stop - first
    step = max(1, round(source_fps / request.fps))
    if math.ceil(span / step) > frames_allowed:
        step = math.ceil(span / frames_allowed)
    return FramePlan(tuple(range(first, stop, step)), source_fps)


@dataclass
class EpisodeFrames:
    """The requests of one episode so far, against its budget."""

    budget: FrameBudget
    calls: int = 0
    frames: int = 0
    served: list[FramePlan] = field(default_factory=list)
    """The plans of the requests served so far, in order."""

    def serve(self, body: str, *, source_fps: float, num_frames: int) -> FramePlan:
        """The frames for the request ``body`` (a call's text), counted against the budget.

        Every request counts as a call, served or not (a model that keeps writing bad requests
        still runs out of turns); only served frames count against the frame budget.
        """
        self.calls += 1
        if self.calls > self.budget.max_calls:
            raise RequestRejected(TOO_MANY_CALLS, f"at most {self.budget.max_calls} requests per question")
        request = parse_request(body, self.budget)
        allowed = min(self.budget.frames_per_call, self.budget.frames_per_episode - self.frames)
        plan = plan_frames(request, source_fps=source_fps, num_frames=num_frames, frames_allowed=allowed)
        self.frames += len(plan.frame_indices)
        self.served.append(plan)
        return plan

    def unserve(self) -> None:
        """Take back the last served plan (its frames could not be read): it costs no budget."""
        plan = self.served.pop()
        self.frames -= len(plan.frame_indices)


def clock(seconds: float) -> str:
    """``mm:ss.s`` (``h:mm:ss.s`` from one hour on), to a tenth of a second, rounded down.

    >>> clock(7.25), clock(3725.0)
    ('00:07.2', '1:02:05.0')
    """
    tenths = int(seconds * 10 + 1e-6)
    hours, rest = divmod(tenths, 36000)
    minutes, rest = divmod(rest, 600)
    text = f"{minutes:02d}:{rest // 10:02d}.{rest % 10}"
    return f"{hours}:{text}" if hours else text


def served_text(plan: FramePlan) -> str:
    """What the reply says of the frames it holds (their span and spacing, in the video's time).

    >>> served_text(FramePlan((30, 60, 90), source_fps=30.0))
    'frames 00:01.0-00:03.0, 3 frames, 1.00 s apart'
    """
    times = plan.timestamps
    count = len(times)
    return f"frames {clock(times[0])}-{clock(times[-1])}, {count} frame{'s' if count > 1 else ''}, " + (
        f"{plan.interval:.2f} s apart"
    )


def rejected_text(rejection: RequestRejected) -> str:
    """What the reply says of a request that got no frames."""
    return f"no frames ({rejection.reason}): {rejection}"
