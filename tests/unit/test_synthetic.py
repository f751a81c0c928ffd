"""The synthetic long-video task: ground truth, questions, answers, rendering and determinism."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pytest

from datamodules.rows import CATEGORIES, OPTION_LETTERS, QARow, parse_row
from datamodules.video import decode_video
from datatools.synthetic import (
    PALETTE,
    PLOT_OPTIONS,
    SQUARE_SIZES,
    SynthConfig,
    encode_sample,
    encoded_samples,
    format_timestamp,
    make_row,
    make_sample,
)
from datatools.video_encode import encode_mp4

# Small enough to render and encode in milliseconds, long enough for 4 scenes of >= 3 frames.
TINY = SynthConfig(num_frames=24, fps=2.0, size=56)


def _scenes(row: QARow) -> list[dict]:
    return row.extra["scenes"]


def _expected_answer(row: QARow) -> str:
    """The correct option text, derived from the ground-truth scenes only."""
    scenes = _scenes(row)
    if row.category == "Temporal":
        return scenes[0]["color"]
    if row.category == "Goal and Purpose":
        return scenes[-1]["color"]
    if row.category == "Spatial":
        asked = row.extra["asked_time_s"]
        return next(s["square_size"] for s in scenes if s["start_s"] <= asked < s["end_s"])
    return str(len(scenes) - 1)


@pytest.fixture(scope="module")
def rows() -> list[QARow]:
    return [make_row(SynthConfig(), "train", i) for i in range(200)]


def test_answers_match_ground_truth_and_options_hold_answer_once(rows: list[QARow]) -> None:
    for row in rows:
        expected = _expected_answer(row)
        assert row.options[row.answer_index] == expected, row.problem_id
        assert row.options.count(expected) == 1
        assert len(row.options) == 4 and len(set(row.options)) == 4
        assert row.reasoning.endswith(".") and expected in row.reasoning


def test_options_are_in_a_fixed_order_per_category(rows: list[QARow]) -> None:
    expected = {
        "Temporal": tuple(PALETTE),
        "Goal and Purpose": tuple(PALETTE),
        "Spatial": tuple(SQUARE_SIZES),
        "Plot": PLOT_OPTIONS,
    }
    for row in rows:
        assert row.options == expected[row.category]
        if row.category == "Spatial":
            assert format_timestamp(row.extra["asked_time_s"]) in row.problem


def test_categories_and_letters_are_balanced(rows: list[QARow]) -> None:
    assert Counter(row.category for row in rows) == {c: 50 for c in CATEGORIES}
    letters = Counter(row.answer for row in rows)
    assert set(letters) == set(OPTION_LETTERS[:4])
    assert all(30 <= n <= 70 for n in letters.values()), letters  # 50 expected, sd about 6


def test_scenes_tile_the_video(rows: list[QARow]) -> None:
    config = SynthConfig()
    counts = Counter()
    for row in rows:
        scenes = _scenes(row)
        counts[len(scenes)] += 1
        assert config.min_scenes <= len(scenes) <= config.max_scenes
        assert scenes[0]["start_frame"] == 0 and scenes[-1]["end_frame"] == config.num_frames
        for before, after in itertools.pairwise(scenes):
            assert before["end_frame"] == after["start_frame"]
        assert all(s["end_frame"] - s["start_frame"] >= config.min_scene_frames for s in scenes)
        assert all(s["start_s"] == s["start_frame"] / config.fps for s in scenes)
        assert len({s["color"] for s in scenes}) == len(scenes)
        assert row.extra["video_meta"] == {"fps": 2.0, "num_frames": 64, "width": 56, "height": 56}
    assert set(counts) == {1, 2, 3, 4}


def test_reasoning_cites_timestamps(rows: list[QARow]) -> None:
    for row in rows:
        scenes = _scenes(row)
        if row.category == "Plot" and len(scenes) > 1:
            # Every colour change is cited at its time.
            for scene in scenes[1:]:
                assert format_timestamp(scene["start_s"]) in row.reasoning
        else:
            assert any(f"{m:02d}:" in row.reasoning for m in range(60)), row.reasoning


def test_rows_are_valid_released_layout(rows: list[QARow]) -> None:
    for row in rows[:8]:
        obj = json.loads(json.dumps(row.to_json()))
        assert obj["problem_id"] == row.problem_id and obj["videos"] == f"{row.problem_id}.mp4"
        assert obj["answer"] == f"<answer>{row.answer}</answer>"
        assert obj["problem_type"] == "multiple choice" and obj["data_type"] == "video"
        assert parse_row(obj) == row
    assert rows[123].problem_id == "synth-train-000123"


def test_row_without_rendering_equals_rendered_sample_row() -> None:
    for index in range(4):
        row, frames = make_sample(TINY, "val", index)
        assert make_row(TINY, "val", index) == row
        assert frames.shape == (24, 56, 56, 3) and frames.dtype == np.uint8
        # Jitter and noise: no two consecutive frames are identical.
        assert all((frames[t] != frames[t + 1]).any() for t in range(len(frames) - 1))


def _nearest_color(rgb: np.ndarray) -> str:
    names = list(PALETTE)
    distances = [np.linalg.norm(rgb - np.array(PALETTE[name])) for name in names]
    return names[int(np.argmin(distances))]


def test_decoded_video_shows_the_stated_scenes() -> None:
    size = TINY.size
    for index in range(6):
        key, mp4, obj = encode_sample(TINY, "test", index)
        video = decode_video(mp4, num_frames=TINY.num_frames, max_pixels=size * size)
        assert video.frames.shape[1:] == (size, size, 3) and video.total_num_frames == TINY.num_frames
        assert video.fps == pytest.approx(TINY.fps)
        timestamps = np.array(video.timestamps)
        for scene in obj["scenes"]:
            frame = video.frames[int(np.argmin(np.abs(timestamps - (scene["start_s"] + scene["end_s"]) / 2)))]
            corner = np.median(frame[:3, :3].reshape(-1, 3), axis=0)
            assert _nearest_color(corner) == scene["color"], (key, scene, corner)
            assert np.abs(corner - PALETTE[scene["color"]]).max() < 30
            # The square is centred: the share of white pixels tells its size.
            white = (frame.min(axis=-1) > 200).mean()
            side = TINY.square_side(scene["square_size"]) / size
            assert abs(white - side * side) < 0.06, (key, scene, white)


def test_same_seed_same_bytes_other_seed_differs() -> None:
    for index in (0, 1):
        key, mp4, obj = encode_sample(TINY, "train", index)
        key2, mp4_again, obj_again = encode_sample(TINY, "train", index)
        assert key == key2
        assert json.dumps(obj) == json.dumps(obj_again)
        assert mp4 == mp4_again
    other = SynthConfig(**{**TINY.to_json(), "seed": 1})
    assert make_sample(TINY, "train", 0)[1].tobytes() != make_sample(other, "train", 0)[1].tobytes()
    assert encode_sample(TINY, "train", 0)[1] != encode_sample(other, "train", 0)[1]
    assert [make_row(TINY, "train", i).to_json() for i in range(8)] != [
        make_row(other, "train", i).to_json() for i in range(8)
    ]


def test_samples_do_not_depend_on_split_size_or_order() -> None:
    forward = [make_row(TINY, "train", i) for i in range(6)]
    assert [make_row(TINY, "train", i) for i in reversed(range(6))][::-1] == forward
    assert make_row(TINY, "val", 0).extra != make_row(TINY, "train", 0).extra


def test_long_video_plans_and_renders() -> None:
    config = SynthConfig(num_frames=1200, size=28, fps=1.0)
    row, frames = make_sample(config, "train", 1)
    assert frames.shape == (1200, 28, 28, 3)
    assert _scenes(row)[-1]["end_frame"] == 1200
    assert all(s["end_frame"] - s["start_frame"] >= 150 for s in _scenes(row))
    assert row.category == "Goal and Purpose" and "At 20:00 " in row.reasoning  # 1200 s cited as mm:ss


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 57}, "even side"),
        ({"size": 26}, "at least 28"),
        ({"num_frames": 6, "max_scenes": 4}, "too few"),
        ({"min_scenes": 0}, "at least 1 scene"),
        ({"min_scenes": 3, "max_scenes": 2}, "below min_scenes"),
        ({"max_scenes": 5}, "distinct colours"),
        ({"jitter_px": 10}, "inside the frame"),
        ({"fps": 0.0}, "fps"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SynthConfig(**kwargs)


def test_palette_is_well_separated() -> None:
    colors = np.array(list(PALETTE.values()), dtype=float)
    pairwise = np.linalg.norm(colors[:, None] - colors[None], axis=-1)
    assert pairwise[~np.eye(len(colors), dtype=bool)].min() > 90
    assert np.linalg.norm(colors - 255, axis=-1).min() > 140  # far from the white square


def test_parallel_rendering_yields_the_same_samples_in_order() -> None:
    serial = list(encoded_samples(TINY, "val", 5))
    assert list(encoded_samples(TINY, "val", 5, workers=2)) == serial  # the mp4 bytes too


def test_the_same_frames_encode_to_the_same_bytes_every_time() -> None:
    """With x264's macroblock-tree rate control on, the demo's test sample 34 (its default
    config) encoded to two different byte strings in 12 encodes in one process, in each of four
    runs, and two demo data builds differed in 80 of 2,400 videos (bench/results/demo/
    data-builds.json); encoded again and again, and in worker processes, it must not vary."""
    config = SynthConfig()
    _, frames = make_sample(config, "test", 34)
    encodings = {encode_mp4(frames, config.fps) for _ in range(12)}
    assert len(encodings) == 1
    in_workers = [mp4 for _, mp4, _ in encoded_samples(config, "test", 36, workers=2)]
    assert in_workers[34] in encodings
