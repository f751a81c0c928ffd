"""The episode runner's mechanics, with an engine that plays scripted turns: stop at a request,
decode and encode the span once, reply, go on; budgets, bad requests, the loss mask, positions.

The engine here is a script (which turns the model writes is not what is tested); the real
engines run episodes in ``tests/e2e/test_episode_engines.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.episode_helpers import ScriptedEngine, video_prompt

from core.tool_use.requests import CALL_CLOSE, MALFORMED, TOO_MANY_CALLS, FrameBudget
from models.vision import encode_videos
from rollout.base import SamplingConfig
from rollout.episodes import episode_rollouts, merged_tool_stats, run_episodes

BUDGET = FrameBudget(max_calls=1, frames_per_call=4, frames_per_episode=4)


@pytest.fixture(scope="module")
def prompt(tiny_model_dir: Path, synth_dir: Path):
    return video_prompt(tiny_model_dir, synth_dir)


def test_episodes_stop_at_requests_get_replies_and_go_on(prompt) -> None:
    answer = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
    request_a = prompt.ids("<think>a</think>") + prompt.request_ids(1, 5)
    request_b = prompt.ids("<think>b</think>") + prompt.request_ids(1, 5)
    malformed = prompt.ids("<think>c</think><tool_call>oops") + prompt.ids("</tool_call>")
    scripts = [
        [request_a, prompt.request_ids(5, 9), answer],  # served; then one request too many
        [request_b, answer],  # the same span as episode 0: served from the cache
        [malformed, prompt.request_ids(0, 2), prompt.request_ids(0, 2)],  # never answers
        [answer],  # answers at once
    ]
    engine = ScriptedEngine(scripts)
    encodings, reads = [], []

    def encode(pixels: torch.Tensor, grid: torch.Tensor) -> list[torch.Tensor]:
        encodings.append(grid.clone())
        return encode_videos(prompt.model, pixels, grid)

    def read(indices):
        reads.append(tuple(indices))
        return prompt.source.read(indices)

    source = type(prompt.source)(prompt.source.key, prompt.source.source_fps, prompt.source.num_frames, read)
    sampling = SamplingConfig(n=4, max_new_tokens=64, seed=10)
    (group,), stats = run_episodes(
        engine, [prompt.request()], [source], sampling, prompt.tool(BUDGET, encode, keep_pixels=True)
    )

    # Turns per episode as scripted; only the model's turns are sampled (trained) tokens.
    assert [e.turns for e in group] == [3, 2, 3, 1]
    for episode, script in zip(group, scripts, strict=True):
        assert episode.sampled_ids == [t for turn in script[: episode.turns] for t in turn]
        assert sum(episode.sampled) == len(episode.sampled_ids)
    # Frames 1-5 s of a 2 fps video at the default 1 fps: source frames 2, 4, 6, 8, decoded and
    # encoded once although two episodes asked for them.
    assert reads == [(2, 4, 6, 8)] and len(encodings) == 1
    assert group[0].segments[0] is group[1].segments[0] or torch.equal(
        group[0].segments[0].embeds, group[1].segments[0].embeds
    )
    # The served pixels are kept when asked (a trainable tower encodes them again): they encode
    # to the segment, and episodes served the same frames share them.
    ((pixels, grid),) = group[0].segment_inputs()
    assert group[1].segment_inputs()[0][0] is pixels
    with torch.no_grad():
        (again,) = encode_videos(prompt.model, pixels, grid.reshape(1, 3))
    assert torch.equal(again, group[0].segments[0].embeds)
    # Requests: 2 + 1 + 3 (the last one unanswered) + 0.
    assert (stats.requests, stats.served_frames, stats.cache_hits, stats.encoded_frames) == (6, 8, 1, 4)
    assert dict(stats.rejected) == {MALFORMED: 1, TOO_MANY_CALLS: 2}
    assert [e.served_frames for e in group] == [4, 4, 0, 0]
    # Frames at 1, 2, 3 and 4 s, one second apart, sample the stretch 1-5 s.
    assert [e.served_spans for e in group] == [[(1.0, 5.0)], [(1.0, 5.0)], [], []]
    assert stats.unanswered == 1 and group[2].segments == [] and group[3].segments == []
    metrics = stats.metrics()
    assert metrics["tool/requests_per_episode"] == 6 / 4 and metrics["tool/rejected_malformed"] == 1

    # Replies say what happened, in the episode's own tokens.
    tokenizer = prompt.processor.tokenizer
    replies = [
        tokenizer.decode([t for t, s in zip(e.token_ids, e.sampled, strict=True) if not s]) for e in group[:3]
    ]
    assert "frames 00:01.0-00:04.0, 4 frames, 1.00 s apart" in replies[0]
    assert f"no frames ({TOO_MANY_CALLS})" in replies[0] and f"no frames ({MALFORMED})" in replies[2]

    # Each round's turns: the episodes' own tokens so far (videos collapsed), the round's seed.
    (first_prompts, first_seed, stops), (second_prompts, second_seed, _) = engine.turn_calls
    assert first_seed == 11 and second_seed == 12 and CALL_CLOSE in stops
    assert len(first_prompts) == 3 and len(second_prompts) == 2
    video_pad = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert first_prompts[0][: len(prompt.layout.collapsed_ids())] == prompt.layout.collapsed_ids()
    assert first_prompts[0].count(video_pad) == 2  # the prompt's video and the segment, one each

    # The segment's temporal positions follow its frames' times: patches of 2 frames at 1 and 3 s.
    rule = prompt.family.position_rule
    positions = group[0].positions(rule)
    slots = torch.tensor(prompt.layout.video_slots.tolist() + group[0].video_slots)
    segment_t = positions[0, len(prompt.layout) :][torch.tensor(group[0].video_slots)]
    first = int(segment_t[0])
    assert sorted(set((segment_t - first).tolist())) == [0, int((3.0 - 1.0) * rule.tokens_per_second)]
    assert int(slots.sum()) == len(prompt.layout.video_slots.nonzero()) + len(group[0].segments[0].embeds)


def test_a_frozen_tower_keeps_no_pixel_values(prompt) -> None:
    """Without ``keep_pixels`` (a frozen tower never encodes the frames again) the replies hold
    the encoding only, and asking for the pixels says why there are none."""
    answer = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
    engine = ScriptedEngine([[prompt.request_ids(1, 5), answer]])
    sampling = SamplingConfig(n=1, max_new_tokens=64, seed=0)
    (group,), _ = run_episodes(engine, [prompt.request()], [prompt.source], sampling, prompt.tool(BUDGET))
    assert len(group[0].segments) == 1 and group[0].segment_pixels == [None]
    with pytest.raises(ValueError, match="keep_pixels"):
        group[0].segment_inputs()


def test_frames_the_video_cannot_give_are_a_rejection_and_cost_no_budget(prompt) -> None:
    from core.tool_use.requests import UNREADABLE_FRAMES, RequestRejected
    from rollout.episodes import EpisodeVideo

    def damaged(indices):
        raise RequestRejected(UNREADABLE_FRAMES, "the stream ends before frame 2")

    source = EpisodeVideo(prompt.source.key, prompt.source.source_fps, prompt.source.num_frames, damaged)
    answer = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
    engine = ScriptedEngine([[prompt.request_ids(1, 5), answer], [answer]])
    sampling = SamplingConfig(n=2, max_new_tokens=64, seed=0)
    (group,), stats = run_episodes(engine, [prompt.request()], [source], sampling, prompt.tool(BUDGET))
    assert dict(stats.rejected) == {UNREADABLE_FRAMES: 1} and stats.served_frames == 0
    assert group[0].segments == [] and group[0].served_frames == 0 and group[0].turns == 2
    reply = [t for t, s in zip(group[0].token_ids, group[0].sampled, strict=True) if not s]
    assert f"no frames ({UNREADABLE_FRAMES})" in prompt.processor.tokenizer.decode(reply)


def test_peers_that_share_the_engine_calls_play_the_same_episodes(prompt) -> None:
    """Sequence-parallel peers hold the same prompts: each samples a share of every call (here
    two simulated peers, round robin, as :func:`parallel.collectives.share_out` splits), and the
    merged turns give the episodes one process plays."""
    answer = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
    scripts = [
        [prompt.ids("<think>a</think>") + prompt.request_ids(1, 5), answer],
        [prompt.ids("<think>b</think>") + prompt.request_ids(5, 9), answer],
        [answer],
    ]
    sampling = SamplingConfig(n=3, max_new_tokens=64, seed=4)
    requests = [prompt.request(), prompt.request()]
    sources = [prompt.source, prompt.source]
    calls: list[int] = []

    def two_peers(items: Sequence[Any], work: Callable[[list[Any]], list[Any]]) -> list[Any]:
        results: list[Any] = [None] * len(items)
        for peer in range(2):
            mine = list(items[peer::2])
            calls.append(len(mine))
            results[peer::2] = work(mine) if mine else []
        return results

    alone, _ = run_episodes(ScriptedEngine(scripts), requests, sources, sampling, prompt.tool(BUDGET))
    shared, stats = run_episodes(
        ScriptedEngine(scripts), requests, sources, sampling, prompt.tool(BUDGET), two_peers
    )
    # First turns: 2 prompts, one each; then the 4 episodes that asked, two each.
    assert calls == [1, 1, 2, 2] and stats.served_frames == 16
    episodes = [
        (ours, theirs) for g, h in zip(shared, alone, strict=True) for ours, theirs in zip(g, h, strict=True)
    ]
    for ours, theirs in episodes:
        assert ours.token_ids == theirs.token_ids and ours.sampled == theirs.sampled
        assert [s.grid_thw.tolist() for s in ours.segments] == [s.grid_thw.tolist() for s in theirs.segments]


def test_scripts_that_begin_alike_are_refused(prompt) -> None:
    """The scripted engine finds an episode's later turns by its first turn: two scripts that
    begin with the same turn could not be told apart."""
    answer = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
    request = prompt.request_ids(1, 5)
    with pytest.raises(ValueError, match="begin with the same turn"):
        ScriptedEngine([[request, answer], [request, answer[:3]]])


def test_several_calls_share_the_episodes_frame_budget(prompt) -> None:
    """Two calls of an episode: the first served whole, the second thinned to the frames left in
    the episode's budget; a third is one too many. A malformed call costs a call, no frames."""
    budget = FrameBudget(max_calls=2, frames_per_call=4, frames_per_episode=6)
    answer = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
    malformed = prompt.ids("<think>c</think><tool_call>oops") + prompt.ids("</tool_call>")
    scripts = [
        [prompt.request_ids(1, 5), prompt.request_ids(5, 9), prompt.request_ids(0, 2), answer],
        [malformed, prompt.request_ids(2, 4), answer],
    ]
    sampling = SamplingConfig(n=2, max_new_tokens=64, seed=0)
    (group,), stats = run_episodes(
        ScriptedEngine(scripts), [prompt.request()], [prompt.source], sampling, prompt.tool(budget)
    )
    assert [e.turns for e in group] == [4, 3] and [e.replies for e in group] == [3, 2]
    # 5-9 s at 1 fps would be 4 frames; 2 are left: 5 and 7 s, 2 s apart, sampling 5-9 s.
    assert group[0].served_spans == [(1.0, 5.0), (5.0, 9.0)] and group[0].served_frames == 6
    assert [len(s.grid_thw) and int(s.grid_thw.reshape(3)[0]) for s in group[0].segments] == [2, 1]
    assert group[1].served_spans == [(2.0, 4.0)] and group[1].served_frames == 2
    assert dict(stats.rejected) == {TOO_MANY_CALLS: 1, MALFORMED: 1} and stats.served_frames == 8
    assert stats.requests == 5 and stats.unanswered == 0


def test_a_given_turn_is_served_and_the_model_writes_what_follows(prompt) -> None:
    """The oracle-crop baseline's episodes: the first request is written for the model (not
    sampled, not trained), served against the budget like any other, and the engine writes the
    next turn from there; prompts without a given turn sample theirs as usual."""
    from rollout.hf_engine import TransformersEngine

    given = prompt.request_ids(1, 5)
    engine = TransformersEngine.for_model(prompt.model, prompt.processor.tokenizer)
    sampling = SamplingConfig(n=2, temperature=1.0, max_new_tokens=8, seed=3)
    requests, sources = [prompt.request(), prompt.request()], [prompt.source, prompt.source]
    groups, stats = run_episodes(
        engine, requests, sources, sampling, prompt.tool(BUDGET), given_turns=[given, None]
    )
    for episode in groups[0]:
        assert episode.token_ids[: len(given)] == given and episode.given == len(given)
        assert not any(episode.sampled[: len(given)])  # neither sampled nor trained
        assert episode.served_spans == [(1.0, 5.0)] and episode.replies == 1
        assert episode.turns >= 1 and episode.sampled[-1]  # the model wrote the turn after the reply
        reply_end = episode.sampled.index(True)
        assert not any(episode.video_slots[: len(given)]) and any(episode.video_slots[len(given) : reply_end])
    assert all(episode.given == 0 and episode.sampled[0] for episode in groups[1])
    assert stats.served_frames >= 8  # both given episodes served their 4 frames
    with pytest.raises(ValueError, match="ends with a request"):
        run_episodes(
            engine, requests[:1], sources[:1], sampling, prompt.tool(BUDGET), given_turns=[given[:-1]]
        )


def test_each_step_counts_where_its_episodes_looked(prompt) -> None:
    """``tool/span_hit_rate`` and ``tool/span_coverage`` against the stretch the data names:
    an episode served 1-5 s covers 3/4 of 2-6 s (a hit: at least half); one that asked nothing
    covers none. Requests whose data names no stretch are not counted."""
    answer = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
    scripts = [[prompt.request_ids(1, 5), answer], [answer]]
    sampling = SamplingConfig(n=2, max_new_tokens=64, seed=3)

    def play(relevant: tuple[float, float] | None):
        return episode_rollouts(
            ScriptedEngine(scripts), [prompt.request()], [prompt.source], sampling, prompt.tool(BUDGET),
            relevant_spans=[relevant],
        ).stats  # fmt: skip

    located = play((2.0, 6.0))
    assert (located.located, located.span_hits, located.span_coverage) == (2, 1, 0.75)
    metrics = located.metrics()
    assert metrics["tool/span_hit_rate"] == 0.5 and metrics["tool/span_coverage"] == 0.375
    unknown = play(None)
    assert unknown.located == 0 and "tool/span_hit_rate" not in unknown.metrics()
    both = merged_tool_stats([located, unknown])
    assert both is not None and (both.episodes, both.located, both.span_hits) == (4, 2, 1)
    assert both.metrics()["tool/span_hit_rate"] == 0.5
