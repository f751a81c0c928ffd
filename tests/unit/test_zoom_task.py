"""The zoom task: answers follow the ground truth, the markers a question needs are missed by a
sparse overview and seen by the tool trace's request, and the videos show what the rows say."""

from __future__ import annotations

import itertools
import json
import tarfile

import numpy as np
import pytest

from core.frame_requests import FrameBudget, parse_request, plan_frames, request_body
from core.qa import CATEGORIES, OPTION_LETTERS
from datamodules.video import decode_frames, decode_video, uniform_frame_indices
from datatools.synthetic import format_timestamp
from datatools.zoom_task import (
    BACKGROUND,
    CORNERS,
    MARKER_COLORS,
    Marker,
    ZoomConfig,
    encode_sample,
    make_row,
    question_of,
    served_markers,
)

CONFIG = ZoomConfig()


def markers_of(row) -> list[dict]:
    return row.extra["zoom"]["markers"]


def seen_fraction(rows, indices: list[int]) -> float:
    """The share of the landmark markers that at least one of ``indices`` falls on."""
    seen = total = 0
    for row in rows:
        for marker in markers_of(row):
            total += 1
            seen += any(
                marker["start_frame"] <= i < marker["start_frame"] + CONFIG.marker_frames for i in indices
            )
    return seen / total


@pytest.fixture(scope="module")
def rows():
    return [make_row(CONFIG, "train", i)[0] for i in range(200)]


def test_answers_follow_the_ground_truth(rows) -> None:
    assert [r.category for r in rows[:4]] == list(CATEGORIES)
    counts = {"Temporal": (2, 3), "Goal and Purpose": (2, 3), "Spatial": (1, 1), "Plot": (0, 3)}
    for row in rows:
        zoom, markers = row.extra["zoom"], markers_of(row)
        low, high = counts[row.category]
        assert low <= len(markers) <= high
        start, end = (int(s * CONFIG.fps) for s in zoom["span_s"])
        assert all(
            start <= m["start_frame"] and m["start_frame"] + CONFIG.marker_frames <= end for m in markers
        )
        starts = [m["start_frame"] for m in markers]
        assert starts == sorted(starts) and all(
            b - a > CONFIG.marker_frames for a, b in itertools.pairwise(starts)
        )
        if row.category in ("Temporal", "Goal and Purpose"):
            assert len({m["color"] for m in markers}) == len(markers)
        assert all(not start <= d["start_frame"] < end for d in zoom["distractors"])
        options, answer = question_of(row.category, [Marker(**m) for m in markers])
        assert row.options == options and row.answer == OPTION_LETTERS[answer]
    letters = [r.answer for r in rows if r.category == "Temporal"]
    assert len(set(letters)) == 4  # every colour comes first somewhere


def test_the_overview_misses_the_markers_and_the_request_sees_each_once(rows) -> None:
    # One second in eight seconds: the 16-frame overview falls on few markers, 64 dense frames
    # (every 2 s) on about half, 256 (every 0.5 s) on all.
    assert seen_fraction(rows, uniform_frame_indices(CONFIG.num_frames, 16)) < 0.25
    assert 0.3 < seen_fraction(rows, uniform_frame_indices(CONFIG.num_frames, 64)) < 0.7
    assert seen_fraction(rows, uniform_frame_indices(CONFIG.num_frames, 256)) == 1.0
    budget = FrameBudget(frames_per_call=16)
    for row in rows:
        trace = row.extra["tool_trace"]
        request = parse_request(request_body(trace["first_turn"]), budget)
        assert (request.start, request.end) == tuple(row.extra["zoom"]["span_s"])
        plan = plan_frames(request, source_fps=CONFIG.fps, num_frames=CONFIG.num_frames, frames_allowed=16)
        assert len(plan.frame_indices) == 16
        seen_in = []
        for marker in markers_of(row):
            hits = [i for i in plan.frame_indices if 0 <= i - marker["start_frame"] < CONFIG.marker_frames]
            assert len(hits) == 1, (row.problem_id, marker)
            seen_in.append(hits)
        # The last turn says what the served frames show, each marker at the time of its frame.
        assert trace["final_reasoning"] == served_markers(CONFIG, row, list(plan.frame_indices))
        for marker, (hit,) in zip(markers_of(row), seen_in, strict=True):
            assert (
                f"{marker['color']} {marker['corner']} at {format_timestamp(hit / CONFIG.fps)}"
                in (trace["final_reasoning"])
            )


def test_generation_is_deterministic() -> None:
    first, second = encode_sample(CONFIG, "val", 5), encode_sample(CONFIG, "val", 5)
    assert first == second
    assert encode_sample(ZoomConfig(seed=1), "val", 5)[1] != first[1]


def test_the_video_shows_the_stretch_and_the_markers() -> None:
    _, video, row = encode_sample(CONFIG, "test", 2)  # a Spatial question: one marker
    zoom = row["zoom"]
    (marker,) = zoom["markers"]
    overview = decode_video(video, 16, max_pixels=56 * 56)
    blue = [
        i
        for i, frame in zip(overview.frame_indices, overview.frames, strict=True)
        if np.abs(frame[20:36, 20:36].reshape(-1, 3).mean(0) - BACKGROUND["blue"]).max() < 12
    ]
    slot = CONFIG.num_frames // CONFIG.slots
    assert blue and all(i // slot == zoom["landmark_slot"] for i in blue)
    start = marker["start_frame"]
    frames = decode_frames(
        video, [start - 1, start, start + CONFIG.marker_frames - 1], max_pixels=56 * 56
    ).frames
    side = CONFIG.marker_side
    y = 0 if marker["corner"].startswith("top") else CONFIG.size - side
    x = 0 if marker["corner"].endswith("left") else CONFIG.size - side
    patch = frames[:, y + 4 : y + side - 4, x + 4 : x + side - 4].reshape(3, -1, 3).mean(1)
    # The frame before the marker shows the background; its first and last frames the marker
    # (yuv420 compression moves flat colours by a few levels, far below the colours' distances).
    assert np.abs(patch[0] - BACKGROUND["blue"]).max() < 20
    assert np.abs(patch[1:] - MARKER_COLORS[marker["color"]]).max() < 20
    assert row["answer"] == f"<answer>{OPTION_LETTERS[CORNERS.index(marker['corner'])]}</answer>"
    assert json.loads(request_body(row["tool_trace"]["first_turn"]))["name"] == "get_frames"


def test_the_command_renders_the_markers_it_is_asked_for(tmp_path) -> None:
    from helpers.cli import lvrl, run_lvrl

    out = tmp_path / "zoom"
    small = ["--frames", "384", "--slots", "8", "--num-train", "0", "--num-val", "3", "--num-test", "0"]
    run_lvrl("data", "zoom", "--out", str(out), "--marker-side", "28", *small)
    config = json.loads((out / "dataset.json").read_text())["config"]
    assert config["marker_side"] == 28 and config["num_frames"] == 384
    with tarfile.open(out / "val-00000.tar") as tar:
        row = json.loads(tar.extractfile("synth-val-000002.json").read())  # Spatial: one marker
        video = tar.extractfile("synth-val-000002.mp4").read()
    (marker,) = row["zoom"]["markers"]
    (frame,) = decode_frames(video, [marker["start_frame"]], max_pixels=56 * 56).frames
    # The marker fills its corner's quadrant: 20 pixels in from its corner (outside the default
    # 16-pixel marker) still has its colour.
    y = 20 if marker["corner"].startswith("top") else 35
    x = 20 if marker["corner"].endswith("left") else 35
    assert np.abs(frame[y, x] - np.array(MARKER_COLORS[marker["color"]])).max() < 20
    refused = lvrl("data", "zoom", "--out", str(tmp_path / "bad"), "--marker-side", "29", *small)
    assert refused.returncode != 0 and "marker_side in [4, size / 2]" in refused.stderr
