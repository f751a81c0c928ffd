"""The zoom task: answers follow the ground truth, the markers a question needs are missed by a
sparse overview and seen by the tool trace's request, and the videos show what the rows say."""

from __future__ import annotations

import itertools
import json
import tarfile

import numpy as np
import pytest

from core.qa import CATEGORIES, OPTION_LETTERS
from core.tool_use.requests import EpisodeFrames, FrameBudget, parse_request, plan_frames, request_body
from datamodules.video import decode_frames, decode_video, uniform_frame_indices
from datatools.synthetic import format_timestamp
from datatools.zoom_task import (
    BACKGROUND,
    FOUND,
    MARKER_COLORS,
    MARKER_SIZES,
    TEMPORAL_PATCH,
    Marker,
    ZoomConfig,
    encode_sample,
    is_given_oracle,
    make_row,
    marker_box,
    question_of,
    request_frames,
    served_markers,
    trace_rng,
)
from families.presets import FAMILIES

CONFIG = ZoomConfig()
ORACLE = ZoomConfig(trace_requests="oracle")


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


@pytest.fixture(scope="module")
def oracle_rows():
    return [make_row(ORACLE, "train", i)[0] for i in range(200)]


def requested_slots(row) -> list[int]:
    return [
        int(r["start_s"] // (CONFIG.slot_frames / CONFIG.fps)) for r in row.extra["tool_trace"]["requests"]
    ]


def test_random_traces_do_not_know_where_to_look(rows) -> None:
    # The stretches a random trace asks for come from a generator of their own: the same for any
    # landmark, and hitting it about as often as chance (1 in 8 for a first request).
    first_hits = 0
    for index, row in enumerate(rows):
        trace, landmark = row.extra["tool_trace"], row.extra["zoom"]["landmark_slot"]
        order = trace_rng(CONFIG, "train", index).permutation(CONFIG.slots).tolist()
        slots = requested_slots(row)
        assert slots == order[: len(slots)] and 1 <= len(slots) <= CONFIG.trace_calls
        assert len(slots) == CONFIG.trace_calls or slots[-1] == landmark  # it stops only at blue
        assert landmark not in slots[:-1]
        # The turns are the requests, and nothing in them locates the blue stretch.
        assert [parse_request(request_body(t), FrameBudget()).start for t in trace["turns"]] == [
            r["start_s"] for r in trace["requests"]
        ]
        assert not any("runs from" in turn for turn in trace["turns"])
        first_hits += slots[0] == landmark
        found = slots[-1] == landmark
        if found:  # it reads what the blue stretch showed and answers the question
            assert trace["answer"] == row.answer
            assert trace["final_reasoning"] == f"{FOUND} " + served_markers(
                CONFIG, row, request_frames(CONFIG, landmark)
            )
        else:  # it says it did not see the stretch, and guesses
            assert (
                "Markers" not in trace["final_reasoning"] and "not in the frames" in trace["final_reasoning"]
            )
    assert 10 <= first_hits <= 45  # 200 draws of 1 in 8: 25 expected (the seed fixes the count)
    guesses = [
        r.extra["tool_trace"]["answer"]
        for r in rows
        if requested_slots(r)[-1] != r.extra["zoom"]["landmark_slot"]
    ]
    assert len(set(guesses)) == 4  # guesses spread over the letters
    assert rows[3].extra["relevant_span_s"] == rows[3].extra["zoom"]["span_s"]


def test_a_random_trace_stays_within_a_budget_of_two_calls_of_16_frames(rows) -> None:
    budget = FrameBudget(max_calls=2, frames_per_call=16, frames_per_episode=32)
    for row in rows:
        state = EpisodeFrames(budget)
        for turn in row.extra["tool_trace"]["turns"]:
            state.serve(request_body(turn), source_fps=CONFIG.fps, num_frames=CONFIG.num_frames)
        assert state.frames == 16 * len(row.extra["tool_trace"]["turns"])


def test_a_given_oracle_share_gives_the_right_request_to_that_share_of_training_rows_only(rows) -> None:
    mixed = ZoomConfig(given_oracle_share=0.5)
    given = 0
    for index, row in enumerate(rows):
        trace = make_row(mixed, "train", index)[0].extra["tool_trace"]
        if not is_given_oracle(mixed, "train", index):
            assert trace == row.extra["tool_trace"]  # the plain random build's trace, unchanged
            continue
        given += 1
        landmark = row.extra["zoom"]["landmark_slot"]
        assert trace["first_turn_given"] is True and requested_slots(make_row(mixed, "train", index)[0]) == [
            landmark
        ]
        # Read as the model's own blue reply would be, and answered right.
        assert trace["final_reasoning"] == f"{FOUND} " + served_markers(
            CONFIG, row, request_frames(CONFIG, landmark)
        )
        assert trace["answer"] == row.answer
    assert 70 <= given <= 130  # 200 draws of 1 in 2 (100 expected; the seed fixes the count)
    for split in ("val", "test"):  # what is validated and reported is never given a request
        assert not any(is_given_oracle(mixed, split, i) for i in range(200))
        assert "first_turn_given" not in make_row(mixed, split, 0)[0].extra["tool_trace"]
    assert not any(is_given_oracle(ZoomConfig(given_oracle_share=0.0), "train", i) for i in range(200))
    assert all(is_given_oracle(ZoomConfig(given_oracle_share=1.0), "train", i) for i in range(200))
    with pytest.raises(ValueError, match="random traces only"):
        ZoomConfig(trace_requests="oracle", given_oracle_share=0.5)
    with pytest.raises(ValueError, match=r"given_oracle_share must be in \[0, 1\]"):
        ZoomConfig(given_oracle_share=1.5)


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
        # On the grid of the request's temporal patches (the stretch's start, every 2 s).
        assert all((s - start) % CONFIG.marker_frames == 0 for s in starts)
        if row.category in ("Temporal", "Goal and Purpose"):
            assert len({m["color"] for m in markers}) == len(markers)
        assert all(not start <= d["start_frame"] < end for d in zoom["distractors"])
        options, answer = question_of(row.category, [Marker(**m) for m in markers])
        assert row.options == options and row.answer == OPTION_LETTERS[answer]
    letters = [r.answer for r in rows if r.category == "Temporal"]
    assert len(set(letters)) == 4  # every colour comes first somewhere


def test_the_overview_misses_the_markers_and_the_request_serves_each_as_one_patch(rows, oracle_rows) -> None:
    # Two seconds in eight: the 16-frame overview falls on few markers (its two frames per
    # stretch land in two of the stretch's eight 2-s cells: about a fifth of the markers, as the
    # markers keep a free cell between them), 32 frames on about half, 64 (every 2 s) on all.
    assert seen_fraction(rows, uniform_frame_indices(CONFIG.num_frames, 16)) <= 0.25
    assert 0.3 < seen_fraction(rows, uniform_frame_indices(CONFIG.num_frames, 32)) < 0.7
    assert seen_fraction(rows, uniform_frame_indices(CONFIG.num_frames, 64)) == 1.0
    budget = FrameBudget(frames_per_call=16)
    for row in oracle_rows:
        trace = row.extra["tool_trace"]
        (turn,) = trace["turns"]
        request = parse_request(request_body(turn), budget)
        assert (request.start, request.end) == tuple(row.extra["zoom"]["span_s"])
        plan = plan_frames(request, source_fps=CONFIG.fps, num_frames=CONFIG.num_frames, frames_allowed=16)
        assert len(plan.frame_indices) == 16
        seen_in = []
        for marker in markers_of(row):
            hits = [
                k
                for k, i in enumerate(plan.frame_indices)
                if 0 <= i - marker["start_frame"] < CONFIG.marker_frames
            ]
            # Both frames of one temporal patch (served frames 2j and 2j + 1): one whole visual token.
            assert len(hits) == 2 and hits[0] % 2 == 0 and hits[1] == hits[0] + 1, (row.problem_id, marker)
            seen_in.append([plan.frame_indices[hits[0]]])
        # The last turn says what the served frames show, each marker at the time of its frame.
        assert trace["final_reasoning"] == served_markers(CONFIG, row, list(plan.frame_indices))
        for marker, (hit,) in zip(markers_of(row), seen_in, strict=True):
            assert (
                f"{marker['color']} {marker['size']} at {format_timestamp(hit / CONFIG.fps)}"
                in (trace["final_reasoning"])
            )


def test_the_reasoning_looks_markers_up_by_colour_then_orders_them_by_time(rows) -> None:
    for row in rows:
        markers = sorted(markers_of(row), key=lambda m: m["start_frame"])
        entries = {
            m["color"]: f"{m['color']} {m['size']} at {format_timestamp(m['start_frame'] / CONFIG.fps)}"
            for m in markers
        }
        listed = ", ".join(entries.get(color, f"{color} none") for color in MARKER_COLORS)
        in_order = ", ".join(m["color"] for m in markers) or "none"
        options, answer = question_of(row.category, [Marker(**m) for m in markers])
        word = {"Temporal": "First", "Goal and Purpose": "Last", "Spatial": "Size", "Plot": "Count"}
        named = f"{word[row.category]}: {options[answer]}."
        assert row.reasoning.endswith(f"Markers by colour: {listed}. In time order: {in_order}. {named}")
    # Every colour order occurs: the order is not a constant the model could learn from the text.
    orders = {tuple(m["color"] for m in sorted(markers_of(r), key=lambda m: m["start_frame"])) for r in rows}
    assert len([o for o in orders if len(o) == 2]) >= 10


def test_patch_times_are_the_processors_own_timestamps(tmp_path) -> None:
    """``listed_times="patch"``: each listed time is, character for character, the ``<t seconds>``
    Qwen3-VL's processor writes before the temporal patch the marker is first served in, for the
    trace's request (the stretch at 1 fps) and for one a second off its grid."""
    import re

    from models.build import build_model_dir
    from models.loading import load_processor

    processor = load_processor(build_model_dir("tiny", tmp_path / "qwen3_vl", seed=0, family="qwen3_vl"))
    config = ZoomConfig(listed_times="patch", trace_requests="oracle")
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "?"}]}]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    checked = 0
    for index in range(8):
        row = make_row(config, "val", index)[0]
        stretch = row.extra["zoom"]["landmark_slot"] * config.slot_frames
        step = round(config.fps / config.request_fps)
        for served in (
            list(range(stretch, stretch + config.slot_frames, step)),
            list(range(stretch + step, stretch + config.slot_frames, step)),
        ):
            metadata = {"fps": config.fps, "total_num_frames": config.num_frames, "frames_indices": served}
            frames = np.zeros((len(served), 64, 64, 3), dtype=np.uint8)
            inputs = processor(text=[prompt], videos=[frames], video_metadata=[metadata], return_tensors="pt")
            stamps = re.findall(r"<([0-9.]+ seconds)>", processor.tokenizer.decode(inputs["input_ids"][0]))
            assert len(stamps) == -(-len(served) // TEMPORAL_PATCH)  # one per patch
            listed = dict(re.findall(r"(\w+) \w+ at ([0-9.]+ seconds)", served_markers(config, row, served)))
            for marker in markers_of(row):
                shown = range(marker["start_frame"], marker["start_frame"] + config.marker_frames)
                first = next(i for i in served if i in shown)
                assert listed[marker["color"]] == stamps[served.index(first) // TEMPORAL_PATCH]
                checked += 1
    assert checked >= 16
    # The dense target writes the patch the trace's request serves; clock readings stay mm:ss.
    row = make_row(config, "val", 0)[0]
    assert row.reasoning.split("Markers")[1] == row.extra["tool_trace"]["final_reasoning"].split("Markers")[1]
    assert make_row(CONFIG, "val", 0)[0].reasoning != row.reasoning
    with pytest.raises(ValueError, match="listed_times"):
        ZoomConfig(listed_times="frames")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_marker_grid_matches_every_familys_temporal_patch(family: str) -> None:
    # The task generator loads no model, so it restates the patch length its grid is built on.
    assert FAMILIES[family].geometry.temporal_patch_size == TEMPORAL_PATCH


def test_generation_is_deterministic() -> None:
    first, second = encode_sample(CONFIG, "val", 5), encode_sample(CONFIG, "val", 5)
    assert first == second
    assert encode_sample(ZoomConfig(seed=1), "val", 5)[1] != first[1]


def test_the_video_shows_the_stretch_and_the_markers() -> None:
    _, video, row = encode_sample(CONFIG, "test", 2)  # a Spatial question: one marker
    zoom = row["zoom"]
    (marker,) = zoom["markers"]
    overview = decode_video(video, 16, max_pixels=56 * 56)
    blue = [  # the frames' corners: no marker reaches them
        i
        for i, frame in zip(overview.frame_indices, overview.frames, strict=True)
        if np.abs(frame[:4, :4].reshape(-1, 3).mean(0) - BACKGROUND["blue"]).max() < 12
    ]
    slot = CONFIG.num_frames // CONFIG.slots
    assert blue and all(i // slot == zoom["landmark_slot"] for i in blue)
    start = marker["start_frame"]
    frames = decode_frames(
        video, [start - 1, start, start + CONFIG.marker_frames - 1], max_pixels=56 * 56
    ).frames
    assert_marker_shown(frames[1:], marker, before=frames[0])
    sizes = list(MARKER_SIZES)
    assert row["answer"] == f"<answer>{OPTION_LETTERS[sizes.index(marker['size'])]}</answer>"
    assert json.loads(request_body(row["tool_trace"]["turns"][0]))["name"] == "get_frames"


def assert_marker_shown(frames: np.ndarray, marker: dict, before: np.ndarray | None = None) -> None:
    """``frames`` show ``marker``: its colour inside its centred box, the blue background just
    outside it (and everywhere in ``before``). yuv420 compression moves flat colours by a few
    levels, far below the colours' distances, but blurs their edges: 3 pixels are left out."""
    low, high = marker_box(CONFIG, marker["size"])
    inside = frames[:, low + 3 : high - 3, low + 3 : high - 3].reshape(len(frames), -1, 3).mean(1)
    assert np.abs(inside - MARKER_COLORS[marker["color"]]).max() < 20
    if low >= 3:  # every size but huge leaves a rim of background
        outside = frames[:, low - 3, CONFIG.size // 2].astype(float)
        assert np.abs(outside - BACKGROUND["blue"]).max() < 20
    if before is not None:
        background = before[low + 3 : high - 3, low + 3 : high - 3].mean((0, 1))
        assert np.abs(background - BACKGROUND["blue"]).max() < 20


def test_the_command_renders_the_task(tmp_path) -> None:
    from helpers.cli import lvrl, run_lvrl

    out = tmp_path / "zoom"
    small = ["--frames", "640", "--slots", "8", "--num-train", "0", "--num-val", "3", "--num-test", "0"]
    run_lvrl("data", "zoom", "--out", str(out), "--listed-times", "patch", *small)
    config = json.loads((out / "dataset.json").read_text())["config"]
    assert config["num_frames"] == 640 and config["slots"] == 8 and config["listed_times"] == "patch"
    with tarfile.open(out / "val-00000.tar") as tar:
        row = json.loads(tar.extractfile("synth-val-000002.json").read())  # Spatial: one marker
        video = tar.extractfile("synth-val-000002.mp4").read()
    (marker,) = row["zoom"]["markers"]
    assert f"at {marker['start_frame'] / config['fps'] + 0.5:.1f} seconds," in row["reasoning"]
    assert_marker_shown(decode_frames(video, [marker["start_frame"]], max_pixels=56 * 56).frames, marker)
    refused = lvrl("data", "zoom", "--out", str(tmp_path / "bad"), "--size", "27", *small)
    assert refused.returncode != 0 and "size must be even and >= 28" in refused.stderr


def test_a_config_reads_back_from_what_it_wrote() -> None:
    config = ZoomConfig(slots=4, num_frames=512, given_oracle_share=0.5, listed_times="patch")
    written = json.loads(json.dumps(config.to_json()))  # as dataset.json keeps it
    assert ZoomConfig.from_json(written) == config
    with pytest.raises(ValueError, match="not a zoom task's config"):
        ZoomConfig.from_json({**written, "task": "synthetic"})
