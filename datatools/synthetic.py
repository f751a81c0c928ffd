"""A synthetic long-video reasoning task that a ~5M-parameter VLM learns in minutes on a CPU.

Each video is a sequence of ``K`` contiguous *scenes* (``K`` uniform in
``[min_scenes, max_scenes]``, default 1 to 4). A scene has a solid background colour from
:data:`PALETTE` (four named colours, all ``K`` distinct) and a white square centred in the
frame whose size is one of :data:`SQUARE_SIZES` ("small", "medium", "large", "huge"). The
square jitters by a pixel or two and the pixels carry a little noise, so no two frames are
identical. Scene lengths are random, at least ``max(2, num_frames // 8)`` frames each.

Every video comes with one four-option multiple-choice question whose category cycles
through :data:`~core.qa.CATEGORIES` by sample index (so the four are balanced).
Each is answerable only by looking at particular frames:

========================  ====================================================================
Temporal                  "Which background color comes first in the video?" (the opening frames)
Goal and Purpose          "The white square's journey ends in the final scene. What color is the
                          background when it arrives?" (the closing frames)
Spatial                   "How big is the white square at {mm:ss}, the middle of the video?"
                          (the frames at that time)
Plot                      "How many times does the background color change?" (the whole video)
========================  ====================================================================

Options come in a fixed order per category (palette order, size order, counts 0-3), and the
answers are uniform, so every letter is equally likely (the constant-letter baseline is 25%).
Why so plain: measured with the ``small`` preset on 2 cores, a model trained from scratch
learns these in a few hundred steps (Temporal and Goal ~100%, Spatial ~80%, Plot ~50% after
800 steps of 8 samples), but learned nothing in 1,500 steps when answers needed the absolute
position of an object (Qwen2.5-VL's rotary positions give a far-away text token almost no
absolute spatial signal) or when option order was shuffled (the in-context letter lookup is
itself a skill it does not pick up in that budget). Plot and Spatial are left partly unsolved
by SFT on purpose: they are where RL has room to improve.

The ``reasoning`` (the CoT-SFT target) is one short sentence citing ``mm:ss`` timestamps and
stating the answer content, e.g. "At 00:16 the white square is large." or "The background
changes 2 times, at 00:09 and 00:20.". The ground truth stays in the row's ``extra``:
``scenes`` (start/end in seconds and frames, colour, square size), ``video_meta`` (fps, frame
count, width, height) and ``asked_time_s`` (the time a Spatial question asks about).

Generation is deterministic and order-free: sample ``i`` of split ``s`` draws everything from
``numpy.random.default_rng((seed, SPLITS.index(s), i))``, so a sample does not depend on how
many others are generated, and the same seed gives byte-identical rows and mp4 files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from core.qa import CATEGORIES, MULTIPLE_CHOICE, OPTION_LETTERS
from datamodules.rows import QARow
from datatools.video_encode import encode_mp4

PALETTE: dict[str, tuple[int, int, int]] = {
    # Far apart in RGB and far from the white square, so they survive yuv420 compression.
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (235, 215, 20),
}
SQUARE_SIZES: dict[str, float] = {"small": 0.15, "medium": 0.3, "large": 0.5, "huge": 0.8}
"""Side of the white square as a fraction of the frame side."""
SPLITS: tuple[str, ...] = ("train", "val", "test")
SQUARE_COLOR = (255, 255, 255)
NUM_OPTIONS = 4
PLOT_OPTIONS: tuple[str, ...] = ("0", "1", "2", "3")

TEMPORAL_QUESTION = "Which background color comes first in the video?"
GOAL_QUESTION = (
    "The white square's journey ends in the final scene. What color is the background when it arrives?"
)
SPATIAL_QUESTION = "How big is the white square at {time}, the middle of the video?"
PLOT_QUESTION = "How many times does the background color change?"


@dataclass(frozen=True)
class SynthConfig:
    """Everything that shapes the synthetic videos and questions (saved in ``dataset.json``).

    Args:
        num_frames: frames per video.
        fps: frame rate written into the mp4 (duration = ``num_frames / fps`` seconds).
        size: side of the square frames in pixels (even, at least 28).
        min_scenes: fewest scenes in a video (at least 1).
        max_scenes: most scenes (at most ``len(PALETTE)``: scenes have distinct colours, and
            the Plot options are 0 to 3 colour changes).
        seed: base seed; see the module docstring for how samples derive theirs.
        jitter_px: the square moves by up to this many pixels per frame, in x and y.
        noise: per-pixel noise amplitude (uniform in ``[-noise, noise]``).
    """

    num_frames: int = 64
    fps: float = 2.0
    size: int = 56
    min_scenes: int = 1
    max_scenes: int = 4
    seed: int = 0
    jitter_px: int = 2
    noise: int = 2

    def __post_init__(self) -> None:
        if self.size < 28 or self.size % 2:
            raise ValueError(f"size={self.size}: frames need an even side of at least 28 pixels (yuv420 mp4)")
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"fps={self.fps} must be a positive number")
        if self.min_scenes < 1:
            raise ValueError(f"min_scenes={self.min_scenes}: a video needs at least 1 scene")
        if self.max_scenes < self.min_scenes:
            raise ValueError(f"max_scenes={self.max_scenes} is below min_scenes={self.min_scenes}")
        if self.max_scenes > len(PALETTE):
            raise ValueError(
                f"max_scenes={self.max_scenes}: scenes need distinct colours, only {len(PALETTE)}"
            )
        needed = self.max_scenes * self.min_scene_frames
        if self.num_frames < needed:
            raise ValueError(
                f"num_frames={self.num_frames} is too few for max_scenes={self.max_scenes}: every scene "
                f"needs at least {self.min_scene_frames} frames, so at least {needed} frames"
            )
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be non-negative")
        if self.jitter_px < 0 or not 0 <= self.noise <= 32:
            raise ValueError("jitter_px must be >= 0 and noise in [0, 32]")
        if max(self.square_side(name) for name in SQUARE_SIZES) + 2 * self.jitter_px > self.size:
            raise ValueError(f"jitter_px={self.jitter_px}: the largest square must stay inside the frame")

    @property
    def min_scene_frames(self) -> int:
        """Shortest scene: still seen when a video is subsampled four-fold and frames are paired."""
        return max(2, self.num_frames // 8)

    @property
    def duration_s(self) -> float:
        return self.num_frames / self.fps

    def square_side(self, size_name: str) -> int:
        return max(2, round(SQUARE_SIZES[size_name] * self.size))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Scene:
    """One contiguous stretch of the video: frames ``[start_frame, end_frame)``."""

    start_frame: int
    end_frame: int
    start_s: float
    end_s: float
    color: str
    square_size: str

    @property
    def middle_s(self) -> float:
        return (self.start_s + self.end_s) / 2

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Question:
    """A multiple-choice question about a list of scenes."""

    category: str
    problem: str
    options: tuple[str, ...]
    answer_index: int
    reasoning: str
    """The chain of thought: what is seen where, ending with the answer content."""
    asked_time_s: float | None = None
    """The time a Spatial question asks about, else ``None``."""

    @property
    def answer_letter(self) -> str:
        return OPTION_LETTERS[self.answer_index]


def sample_key(split: str, index: int) -> str:
    """The WebDataset key (and ``problem_id``) of a sample; it never contains a dot.

    >>> sample_key("train", 123)
    'synth-train-000123'
    """
    return f"synth-{split}-{index:06d}"


def category_of(index: int) -> str:
    """Categories cycle with the sample index, so every split is balanced."""
    return CATEGORIES[index % len(CATEGORIES)]


def format_timestamp(seconds: float) -> str:
    """``mm:ss`` (``h:mm:ss`` from one hour on), rounded down to the second.

    >>> format_timestamp(7.5), format_timestamp(3725)
    ('00:07', '1:02:05')
    """
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def sample_rngs(
    config: SynthConfig, split: str, index: int
) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for the plan (scenes, question) and for rendering (jitter, noise).

    Both derive from ``default_rng((seed, split_index, index))``; splitting them lets rows be
    generated without rendering and still match the rendered samples exactly.
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    if index < 0:
        raise ValueError(f"sample index {index} must be non-negative")
    plan_rng, render_rng = np.random.default_rng((config.seed, SPLITS.index(split), index)).spawn(2)
    return plan_rng, render_rng


def plan_scenes(config: SynthConfig, rng: np.random.Generator) -> list[Scene]:
    """Draw the scene count, lengths (each at least ``min_scene_frames``), colours and square sizes."""
    count = int(rng.integers(config.min_scenes, config.max_scenes + 1))
    spare = config.num_frames - count * config.min_scene_frames
    # Sorted uniform cut points split the spare frames into `count` random non-negative parts.
    cuts = np.sort(rng.integers(0, spare + 1, size=count - 1))
    lengths = config.min_scene_frames + np.diff(np.concatenate([[0], cuts, [spare]]))
    colors = rng.choice(len(PALETTE), size=count, replace=False)
    sizes = rng.integers(0, len(SQUARE_SIZES), size=count)
    color_names, size_names = list(PALETTE), list(SQUARE_SIZES)
    scenes: list[Scene] = []
    start = 0
    for length, color, size in zip(lengths, colors, sizes, strict=True):
        end = start + int(length)
        scenes.append(
            Scene(
                start,
                end,
                start / config.fps,
                end / config.fps,
                color_names[int(color)],
                size_names[int(size)],
            )
        )
        start = end
    return scenes


def scene_at(scenes: Sequence[Scene], frame: int) -> Scene:
    """The scene showing source frame ``frame``."""
    return next(s for s in scenes if s.start_frame <= frame < s.end_frame)


def make_question(scenes: Sequence[Scene], category: str, config: SynthConfig) -> Question:
    """The question of one category about ``scenes``, with its options, answer and reasoning."""
    colors = tuple(PALETTE)
    if category == "Temporal":
        first = scenes[0]
        return Question(
            category,
            TEMPORAL_QUESTION,
            colors,
            colors.index(first.color),
            f"The video opens at 00:00 on a {first.color} background.",
        )
    if category == "Goal and Purpose":
        last = scenes[-1]
        return Question(
            category,
            GOAL_QUESTION,
            colors,
            colors.index(last.color),
            f"At {format_timestamp(config.duration_s)} the video ends on a {last.color} background, "
            "where the square arrives.",
        )
    if category == "Spatial":
        middle_frame = config.num_frames // 2
        time = format_timestamp(middle_frame / config.fps)
        scene = scene_at(scenes, middle_frame)
        sizes = tuple(SQUARE_SIZES)
        return Question(
            category,
            SPATIAL_QUESTION.format(time=time),
            sizes,
            sizes.index(scene.square_size),
            f"At {time} the white square is {scene.square_size}.",
            asked_time_s=middle_frame / config.fps,
        )
    if category == "Plot":
        changes = len(scenes) - 1
        if changes == 0:
            reasoning = (
                f"The background stays {scenes[0].color} from 00:00 to "
                f"{format_timestamp(config.duration_s)}: it changes 0 times."
            )
        else:
            times = [format_timestamp(s.start_s) for s in scenes[1:]]
            listed = times[0] if changes == 1 else ", ".join(times[:-1]) + f" and {times[-1]}"
            reasoning = (
                f"The background changes {changes} {'time' if changes == 1 else 'times'}, at {listed}."
            )
        return Question(category, PLOT_QUESTION, PLOT_OPTIONS, PLOT_OPTIONS.index(str(changes)), reasoning)
    raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")


def reasoning_text(scenes: Sequence[Scene], question: Question) -> str:
    """The chain of thought of a question (kept as a function: other tasks may describe more)."""
    return question.reasoning


def render_scenes(scenes: Sequence[Scene], config: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    """Frames ``(num_frames, size, size, 3)`` uint8 RGB: coloured backgrounds, a jittering white square."""
    size = config.size
    frames = np.empty((config.num_frames, size, size, 3), dtype=np.int16)
    offsets = rng.integers(-config.jitter_px, config.jitter_px + 1, size=(config.num_frames, 2))
    for scene in scenes:
        frames[scene.start_frame : scene.end_frame] = PALETTE[scene.color]
        side = config.square_side(scene.square_size)
        corner = (size - side) // 2
        for t in range(scene.start_frame, scene.end_frame):
            y = min(max(corner + offsets[t, 0], 0), size - side)
            x = min(max(corner + offsets[t, 1], 0), size - side)
            frames[t, y : y + side, x : x + side] = SQUARE_COLOR
    if config.noise:
        frames += rng.integers(-config.noise, config.noise + 1, size=frames.shape, dtype=np.int16)
    return np.clip(frames, 0, 255).astype(np.uint8)


def _plan(config: SynthConfig, split: str, index: int) -> tuple[QARow, list[Scene], np.random.Generator]:
    plan_rng, render_rng = sample_rngs(config, split, index)
    scenes = plan_scenes(config, plan_rng)
    question = make_question(scenes, category_of(index), config)
    key = sample_key(split, index)
    extra = {
        "scenes": [s.to_json() for s in scenes],
        "asked_time_s": question.asked_time_s,
        "video_meta": video_meta(config.num_frames, config.fps, config.size),
    }
    reasoning = reasoning_text(scenes, question)
    row = synthetic_row(key, question, reasoning, extra)
    return row, scenes, render_rng


def video_meta(num_frames: int, fps: float, size: int) -> dict[str, Any]:
    """The ground truth of a synthetic video's format (square frames)."""
    return {"fps": fps, "num_frames": num_frames, "width": size, "height": size}


def synthetic_row(key: str, question: Question, reasoning: str, extra: dict[str, Any]) -> QARow:
    """A synthetic task's multiple-choice row (its video is ``<key>.mp4``)."""
    return QARow(
        problem_id=key,
        video=f"{key}.mp4",
        problem=question.problem,
        problem_type=MULTIPLE_CHOICE,
        reasoning=reasoning,
        answer=OPTION_LETTERS[question.answer_index],
        category=question.category,
        options=question.options,
        extra=extra,
    )


def make_row(config: SynthConfig, split: str, index: int) -> QARow:
    """The QA row of sample ``index`` without rendering its video (cheap; equal to :func:`make_sample`'s)."""
    return _plan(config, split, index)[0]


def make_sample(config: SynthConfig, split: str, index: int) -> tuple[QARow, np.ndarray]:
    """The QA row of sample ``index`` and its frames ``(num_frames, size, size, 3)`` uint8."""
    row, scenes, render_rng = _plan(config, split, index)
    return row, render_scenes(scenes, config, render_rng)


def encode_sample(config: SynthConfig, split: str, index: int) -> tuple[str, bytes, dict[str, Any]]:
    """``(key, mp4 bytes, JSON row)``: one sample ready for :func:`datatools.shard_writer.write_shards`."""
    row, frames = make_sample(config, split, index)
    return row.problem_id, encode_mp4(frames, config.fps), row.to_json()


def released_row(row: dict[str, Any]) -> dict[str, Any]:
    """A synthetic JSON row in the released LongVideo-Reason layout (what ``lvrl data build`` reads).

    The options go into ``problem`` one per line (``A. red``), the answer into
    ``<answer>X</answer>``; ``category`` is kept, our ground-truth fields are dropped.

    >>> row = {"problem_id": "k", "videos": "k.mp4", "problem": "Which?", "options": ["x", "y"],
    ...        "problem_type": "multiple choice", "reasoning": "r", "answer": "<answer>B</answer>"}
    >>> out = released_row({**row, "category": "Plot", "scenes": []})
    >>> out["problem"], out["answer"], "options" in out
    ('Which?\\nA. x\\nB. y', '<answer>B</answer>', False)
    """
    options = "".join(f"\n{OPTION_LETTERS[i]}. {text}" for i, text in enumerate(row["options"]))
    return {
        "problem_id": row["problem_id"],
        "data_type": "video",
        "videos": row["videos"],
        "problem": row["problem"] + options,
        "problem_type": row["problem_type"],
        "reasoning": row["reasoning"],
        "answer": row["answer"],
        "category": row["category"],
    }


def encoded_samples(
    config: Any,
    split: str,
    count: int,
    *,
    workers: int = 1,
    encode: Callable[[Any, str, int], tuple[str, bytes, dict[str, Any]]] = encode_sample,
) -> Iterator[tuple[str, bytes, dict[str, Any]]]:
    """Samples ``0 .. count-1`` of ``split``, in order, rendered and encoded by ``workers`` processes
    (``encode``: a task's ``encode_sample``, this module's by default).

    Samples are independent, so the output is identical for any number of workers.
    """
    if workers <= 1:
        for index in range(count):
            yield encode(config, split, index)
        return
    from functools import partial

    from datatools.worker_pool import worker_pool

    with worker_pool(workers) as pool:
        yield from pool.imap(partial(encode, config, split), range(count), chunksize=8)
