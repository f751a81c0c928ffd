"""A synthetic long-video task that needs a closer look: short events a sparse overview misses.

A video of ``num_frames`` frames (default 1,024 at 8 fps: 128 s) is cut into ``slots`` equal
stretches (default 8 of 16 s). One stretch, the *landmark*, has a blue background; the others
are grey, so even a sparse overview (16 frames: two per stretch) shows where it is. Short
*markers* show for ``marker_frames`` frames (default 16: two seconds) on a two-second grid from
the stretch's start: a coloured square of one of four sizes in the middle of the frame. The
question asks about the markers inside the blue stretch; markers elsewhere are distractors.
Four categories, as :data:`~core.qa.CATEGORIES`:

========================  =====================================================================
Temporal                  "Which marker colour appears first during the blue stretch?" (2-3
                          markers of distinct colours)
Goal and Purpose          "Which marker colour appears last before the blue stretch ends?"
Spatial                   "How big is the marker during the blue stretch?" (1 marker; small,
                          medium, large or huge)
Plot                      "How many markers appear during the blue stretch?" (0-3)
========================  =====================================================================

Why centred squares of a size rather than squares in a corner (which the first version drew):
measured with the ``small`` preset on 2 cores, 600 SFT steps on the 16 frames a request is
served (the blue stretch at 1 fps) left a corner marker unread: the loss with another video's
frames was the same to 4 decimals, whether the square had a side of 16 pixels or filled its
28-pixel quadrant (one visual token in 32), and with a trainable tower its output collapsed to
one direction (token norms x40, cosine 0.999 between marker and background tokens). A
centred square reaches all four tokens of its frame: within 300 steps the loss with the right
frames was lower than with another video's (0.32-0.39 against 0.39-0.42), and after 600 steps
(frozen tower) 54.5% of 200 validation questions were right (sizes 76%, counts 78%; colours
30-34%: the colour is not read yet). The scenes task found the same: its models read sizes and
colours, not absolute positions. A rerun of that probe (docs/tool-use.md) did not
reproduce the 54.5%: 26.5% after 600 steps, the loss the same with another video's frames. What
made the markers readable there was the temporal patch: Qwen2.5-VL merges two consecutive frames
into one visual token, so a marker seen in one served frame is half of a token's input; with the
marker in both frames of its patch the probe read it within 300 steps. So a marker lasts as
long as one visual token at the request's rate (two served frames) and starts where one does:
a request for the stretch at 1 fps serves every marker as both frames of one temporal patch.

Why the span matters: a two-second marker is in a sparse sample by chance only: a 16-frame
overview (one frame every 8 s) falls on about a fifth of them, 32 frames on half, and 64 (every
2 s) on each once, as one of the two frames of a temporal patch; 128 dense frames or more show
each as a whole patch. Asking for the blue stretch at 1 fps (16 frames) serves every marker in it
as both frames of one patch: the tool's 32-frame budget holds the answer, the overview does not.

Each row carries two CoT-SFT targets: ``reasoning`` for a model that sees the frames directly,
from the ground truth ("The blue stretch runs from 00:32 to 00:48. Markers by colour: red small
at 00:35, green none, yellow none, white large at 00:41. In time order: red, white. First:
red."), and ``extra["tool_trace"]``, an episode of frame requests (:data:`TRACE_REQUESTS`):

- ``random`` (the default): the trace does not know where the blue stretch is. Its turns ask for
  stretches drawn at random (distinct, at ``request_fps``, from a generator of their own that
  never sees the plan), up to ``trace_calls`` of them, stopping at the first reply that shows the
  blue stretch; each later turn says the frames it got were grey. When a reply showed the blue
  stretch, the last turn reads its markers and answers; when none did, it says so and guesses
  a letter at random (an answer it could not have read is not taught as known). So SFT teaches
  the tool's syntax, a search, and reading what the frames show, but not where to look: a
  policy that asks where the overview shows blue has to be learned by RL, from the reward of
  the answers that reading the right frames makes right.
- ``oracle``: one turn that locates the stretch from the ground truth and asks for exactly it
  (what the first version of the task taught: RL then only trains the reading).

With ``random`` traces, ``given_oracle_share`` turns that share of the training rows into the
oracle request *given* with the question (``first_turn_given``: the request is context, written
for the model, never a target) and the reading of the blue stretch: random traces find the
stretch in about a quarter of the rows (two requests among eight stretches), and a model
trained on them alone did not learn to read it; given rows teach the reading without teaching
which request finds it.

A turn is ``<think>...</think>`` then the request in the tool's syntax; a reading gives each marker
at the time of the frame it is seen in. The ground truth stays in ``extra["zoom"]``, and the
answer's stretch in ``extra["relevant_span_s"]`` (what evaluations measure requests against:
:mod:`core.tool_use.spans`).

Why the markers are looked up by colour: a trace that listed them in time order ("Markers: red
small at 00:35, green large at 00:41.") taught sizes, times and counts but no colour in 2,400
steps: the colour words stayed at chance loss (ln 4), the language model's hidden state before
the first one held neither the colour nor the size of the first marker, while after a colour word
it read that marker's size and time. Attending to the marker a colour names is easy; naming the
colour of "the earliest marker" is not. So the trace asks each colour in turn (the lookup it
learns), puts the colours found in time order by their written times (text work), and names the
value asked for, which the answer letter then copies.

Generation is deterministic and order-free, as the scenes task's
(:func:`datatools.synthetic.sample_rngs`): the same seed gives byte-identical rows and videos.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from core.qa import CATEGORIES, OPTION_LETTERS
from core.tool_use.requests import CALL_CLOSE, CALL_OPEN, TOOL_NAME
from datamodules.rows import QARow
from datatools.synthetic import (
    SPLITS,
    Question,
    category_of,
    format_timestamp,
    sample_key,
    synthetic_row,
    video_meta,
)
from datatools.video_encode import encode_mp4

BACKGROUND = {"grey": (128, 128, 128), "blue": (30, 60, 220)}
LANDMARK = "blue"
MARKER_COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 190, 50),
    "yellow": (235, 215, 20),
    "white": (255, 255, 255),
}
TEMPORAL_PATCH = 2
"""Frames one visual token spans in time, in every Qwen-VL family (``temporal_patch_size``)."""
MARKER_SIZES: dict[str, float] = {"small": 2 / 7, "medium": 3 / 7, "large": 9 / 14, "huge": 6 / 7}
"""A marker's side as a fraction of the frame's (16, 24, 36 and 48 pixels in 56-pixel frames)."""
COUNT_OPTIONS: tuple[str, ...] = ("0", "1", "2", "3")

LISTED_TIMES = ("clock", "patch")
"""How a reading writes a marker's time (:attr:`ZoomConfig.listed_times`)."""
TRACE_REQUESTS = ("random", "oracle")
"""Where a tool trace's requests come from (:attr:`ZoomConfig.trace_requests`)."""

QUESTIONS = {
    "Temporal": "Which marker colour appears first during the blue stretch?",
    "Goal and Purpose": "Which marker colour appears last before the blue stretch ends?",
    "Spatial": "How big is the marker during the blue stretch?",
    "Plot": "How many markers appear during the blue stretch?",
}


@dataclass(frozen=True)
class ZoomConfig:
    """What shapes the zoom task's videos (saved in ``dataset.json``).

    Args:
        num_frames: frames per video.
        fps: frame rate (duration = ``num_frames / fps``).
        slots: equal stretches the video is cut into, one of them the blue landmark.
        marker_frames: how long a marker shows, in frames: the frames of one temporal patch
            at ``request_fps`` (:data:`TEMPORAL_PATCH` served frames); markers start on a grid
            of this many frames from their stretch's start.
        size: side of the square frames in pixels (even, at least 28; markers are
            :data:`MARKER_SIZES` of it).
        max_distractors: most markers in each grey stretch.
        request_fps: the rate the tool trace asks for (frames per second of the stretch).
        seed: base seed.
        noise: per-pixel noise amplitude (0 by default: flat frames compress ~25-fold better, and
            the markers already make frames differ).
        listed_times: how a reading writes a marker's time. ``clock``: the time of the frame it
            is first seen in, as ``mm:ss`` (``00:35``). ``patch``: the timestamp Qwen3-VL's
            processor writes before the temporal patch that frame is in, as it writes it
            (``35.5 seconds``: the mean of the patch's two frame times), so naming it is a copy
            from the prompt rather than a conversion (why: docs/tool-use.md, "What the written times
            show"). A reading without served frames (the dense target ``reasoning``) writes the
            patch a request at ``request_fps`` would serve. Videos and questions are the same
            either way; only the readings' text differs.
        trace_requests: where the tool trace's requests come from (:data:`TRACE_REQUESTS`, see
            the module docstring): ``random`` stretches, or the ``oracle`` one.
        trace_calls: most requests of a ``random`` trace (a tool budget's ``max_calls`` must
            allow them).
        given_oracle_share: with ``random`` traces, the share of training rows (drawn from a
            stream of their own, so every other row keeps the trace a plain random build
            writes) whose trace is instead the oracle request *given* with the question
            (``first_turn_given``: CoT-SFT puts it in the target without training it) followed
            by the reading of the blue stretch. Such a row teaches reading the right frames and
            never the request that found them. Validation and test rows are never given one.
    """

    num_frames: int = 1024
    fps: float = 8.0
    slots: int = 8
    marker_frames: int = 16
    size: int = 56
    max_distractors: int = 2
    request_fps: float = 1.0
    seed: int = 0
    noise: int = 0
    listed_times: str = "clock"
    trace_requests: str = "random"
    trace_calls: int = 2
    given_oracle_share: float = 0.0

    def __post_init__(self) -> None:
        if self.listed_times not in LISTED_TIMES:
            raise ValueError(f"listed_times must be one of {LISTED_TIMES}, got {self.listed_times!r}")
        if self.trace_requests not in TRACE_REQUESTS:
            raise ValueError(f"trace_requests must be one of {TRACE_REQUESTS}, got {self.trace_requests!r}")
        if not 1 <= self.trace_calls <= self.slots:
            raise ValueError(f"trace_calls must be between 1 and slots={self.slots}, got {self.trace_calls}")
        if not 0.0 <= self.given_oracle_share <= 1.0:
            raise ValueError(f"given_oracle_share must be in [0, 1], got {self.given_oracle_share}")
        if self.given_oracle_share and self.trace_requests != "random":
            raise ValueError("given_oracle_share mixes given oracle requests into random traces only")
        if self.size < 28 or self.size % 2:
            raise ValueError("size must be even and >= 28")
        if not (math.isfinite(self.fps) and self.fps > 0 and self.request_fps > 0):
            raise ValueError("fps and request_fps must be positive")
        if self.slots < 1 or self.num_frames % self.slots:
            raise ValueError(
                f"num_frames={self.num_frames} must split into slots={self.slots} equal stretches"
            )
        if self.marker_frames < 1 or 5 * self.marker_frames > self.slot_frames:
            raise ValueError("a stretch must hold three markers with gaps: marker_frames too large")
        step = self.fps / self.request_fps
        if (
            step != int(step)
            or self.slot_frames % self.marker_frames
            or self.marker_frames != TEMPORAL_PATCH * step
        ):
            raise ValueError(
                "a request must serve every marker as one temporal patch: fps / request_fps a whole "
                f"number of frames, marker_frames {TEMPORAL_PATCH} times that, dividing a stretch"
            )
        if self.seed < 0 or not 0 <= self.noise <= 32 or self.max_distractors < 0:
            raise ValueError("seed and max_distractors must be >= 0, noise in [0, 32]")

    @property
    def slot_frames(self) -> int:
        return self.num_frames // self.slots

    def to_json(self) -> dict[str, Any]:
        return {"task": "zoom", **asdict(self)}

    @classmethod
    def from_json(cls, written: dict[str, Any]) -> ZoomConfig:
        """The config :meth:`to_json` wrote (a build's ``dataset.json`` keeps it as ``config``)."""
        if written.get("task") != "zoom":
            raise ValueError(f"not a zoom task's config: task {written.get('task')!r}")
        return cls(**{key: value for key, value in written.items() if key != "task"})


@dataclass(frozen=True)
class Marker:
    start_frame: int
    color: str
    size: str
    """One of :data:`MARKER_SIZES`."""


def sample_rngs(
    config: ZoomConfig, split: str, index: int
) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for the plan and the rendering of one sample."""
    if split not in SPLITS or index < 0:
        raise ValueError(f"split must be one of {SPLITS} and the index >= 0")
    # A different stream from the scenes task's with the same seed (the leading 1).
    plan, render = np.random.default_rng((1, config.seed, SPLITS.index(split), index)).spawn(2)
    return plan, render


def trace_rng(config: ZoomConfig, split: str, index: int) -> np.random.Generator:
    """The generator of one sample's random trace: its own stream (the leading 2), which never
    sees the plan, so the stretches a trace asks for say nothing of where the blue one is."""
    return np.random.default_rng((2, config.seed, SPLITS.index(split), index))


def _place(rng: np.random.Generator, config: ZoomConfig, slot: int, count: int) -> list[int]:
    """Start frames of ``count`` markers inside stretch ``slot``, on the grid of ``marker_frames``
    from its start (where the request's temporal patches start), a free grid cell between two."""
    cells = config.slot_frames // config.marker_frames
    spare = cells - (2 * count - 1) if count else 0
    # Sorted uniform cut points split the spare cells into count + 1 random non-negative parts.
    cuts = np.sort(rng.integers(0, spare + 1, size=count))
    starts, cell = [], 0
    for i, cut in enumerate(cuts.tolist()):
        cell += cut - (cuts[i - 1] if i else 0)
        starts.append(slot * config.slot_frames + int(cell) * config.marker_frames)
        cell += 2
    return starts


def plan_sample(
    config: ZoomConfig, category: str, rng: np.random.Generator
) -> tuple[int, list[Marker], list[Marker]]:
    """The landmark stretch, its markers (in time order) and the distractors elsewhere."""
    landmark = int(rng.integers(config.slots))
    colors, sizes = list(MARKER_COLORS), list(MARKER_SIZES)
    count = {"Temporal": int(rng.integers(2, 4)), "Goal and Purpose": int(rng.integers(2, 4))}.get(
        category, 1 if category == "Spatial" else int(rng.integers(0, 4))
    )
    chosen = rng.choice(len(colors), size=count, replace=False) if count else []
    markers = [
        Marker(start, colors[int(c)], sizes[int(rng.integers(4))])
        for start, c in zip(_place(rng, config, landmark, count), chosen, strict=True)
    ]
    distractors = []
    for slot in range(config.slots):
        if slot == landmark:
            continue
        extra = int(rng.integers(0, config.max_distractors + 1))
        for start in _place(rng, config, slot, extra):
            distractors.append(Marker(start, colors[int(rng.integers(4))], sizes[int(rng.integers(4))]))
    return landmark, markers, distractors


def question_of(category: str, markers: list[Marker]) -> tuple[tuple[str, ...], int]:
    """The options and the answer's index."""
    colors = tuple(MARKER_COLORS)
    if category == "Temporal":
        return colors, colors.index(markers[0].color)
    if category == "Goal and Purpose":
        return colors, colors.index(markers[-1].color)
    if category == "Spatial":
        return tuple(MARKER_SIZES), list(MARKER_SIZES).index(markers[0].size)
    if category == "Plot":
        return COUNT_OPTIONS, len(markers)
    raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")


def _seen(config: ZoomConfig, markers: list[Marker], frames: list[int] | None = None) -> str:
    """What the markers show, looked up by colour, then their colours in time order. Each colour in
    :data:`MARKER_COLORS` order with the size and the time of the marker of that colour (the first
    of ``frames`` that shows it; None: when it appears) or "none"; a stretch's markers have distinct
    colours. Why by colour: a model reads the marker a colour word names (its size and time) long
    before it can name the colour of "the first marker" (docs/tool-use.md), and ordering
    written times is text work."""

    def seen_at(marker: Marker) -> int:
        if frames is None:
            return marker.start_frame
        return next(i for i in frames if marker.start_frame <= i < marker.start_frame + config.marker_frames)

    def written_time(marker: Marker) -> str:
        first = seen_at(marker)
        if config.listed_times == "clock":
            return format_timestamp(first / config.fps)
        if frames is None:  # the patch a request at request_fps serves from this frame
            return f"{first / config.fps + 0.5 / config.request_fps:.1f} seconds"
        # Served frames pair into temporal patches in order; the processor writes their mean time
        # (a last patch short of a frame is padded with a copy of its frame).
        served = sorted(frames)
        position = served.index(first)
        patch = served[position - position % TEMPORAL_PATCH :][:TEMPORAL_PATCH]
        patch += [patch[-1]] * (TEMPORAL_PATCH - len(patch))
        return f"{sum(patch) / len(patch) / config.fps:.1f} seconds"

    by_colour = {m.color: m for m in markers}
    if len(by_colour) != len(markers):
        raise ValueError("the markers of one stretch must differ in colour")
    listed = ", ".join(
        f"{color} {by_colour[color].size} at {written_time(by_colour[color])}"
        if color in by_colour
        else f"{color} none"
        for color in MARKER_COLORS
    )
    in_order = ", ".join(m.color for m in sorted(markers, key=seen_at)) or "none"
    return f"Markers by colour: {listed}. In time order: {in_order}."


CONCLUSIONS = {"Temporal": "First", "Goal and Purpose": "Last", "Spatial": "Size", "Plot": "Count"}
"""The closing words of a reading: the asked attribute's value, named right before the answer."""


def _reading(
    config: ZoomConfig, category: str, markers: list[Marker], frames: list[int] | None = None
) -> str:
    """:func:`_seen`, then the value the question asks for ("First: red."): the answer letter is
    then a copy of the option just named, not a lookup across the listing (measured: with the
    listing alone the letter was the weak step, docs/tool-use.md)."""
    if category in ("Temporal", "Goal and Purpose") and not markers:
        value = "none"  # a partial view (served_markers) may show none of a colour question's markers
    else:
        options, answer = question_of(category, markers)
        value = options[answer]
    return f"{_seen(config, markers, frames)} {CONCLUSIONS[category]}: {value}."


def slot_span(config: ZoomConfig, slot: int) -> tuple[float, float]:
    """Seconds ``(start, end)`` of stretch ``slot``."""
    return (slot * config.slot_frames / config.fps, (slot + 1) * config.slot_frames / config.fps)


GREY_REPLY = "These frames are grey: not the blue stretch."
NOT_FOUND = "The blue stretch was not in the frames I got, so I guess."
FOUND = "These frames are the blue stretch."
FIRST_THOUGHT = "I need a closer look at one stretch."
"""A random trace's first thought: it does not know where the blue stretch is."""


def tool_trace(
    config: ZoomConfig,
    split: str,
    index: int,
    category: str,
    landmark: int,
    markers: list[Marker],
    answer: str,
) -> dict[str, Any]:
    """The row's tool trace (see the module docstring): ``turns`` (each ending with a request),
    ``final_reasoning``, the last turn's ``answer`` and the ``requests`` made; ``first_turn_given``
    on a row given the oracle request (:attr:`ZoomConfig.given_oracle_share`)."""
    given = is_given_oracle(config, split, index)
    if config.trace_requests == "oracle" or given:
        start_s, end_s = slot_span(config, landmark)
        located = f"The blue stretch runs from {format_timestamp(start_s)} to {format_timestamp(end_s)}."
        slots, found = [landmark], True
        thoughts = [located]
    else:
        order = trace_rng(config, split, index).permutation(config.slots).tolist()
        slots = order[: config.trace_calls]
        if landmark in slots:
            slots = slots[: slots.index(landmark) + 1]  # the search stops at the first blue reply
        found = slots[-1] == landmark
        thoughts = [FIRST_THOUGHT] + [GREY_REPLY] * (len(slots) - 1)
    turns = [request_turn(config, thought, slot) for thought, slot in zip(thoughts, slots, strict=True)]
    if found:
        # What the requested frames show (a marker at the time of the frame it is seen in).
        reading = _reading(config, category, markers, request_frames(config, landmark))
        # A given request is read as the model's own blue reply would be (the random traces' words).
        final = reading if config.trace_requests == "oracle" else f"{FOUND} {reading}"
    else:
        guess = trace_rng(config, split, index).spawn(1)[0]
        options = question_of(category, markers)[0]
        final, answer = f"{GREY_REPLY} {NOT_FOUND}", OPTION_LETTERS[int(guess.integers(len(options)))]
    given_key = {"first_turn_given": True} if given else {}
    return {
        "kind": config.trace_requests,
        **given_key,
        "turns": turns,
        "final_reasoning": final,
        "answer": answer,
        "requests": [
            {"start_s": slot_span(config, s)[0], "end_s": slot_span(config, s)[1], "fps": config.request_fps}
            for s in slots
        ],
    }


def request_turn(config: ZoomConfig, thought: str, slot: int) -> str:
    """A trace's turn: its thought, then its request for stretch ``slot`` at the trace's rate."""
    return f"<think>{thought}</think>\n{request_text(*slot_span(config, slot), config.request_fps)}"


def request_text(start_s: float, end_s: float, fps: float) -> str:
    """A frames request in the tool's syntax (:mod:`core.tool_use.requests`)."""
    rate: float | int = int(fps) if float(fps).is_integer() else fps
    arguments = {"start": format_timestamp(start_s), "end": format_timestamp(end_s), "fps": rate}
    return f"{CALL_OPEN}\n{json.dumps({'name': TOOL_NAME, 'arguments': arguments})}\n{CALL_CLOSE}"


def is_given_oracle(config: ZoomConfig, split: str, index: int) -> bool:
    """Whether the row's trace is the given oracle request (:attr:`ZoomConfig.given_oracle_share`),
    drawn from its own stream (the leading 3): the rows not chosen keep their random traces."""
    if split != "train" or not config.given_oracle_share:
        return False
    draw = np.random.default_rng((3, config.seed, SPLITS.index(split), index)).random()
    return bool(draw < config.given_oracle_share)


def make_row(config: ZoomConfig, split: str, index: int) -> tuple[QARow, np.random.Generator, list[Marker]]:
    plan_rng, render_rng = sample_rngs(config, split, index)
    category = category_of(index)
    landmark, markers, distractors = plan_sample(config, category, plan_rng)
    options, answer = question_of(category, markers)
    start_s, end_s = slot_span(config, landmark)
    located = f"The blue stretch runs from {format_timestamp(start_s)} to {format_timestamp(end_s)}."
    key = sample_key(split, index)
    extra = {
        "zoom": {
            "landmark_slot": landmark,
            "span_s": [start_s, end_s],
            "markers": [asdict(m) for m in markers],
            "distractors": [asdict(m) for m in distractors],
        },
        "relevant_span_s": [start_s, end_s],
        "tool_trace": tool_trace(config, split, index, category, landmark, markers, OPTION_LETTERS[answer]),
        "video_meta": video_meta(config.num_frames, config.fps, config.size),
    }
    question = Question(category, QUESTIONS[category], options, answer, "")
    row = synthetic_row(key, question, f"{located} {_reading(config, category, markers)}", extra)
    return row, render_rng, [*markers, *distractors]


def render(config: ZoomConfig, landmark: int, markers: list[Marker], rng: np.random.Generator) -> np.ndarray:
    """Frames ``(num_frames, size, size, 3)`` uint8 RGB."""
    size = config.size
    frames = np.empty((config.num_frames, size, size, 3), dtype=np.int16)
    frames[:] = BACKGROUND["grey"]
    first = landmark * config.slot_frames
    frames[first : first + config.slot_frames] = BACKGROUND[LANDMARK]
    for marker in markers:
        low, high = marker_box(config, marker.size)
        frames[marker.start_frame : marker.start_frame + config.marker_frames, low:high, low:high] = (
            MARKER_COLORS[marker.color]
        )
    if config.noise:
        frames += rng.integers(-config.noise, config.noise + 1, size=frames.shape, dtype=np.int16)
    return np.clip(frames, 0, 255).astype(np.uint8)


def marker_box(config: ZoomConfig, size: str) -> tuple[int, int]:
    """The first and one-past-last pixel rows (and columns) of a centred marker of ``size``."""
    side = 2 * round(config.size * MARKER_SIZES[size] / 2)
    low = (config.size - side) // 2
    return low, low + side


def encode_sample(config: ZoomConfig, split: str, index: int) -> tuple[str, bytes, dict[str, Any]]:
    """``(key, mp4 bytes, JSON row)`` of sample ``index``, for :func:`datatools.shard_writer.write_shards`."""
    row, render_rng, markers = make_row(config, split, index)
    frames = render(config, row.extra["zoom"]["landmark_slot"], markers, render_rng)
    return row.problem_id, encode_mp4(frames, config.fps), row.to_json()


def request_frames(config: ZoomConfig, slot: int) -> list[int]:
    """The frames a request for stretch ``slot`` at ``request_fps`` is served (one every
    ``fps / request_fps`` frames from the stretch's first)."""
    step = round(config.fps / config.request_fps)
    return list(range(slot * config.slot_frames, (slot + 1) * config.slot_frames, step))


def served_markers(config: ZoomConfig, row: QARow, frame_indices: list[int]) -> str:
    """What the sampled ``frame_indices`` show of the landmark's markers (for checks and traces)."""
    shown = [
        m
        for m in (Marker(**m) for m in row.extra["zoom"]["markers"])
        if any(m.start_frame <= i < m.start_frame + config.marker_frames for i in frame_indices)
    ]
    return _reading(config, row.category, shown, sorted(frame_indices))
