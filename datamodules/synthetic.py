"""A synthetic long-video reasoning task small enough for a ~5M-parameter VLM on a CPU.

Each video is a sequence of ``K`` contiguous *scenes* (``K`` uniform in
``[min_scenes, max_scenes]``, default 2 to 5). A scene has a solid background colour taken
from :data:`PALETTE` (8 well-separated named colours, all ``K`` distinct) and a white square,
about 0.3 x the frame side, in one of the four :data:`QUADRANTS` ("top left", "top right",
"bottom left", "bottom right"). The square stays in its quadrant for the whole scene; it
jitters by a pixel or two and the pixels carry a little noise so that no two frames are
identical. Scene lengths are random, at least ``max(4, num_frames // 10)`` frames each.

Every video comes with one four-option multiple-choice question whose category cycles
through :data:`~datamodules.rows.CATEGORIES` by sample index (so the four are balanced):

========================  ====================================================================
Temporal                  "Which background color comes right after the {X} scene?"
Spatial                   "Where is the white square while the background is {X}?"
Goal and Purpose          "The white square is travelling to its destination. In which corner
                          does it finish?" (the last scene's quadrant)
Plot                      "How many scenes does the video show?"
========================  ====================================================================

No question can be answered from the text alone: the colour named in a Temporal question is
never among its options, quadrants and counts are uniform, and option order is either
shuffled or fixed, so every answer letter is equally likely. The ``reasoning`` (the CoT-SFT
target) is a short, template-regular chain of thought: one sentence per scene with its
``mm:ss`` time span, then one sentence that states the answer content, e.g.::

    00:00-00:07 red background, square top left. 00:07-00:19 blue background, square top
    right. 00:19-00:32 green background, square bottom left. The red scene is followed by
    the blue scene.

The ground truth stays in the row's ``extra``: ``scenes`` (start/end in seconds and frames,
colour, position), ``video_meta`` (fps, frame count, width, height) and ``asked_scene``.

Generation is deterministic and order-free: sample ``i`` of split ``s`` draws everything from
``numpy.random.default_rng((seed, SPLITS.index(s), i))``, so a sample does not depend on how
many others are generated, and the same seed gives byte-identical rows and mp4 files.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from datamodules.rows import CATEGORIES, MULTIPLE_CHOICE, OPTION_LETTERS, QARow
from datamodules.video import encode_mp4

PALETTE: dict[str, tuple[int, int, int]] = {
    # Far apart in RGB (min pairwise distance > 90) and far from the white square, so the
    # colours survive yuv420 compression and resizing and stay easy to tell apart.
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (235, 215, 20),
    "purple": (130, 40, 170),
    "orange": (245, 125, 0),
    "cyan": (20, 200, 215),
    "pink": (245, 120, 200),
}
QUADRANTS: tuple[str, ...] = ("top left", "top right", "bottom left", "bottom right")
SPLITS: tuple[str, ...] = ("train", "val", "test")
SQUARE_COLOR = (255, 255, 255)
NUM_OPTIONS = 4

TEMPORAL_QUESTION = "Which background color comes right after the {color} scene?"
SPATIAL_QUESTION = "Where is the white square while the background is {color}?"
GOAL_QUESTION = "The white square is travelling to its destination. In which corner does it finish?"
PLOT_QUESTION = "How many scenes does the video show?"


@dataclass(frozen=True)
class SynthConfig:
    """Everything that shapes the synthetic videos and questions (saved in ``dataset.json``).

    Args:
        num_frames: frames per video.
        fps: frame rate written into the mp4 (duration = ``num_frames / fps`` seconds).
        size: side of the square frames in pixels (even, at least 28).
        min_scenes: fewest scenes in a video (at least 2: Temporal needs a following scene).
        max_scenes: most scenes (at most ``len(PALETTE)`` and ``min_scenes + 3``, because the
            Plot question offers four consecutive counts).
        seed: base seed; see the module docstring for how samples derive theirs.
        square_fraction: side of the white square relative to the frame side.
        jitter_px: the square moves by up to this many pixels per frame, in x and y.
        noise: per-pixel noise amplitude (uniform in ``[-noise, noise]``).
    """

    num_frames: int = 64
    fps: float = 2.0
    size: int = 56
    min_scenes: int = 2
    max_scenes: int = 5
    seed: int = 0
    square_fraction: float = 0.3
    jitter_px: int = 2
    noise: int = 2

    def __post_init__(self) -> None:
        if self.size < 28 or self.size % 2:
            raise ValueError(f"size={self.size}: frames need an even side of at least 28 pixels (yuv420 mp4)")
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"fps={self.fps} must be a positive number")
        if self.min_scenes < 2:
            raise ValueError(f"min_scenes={self.min_scenes}: a video needs at least 2 scenes")
        if self.max_scenes < self.min_scenes:
            raise ValueError(f"max_scenes={self.max_scenes} is below min_scenes={self.min_scenes}")
        if self.max_scenes > len(PALETTE):
            raise ValueError(
                f"max_scenes={self.max_scenes}: scenes need distinct colours, only {len(PALETTE)}"
            )
        if self.max_scenes - self.min_scenes >= NUM_OPTIONS:
            raise ValueError(
                f"scene counts {self.min_scenes}..{self.max_scenes} do not fit the {NUM_OPTIONS} options of "
                "the Plot question; use at most 4 distinct counts"
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
        if not 0 < self.square_side + 2 * self.jitter_px <= self.size // 2:
            raise ValueError(
                f"square_fraction={self.square_fraction} with jitter_px={self.jitter_px}: the square must "
                "fit inside its quadrant"
            )

    @property
    def min_scene_frames(self) -> int:
        """Shortest scene: long enough to be seen when a video is subsampled ten-fold."""
        return max(4, self.num_frames // 10)

    @property
    def square_side(self) -> int:
        return round(self.square_fraction * self.size)

    @property
    def plot_options(self) -> tuple[str, ...]:
        """Four consecutive scene counts covering ``[min_scenes, max_scenes]`` ("2".."5" by default)."""
        low = max(2, self.max_scenes - (NUM_OPTIONS - 1))
        return tuple(str(low + i) for i in range(NUM_OPTIONS))

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
    position: str

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
    conclusion: str
    """The last reasoning sentence: it states the answer content."""
    asked_scene: int | None = None
    """Index of the scene named in the question (Temporal, Spatial), else ``None``."""

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
    """Draw the scene count, lengths (each at least ``min_scene_frames``), colours and quadrants."""
    count = int(rng.integers(config.min_scenes, config.max_scenes + 1))
    spare = config.num_frames - count * config.min_scene_frames
    # Sorted uniform cut points split the spare frames into `count` random non-negative parts.
    cuts = np.sort(rng.integers(0, spare + 1, size=count - 1))
    lengths = config.min_scene_frames + np.diff(np.concatenate([[0], cuts, [spare]]))
    colors = rng.choice(len(PALETTE), size=count, replace=False)
    positions = rng.integers(0, len(QUADRANTS), size=count)
    names = list(PALETTE)
    scenes: list[Scene] = []
    start = 0
    for length, color, position in zip(lengths, colors, positions, strict=True):
        end = start + int(length)
        scenes.append(
            Scene(
                start, end, start / config.fps, end / config.fps, names[int(color)], QUADRANTS[int(position)]
            )
        )
        start = end
    return scenes


def make_question(
    scenes: Sequence[Scene], category: str, config: SynthConfig, rng: np.random.Generator
) -> Question:
    """The question of one category about ``scenes``, with options and the answer's index."""
    if category == "Temporal":
        asked = int(rng.integers(0, len(scenes) - 1))
        color, answer = scenes[asked].color, scenes[asked + 1].color
        # Distractors: other colours of this video first (they are plausible), then palette
        # colours. The asked colour is never offered: it could be ruled out without the video.
        in_video = [s.color for s in scenes if s.color not in (color, answer)]
        elsewhere = [c for c in PALETTE if c not in in_video and c not in (color, answer)]
        distractors = [*rng.permutation(in_video), *rng.permutation(elsewhere)][: NUM_OPTIONS - 1]
        options = [answer, *(str(c) for c in distractors)]
        options = [options[i] for i in rng.permutation(NUM_OPTIONS)]
        return Question(
            category,
            TEMPORAL_QUESTION.format(color=color),
            tuple(options),
            options.index(answer),
            f"The {color} scene is followed by the {answer} scene.",
            asked,
        )
    if category == "Spatial":
        asked = int(rng.integers(0, len(scenes)))
        scene = scenes[asked]
        return Question(
            category,
            SPATIAL_QUESTION.format(color=scene.color),
            QUADRANTS,
            QUADRANTS.index(scene.position),
            f"While the background is {scene.color}, the square is {scene.position}.",
            asked,
        )
    if category == "Goal and Purpose":
        last = scenes[-1]
        return Question(
            category,
            GOAL_QUESTION,
            QUADRANTS,
            QUADRANTS.index(last.position),
            f"In the last scene the square is {last.position}.",
        )
    if category == "Plot":
        options = config.plot_options
        return Question(
            category,
            PLOT_QUESTION,
            options,
            options.index(str(len(scenes))),
            f"The video shows {len(scenes)} scenes.",
        )
    raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")


def reasoning_text(scenes: Sequence[Scene], question: Question) -> str:
    """One sentence per scene with its time span, then the question's conclusion."""
    described = [
        f"{format_timestamp(s.start_s)}-{format_timestamp(s.end_s)} "
        f"{s.color} background, square {s.position}."
        for s in scenes
    ]
    return " ".join([*described, question.conclusion])


def render_scenes(scenes: Sequence[Scene], config: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    """Frames ``(num_frames, size, size, 3)`` uint8 RGB: coloured backgrounds, a jittering white square."""
    size, side = config.size, config.square_side
    frames = np.empty((config.num_frames, size, size, 3), dtype=np.int16)
    offsets = rng.integers(-config.jitter_px, config.jitter_px + 1, size=(config.num_frames, 2))
    for scene in scenes:
        frames[scene.start_frame : scene.end_frame] = PALETTE[scene.color]
        quadrant = QUADRANTS.index(scene.position)
        # Centre the square in its quadrant; the quadrant leaves room for the jitter.
        top = round(size / 4 + (quadrant // 2) * size / 2 - side / 2)
        left = round(size / 4 + (quadrant % 2) * size / 2 - side / 2)
        for t in range(scene.start_frame, scene.end_frame):
            y, x = top + offsets[t, 0], left + offsets[t, 1]
            frames[t, y : y + side, x : x + side] = SQUARE_COLOR
    if config.noise:
        frames += rng.integers(-config.noise, config.noise + 1, size=frames.shape, dtype=np.int16)
    return np.clip(frames, 0, 255).astype(np.uint8)


def _plan(config: SynthConfig, split: str, index: int) -> tuple[QARow, list[Scene], np.random.Generator]:
    plan_rng, render_rng = sample_rngs(config, split, index)
    scenes = plan_scenes(config, plan_rng)
    question = make_question(scenes, category_of(index), config, plan_rng)
    key = sample_key(split, index)
    extra = {
        "scenes": [s.to_json() for s in scenes],
        "asked_scene": question.asked_scene,
        "video_meta": {
            "fps": config.fps,
            "num_frames": config.num_frames,
            "width": config.size,
            "height": config.size,
        },
    }
    row = QARow(
        problem_id=key,
        video=f"{key}.mp4",
        problem=question.problem,
        problem_type=MULTIPLE_CHOICE,
        reasoning=reasoning_text(scenes, question),
        answer=question.answer_letter,
        category=question.category,
        options=question.options,
        extra=extra,
    )
    return row, scenes, render_rng


def make_row(config: SynthConfig, split: str, index: int) -> QARow:
    """The QA row of sample ``index`` without rendering its video (cheap; equal to :func:`make_sample`'s)."""
    return _plan(config, split, index)[0]


def make_sample(config: SynthConfig, split: str, index: int) -> tuple[QARow, np.ndarray]:
    """The QA row of sample ``index`` and its frames ``(num_frames, size, size, 3)`` uint8."""
    row, scenes, render_rng = _plan(config, split, index)
    return row, render_scenes(scenes, config, render_rng)


def encode_sample(config: SynthConfig, split: str, index: int) -> tuple[str, bytes, dict[str, Any]]:
    """``(key, mp4 bytes, JSON row)``: one sample ready for :func:`datamodules.shards.write_shards`."""
    row, frames = make_sample(config, split, index)
    return row.problem_id, encode_mp4(frames, config.fps), row.to_json()


def encoded_samples(
    config: SynthConfig, split: str, count: int, *, workers: int = 1
) -> Iterator[tuple[str, bytes, dict[str, Any]]]:
    """Samples ``0 .. count-1`` of ``split``, in order, rendered and encoded by ``workers`` processes.

    Samples are independent, so the output is identical for any number of workers.
    """
    if workers <= 1:
        for index in range(count):
            yield encode_sample(config, split, index)
        return
    import multiprocessing
    from functools import partial

    # Spawn, not fork: the parent may hold threads (tqdm, torch) that fork would copy in a bad state.
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(partial(encode_sample, config, split), range(count), chunksize=8)
