"""Frame requests: the syntax, every rejection, and which frames a request gets (by hand)."""

from __future__ import annotations

import json
import random

import pytest

from core.tool_use.requests import (
    BAD_ARGUMENTS,
    EMPTY_SPAN,
    MALFORMED,
    NO_FRAMES_LEFT,
    OUTSIDE_VIDEO,
    REJECT_REASONS,
    TOO_MANY_CALLS,
    UNKNOWN_TOOL,
    EpisodeFrames,
    FrameBudget,
    FramePlan,
    FramesRequest,
    RequestRejected,
    parse_request,
    plan_frames,
    rejected_text,
    request_body,
    served_text,
)

BUDGET = FrameBudget(max_calls=2, frames_per_call=16, frames_per_episode=20, default_fps=0.5)


def call(**arguments: object) -> str:
    return json.dumps({"name": "get_frames", "arguments": arguments})


def test_a_request_takes_seconds_or_clock_times_and_a_default_rate() -> None:
    assert parse_request(call(start=12, end=30.5, fps=2), BUDGET) == FramesRequest(12.0, 30.5, 2.0)
    assert parse_request(call(start="01:05", end="1:00:02.5"), BUDGET) == FramesRequest(65.0, 3602.5, 0.5)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("get_frames 10 20", MALFORMED),
        ("[1, 2]", MALFORMED),
        ('{"name": "get_frames", "arguments": {"start": 1, "end": 2}, "extra": 1}', MALFORMED),
        ('{"name": "get_frames", "arguments": [1, 2]}', MALFORMED),
        ("[" * 1500, MALFORMED),  # nesting past the parser's recursion limit
        ("x" * 3000, MALFORMED),
        ('{"name": "crop_video", "arguments": {"start": 1, "end": 2}}', UNKNOWN_TOOL),
        ('{"name": ["get_frames"], "arguments": {}}', UNKNOWN_TOOL),
        (call(start=1), BAD_ARGUMENTS),
        (call(start=1, end=2, speed=3), BAD_ARGUMENTS),
        (call(start=True, end=2), BAD_ARGUMENTS),
        (call(start=-1, end=2), BAD_ARGUMENTS),
        (call(start="01:75", end="02:00"), BAD_ARGUMENTS),
        (call(start="1:60:00", end="2:00:00"), BAD_ARGUMENTS),
        (call(start="ten", end=20), BAD_ARGUMENTS),
        ('{"name": "get_frames", "arguments": {"start": NaN, "end": 2}}', BAD_ARGUMENTS),
        ('{"name": "get_frames", "arguments": {"start": 1, "end": 1e999}}', BAD_ARGUMENTS),
        (call(start=1, end=2, fps=0), BAD_ARGUMENTS),
        (call(start=1, end=2, fps="2"), BAD_ARGUMENTS),
        (call(start=1, end=2, fps=False), BAD_ARGUMENTS),
        (call(start=20, end=20), EMPTY_SPAN),
        (call(start="00:30", end=10), EMPTY_SPAN),
    ],
)
def test_each_bad_request_is_rejected_with_its_reason(body: str, reason: str) -> None:
    with pytest.raises(RequestRejected) as caught:
        parse_request(body, BUDGET)
    assert caught.value.reason == reason
    assert rejected_text(caught.value).startswith(f"no frames ({reason}): ")


def test_any_text_is_a_request_or_a_named_rejection() -> None:
    alphabet = '{}[]":,0123456789.-eE ntrufalsNIget_frames\\\x00é\n'
    rng = random.Random(0)
    seen = set()
    for _ in range(3000):
        body = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        for text in (body, call(start=body, end=body), '{"name": "get_frames", "arguments": {' + body + "}}"):
            try:
                request = parse_request(text, BUDGET)
            except RequestRejected as rejected:
                assert rejected.reason in REJECT_REASONS
                seen.add(rejected.reason)
            else:
                assert 0 <= request.start < request.end and request.fps > 0
    assert {MALFORMED, BAD_ARGUMENTS} <= seen


def test_the_request_is_the_last_call_a_turn_ends_with() -> None:
    assert request_body('<think>look</think>\n<tool_call>\n{"a": 1}\n</tool_call>\n') == '{"a": 1}'
    assert request_body("<tool_call>old</tool_call> then <tool_call> new </tool_call>") == "new"
    assert request_body("<answer>B</answer>") is None
    assert request_body("<tool_call>unfinished") is None
    assert request_body("no opening tag</tool_call>") == ""


def test_frames_are_every_step_source_frames_in_the_span() -> None:
    # 30 fps, 40 s: 10-20 s at 2 fps is every 15th frame from frame 300, 20 frames.
    plan = plan_frames(FramesRequest(10, 20, 2), source_fps=30, num_frames=1200, frames_allowed=32)
    assert plan.frame_indices == tuple(range(300, 600, 15))
    assert plan.timestamps[:3] == (10.0, 10.5, 11.0) and plan.interval == 0.5
    # The same span with 16 frames allowed: every ceil(300 / 16) = 19th frame, the span kept.
    thinned = plan_frames(FramesRequest(10, 20, 2), source_fps=30, num_frames=1200, frames_allowed=16)
    assert thinned.frame_indices == tuple(range(300, 600, 19)) and len(thinned.frame_indices) == 16
    assert thinned.frame_indices[-1] == 585
    # Faster than the source: every frame. A start between frames: the next frame.
    dense = plan_frames(FramesRequest(1.01, 1.1, 100), source_fps=30, num_frames=1200, frames_allowed=32)
    assert dense.frame_indices == (31, 32)


def test_a_span_past_the_end_is_cut_to_the_video_and_one_outside_is_rejected() -> None:
    plan = plan_frames(FramesRequest(38, 50, 1), source_fps=30, num_frames=1200, frames_allowed=32)
    assert plan.frame_indices == (1140, 1170)
    assert served_text(plan) == "frames 00:38.0-00:39.0, 2 frames, 1.00 s apart"
    with pytest.raises(RequestRejected) as caught:
        plan_frames(FramesRequest(40, 50, 1), source_fps=30, num_frames=1200, frames_allowed=32)
    assert caught.value.reason == OUTSIDE_VIDEO


def test_the_episode_budget_counts_calls_and_frames() -> None:
    episode = EpisodeFrames(BUDGET)
    first = episode.serve(call(start=0, end=100, fps=1), source_fps=1, num_frames=200)
    # 100 frames into at most 16 (frames_per_call): every ceil(100 / 16) = 7th, 15 frames.
    assert first.frame_indices == tuple(range(0, 100, 7)) and len(first.frame_indices) == 15
    second = episode.serve(call(start=100, end=200, fps=1), source_fps=1, num_frames=200)
    assert second.frame_indices == (100, 120, 140, 160, 180)  # the 5 left of frames_per_episode
    with pytest.raises(RequestRejected) as caught:
        episode.serve(call(start=0, end=1), source_fps=1, num_frames=200)
    assert caught.value.reason == TOO_MANY_CALLS
    assert (episode.calls, episode.frames) == (3, 20)


def test_bad_requests_spend_calls_but_not_frames_and_a_spent_budget_is_named() -> None:
    episode = EpisodeFrames(FrameBudget(max_calls=3, frames_per_call=8, frames_per_episode=8))
    with pytest.raises(RequestRejected):
        episode.serve("{", source_fps=1, num_frames=100)
    assert (episode.calls, episode.frames) == (1, 0)
    episode.serve(call(start=0, end=50), source_fps=1, num_frames=100)
    with pytest.raises(RequestRejected) as caught:
        episode.serve(call(start=60, end=70), source_fps=1, num_frames=100)
    assert caught.value.reason == NO_FRAMES_LEFT


def test_one_frame_has_the_source_spacing() -> None:
    plan = FramePlan((5,), source_fps=25.0)
    assert plan.interval == 0.04 and served_text(plan) == "frames 00:00.2-00:00.2, 1 frame, 0.04 s apart"


@pytest.mark.parametrize(
    "bad", [{"max_calls": -1}, {"frames_per_call": 0}, {"frames_per_episode": 0}, {"default_fps": 0.0}]
)
def test_a_budget_that_cannot_serve_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        FrameBudget(**bad)
