"""Multi-turn tool-use rollouts: the model asks for the frames it needs, the tool serves them.

For each prompt the engine samples G first turns (one prefill of the prompt, as for single-turn
rollouts) with ``</tool_call>`` as a stop token. Then, round by round, every episode whose last
turn ended with a request gets the tool's reply and one more turn from the engine, until no
episode asks any more or the budget's turns are used (``max_calls`` requests, then a reply
saying there are no more, then one last turn). Token in, token out: each turn's prompt is the
episode's own tokens so far (:meth:`core.tool_use.episode.Episode.engine_prompt`), never re-tokenised
text.

A request's frames are decoded from the sample's video by its source
(:class:`~core.tool_use.requests.FrameSource`, the datamodule's), tokenised into the reply by the
model's processor and encoded once per step by the trainer's vision tower: a
:class:`SegmentCache` keyed by the video and the frames' source indices serves the same span to
every episode that asks for it, and the trainer's policy and reference passes reuse the same
encodings (``Episode.segments``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from core.tool_use.episode import Episode
from core.tool_use.reply import ReplyInputs, tokenize_reply
from core.tool_use.requests import (
    CALL_CLOSE,
    EpisodeFrames,
    FrameBudget,
    FrameSource,
    RequestRejected,
    rejected_text,
    request_body,
    served_text,
)
from core.tool_use.spans import HIT_COVERAGE, Span, coverage
from core.video import VideoEncoder
from families import ModelFamily
from rollout.base import Completion, RolloutEngine, RolloutRequest, SamplingConfig, TurnRequest


@dataclass(frozen=True)
class EpisodeVideo:
    """A :class:`~core.tool_use.requests.FrameSource` from a decoding function (what tests and
    callers without a datamodule use)."""

    key: str
    source_fps: float
    num_frames: int
    decode: Callable[[Sequence[int]], np.ndarray]

    def read(self, frame_indices: Sequence[int]) -> np.ndarray:
        return self.decode(frame_indices)


def frame_sources(meta: Sequence[dict[str, Any]]) -> list[FrameSource]:
    """Each prompt's frame source from a batch's ``meta`` (the datamodule's, with ``tool_use``)."""
    sources = [sample.get("frame_source") for sample in meta]
    if any(source is None for source in sources):
        raise ValueError(
            "tool-use episodes read the frames a model asks for from each sample's video, but the batch "
            "does not carry it: set data.init_args.tool_use: true"
        )
    return sources  # type: ignore[return-value]


def given_turns_of(meta: Sequence[dict[str, Any]], tokenizer: Any) -> list[list[int] | None] | None:
    """Each prompt's given first turn (``meta["given_turn"]``, the datamodule's with
    ``tool_given_request``) as token ids, None where a prompt has none; None when no prompt has one."""
    texts = [sample.get("given_turn") for sample in meta]
    if not any(texts):
        return None
    return [list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else None for text in texts]


@dataclass
class SegmentCache:
    """Served segments of one rollout step, tokenised and encoded once each."""

    entries: dict[tuple[str, tuple[int, ...]], tuple[ReplyInputs, torch.Tensor]] = field(default_factory=dict)
    hits: int = 0
    encoded_frames: int = 0


@dataclass
class FrameTool:
    """The frames tool of a rollout: its budget and what it needs of the model."""

    budget: FrameBudget
    processor: Any
    family: ModelFamily
    encode: VideoEncoder
    """The trainer's vision tower: ``(pixel_values_videos, video_grid_thw) -> one encoding per video``."""
    keep_pixels: bool = False
    """Keep the served frames' pixel values in the replies (a trainable tower encodes them again
    with grad in the policy pass); otherwise they are dropped once encoded."""

    def reply(
        self, body: str, state: EpisodeFrames, video: FrameSource, cache: SegmentCache
    ) -> tuple[ReplyInputs, torch.Tensor | None, str | None]:
        """The reply to the request ``body``: its inputs, its segment's encoding (None for a
        rejection) and the rejection's reason (None when served)."""
        try:
            plan = state.serve(body, source_fps=video.source_fps, num_frames=video.num_frames)
        except RequestRejected as rejected:
            return self._rejection(rejected)
        key = (video.key, plan.frame_indices)
        if key in cache.entries:
            cache.hits += 1
        else:
            try:
                frames = video.read(plan.frame_indices)
            except RequestRejected as rejected:  # the source could not decode them
                state.unserve()  # nothing was served
                return self._rejection(rejected)
            inputs = tokenize_reply(self.processor, self.family, served_text(plan), (plan, frames))
            assert inputs.pixel_values_videos is not None and inputs.video_grid_thw is not None
            with torch.no_grad():
                (embeds,) = self.encode(inputs.pixel_values_videos, inputs.video_grid_thw.reshape(1, 3))
            if not self.keep_pixels:  # a frozen tower never reads them again
                inputs = replace(inputs, pixel_values_videos=None)
            cache.entries[key] = (inputs, embeds.detach())
            cache.encoded_frames += len(plan.frame_indices)
        inputs, embeds = cache.entries[key]
        return inputs, embeds, None

    def _rejection(self, rejected: RequestRejected) -> tuple[ReplyInputs, None, str]:
        """The text reply to a request that got no frames, and its reason."""
        return tokenize_reply(self.processor, self.family, rejected_text(rejected)), None, rejected.reason


@dataclass
class EpisodeStats:
    """What the tool did in one rollout step (logged as ``tool/*``)."""

    episodes: int = 0
    requests: int = 0
    """Requests made, answered or not."""
    served_frames: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    unanswered: int = 0
    """Episodes whose last turn was still a request when the turns ran out."""
    cache_hits: int = 0
    encoded_frames: int = 0
    located: int = 0
    """Episodes whose data names the stretch that holds the answer (the zoom task's rows do)."""
    span_hits: int = 0
    """Of those, the episodes whose served spans cover at least half of it (:mod:`core.tool_use.spans`)."""
    span_coverage: float = 0.0
    """Of those, the sum of the shares of it that their served spans cover."""

    def metrics(self) -> dict[str, float]:
        per_episode = max(1, self.episodes)
        out = {
            "tool/requests_per_episode": self.requests / per_episode,
            "tool/frames_per_episode": self.served_frames / per_episode,
            "tool/unanswered_fraction": self.unanswered / per_episode,
            "tool/segment_cache_hits": float(self.cache_hits),
            "tool/encoded_frames": float(self.encoded_frames),
        }
        if self.located:  # where the model looked, the choice RL should improve
            out["tool/span_hit_rate"] = self.span_hits / self.located
            out["tool/span_coverage"] = self.span_coverage / self.located
        out.update(
            {f"tool/rejected_{reason}": float(count) for reason, count in sorted(self.rejected.items())}
        )
        return out


def merged_tool_stats(parts: Sequence[EpisodeStats | None]) -> EpisodeStats | None:
    """The statistics of several rollouts (a step's sampling rounds) together; None without any."""
    present = [part for part in parts if part is not None]
    if not present:
        return None
    merged = EpisodeStats()
    for part in present:
        merged.episodes += part.episodes
        merged.requests += part.requests
        merged.served_frames += part.served_frames
        merged.rejected.update(part.rejected)
        merged.unanswered += part.unanswered
        merged.cache_hits += part.cache_hits
        merged.encoded_frames += part.encoded_frames
        merged.located += part.located
        merged.span_hits += part.span_hits
        merged.span_coverage += part.span_coverage
    return merged


def ends_with_request(episode: Episode, call_close_id: int) -> bool:
    """Whether the episode's last turn stopped at a request (its last token closes a call: a
    reply never ends with one, it ends with the next assistant header)."""
    return bool(episode.token_ids) and episode.token_ids[-1] == call_close_id


Share = Callable[[Sequence[Any], Callable[[list[Any]], list[Any]]], list[Any]]
"""How the engine's calls are made: ``share(items, work)`` returns ``work``'s result for every
item, in order. Alone, ``work(items)``; sequence-parallel peers that hold the same episodes each
sample a part and exchange the turns (:func:`parallel.collectives.share_out`)."""


def alone(items: Sequence[Any], work: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """The :data:`Share` of one process: all the work here."""
    return work(list(items))


def run_episodes(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    videos: Sequence[FrameSource],
    sampling: SamplingConfig,
    tool: FrameTool,
    share: Share = alone,
    given_turns: Sequence[list[int] | None] | None = None,
) -> tuple[list[list[Episode]], EpisodeStats]:
    """``sampling.n`` episodes per request (grouped like the requests), and what the tool did.

    Each round's turns get their own seed (``sampling.seed + round``), so a run is repeatable.
    With a ``share`` over sequence-parallel peers, the engine's calls are split among them and
    every peer then holds every episode: the tool serves the same replies on each, in the same
    order, so ``tool``'s encoder may be a collective of the group (MR-SP's shared encoding).
    ``given_turns``: per request, a first turn written for the model (token ids ending with a
    request; :meth:`core.tool_use.episode.Episode.add_given_turn`), or None to sample it; the request it
    ends with is served as any other, against the same budget.
    """
    if len(videos) != len(requests):
        raise ValueError(f"{len(videos)} source videos for {len(requests)} requests")
    given = list(given_turns) if given_turns is not None else [None] * len(requests)
    if len(given) != len(requests):
        raise ValueError(f"{len(given)} given turns for {len(requests)} requests")
    tokenizer = tool.processor.tokenizer
    call_close = tokenizer.convert_tokens_to_ids(CALL_CLOSE)
    turn_sampling = replace(sampling, stop_tokens=(*sampling.stop_tokens, CALL_CLOSE))
    sampled_first = [r for r, turn in zip(requests, given, strict=True) if turn is None]
    first_turns = iter(share(sampled_first, lambda mine: engine.generate(mine, turn_sampling)))
    groups: list[list[Episode]] = []
    for request, turn in zip(requests, given, strict=True):
        group = []
        if turn is not None:
            if not turn or turn[-1] != call_close:
                raise ValueError("a given turn ends with a request (its call's closing tag)")
            for _ in range(sampling.n):
                episode = Episode(request.layout, rule=tool.family.position_rule)
                episode.add_given_turn(turn)
                group.append(episode)
        else:
            for completion in next(first_turns).completions:
                episode = Episode(request.layout, rule=tool.family.position_rule)
                episode.add_turn(completion.token_ids, completion.logprobs, completion.finish_reason)
                group.append(episode)
        groups.append(group)
    states = [[EpisodeFrames(tool.budget) for _ in group] for group in groups]
    stats = EpisodeStats(episodes=sum(len(g) for g in groups))
    cache = SegmentCache()
    # A request per call, then one past the budget (answered "too many"), then the last turn.
    for round_index in range(1, tool.budget.max_calls + 2):
        pending = [
            (g, e)
            for g, group in enumerate(groups)
            for e, episode in enumerate(group)
            if ends_with_request(episode, call_close)
        ]
        if not pending:
            break
        turns = []
        for g, e in pending:
            episode = groups[g][e]
            body = _last_request(episode, tokenizer)
            inputs, embeds, reason = tool.reply(body, states[g][e], videos[g], cache)
            stats.requests += 1
            if reason is not None:
                stats.rejected[reason] += 1
            episode.add_reply(inputs.reply(embeds))
            episode.served_frames = states[g][e].frames
            episode.served_spans = [plan.span for plan in states[g][e].served]
            turns.append(TurnRequest(episode, requests[g].video))
        seed = None if sampling.seed is None else sampling.seed + round_index
        round_sampling = replace(turn_sampling, seed=seed)
        completions = share(turns, lambda mine, s=round_sampling: engine.generate_turns(mine, s))
        for (g, e), completion in zip(pending, completions, strict=True):
            groups[g][e].add_turn(completion.token_ids, completion.logprobs, completion.finish_reason)
    stats.served_frames = sum(state.frames for row in states for state in row)
    stats.unanswered = sum(ends_with_request(e, call_close) for group in groups for e in group)
    stats.requests += stats.unanswered  # asked too, when no turn was left to answer
    stats.cache_hits, stats.encoded_frames = cache.hits, cache.encoded_frames
    return groups, stats


def _last_turn(episode: Episode) -> list[int]:
    """The tokens of the episode's last turn (the trailing run of sampled tokens; the given
    turn of an episode that has no sampled turn yet)."""
    if episode.turns == 0:
        return episode.token_ids[: episode.given]
    start = len(episode.sampled)
    while start > 0 and episode.sampled[start - 1]:
        start -= 1
    return episode.token_ids[start:]


def _last_request(episode: Episode, tokenizer: Any) -> str:
    """The body of the request the episode's last turn ends with (the turn's own tokens decoded)."""
    body = request_body(tokenizer.decode(_last_turn(episode), skip_special_tokens=False))
    return body if body is not None else ""


@dataclass
class EpisodeRollouts:
    """A rollout step's episodes, with what rewards and logs read of each."""

    groups: list[list[Episode]]
    """``sampling.n`` episodes per prompt."""
    completions: list[Completion]
    """Per episode (prompt-major): what the model wrote, all turns' tokens and log-probs, and its
    last turn's text (the answer that rewards read)."""
    requests: list[int]
    """Per episode: the requests it made (answered or not)."""
    stats: EpisodeStats

    @property
    def episodes(self) -> list[Episode]:
        return [episode for group in self.groups for episode in group]


def episode_rollouts(
    engine: RolloutEngine,
    requests: Sequence[RolloutRequest],
    videos: Sequence[FrameSource],
    sampling: SamplingConfig,
    tool: FrameTool,
    share: Share = alone,
    given_turns: Sequence[list[int] | None] | None = None,
    relevant_spans: Sequence[Span | None] | None = None,
) -> EpisodeRollouts:
    """:func:`run_episodes`, with each episode summarised for the rewards; with
    ``relevant_spans`` (per request, the stretch that holds its answer, or None where the data
    does not say), the stats also count where the episodes looked."""
    groups, stats = run_episodes(engine, requests, videos, sampling, tool, share, given_turns)
    if relevant_spans is not None:
        count_where_they_looked(stats, groups, relevant_spans)
    tokenizer = tool.processor.tokenizer
    call_close = tokenizer.convert_tokens_to_ids(CALL_CLOSE)
    completions, counts = [], []
    for episode in (e for group in groups for e in group):
        sampled = [i for i, s in enumerate(episode.sampled) if s]
        text = tokenizer.decode(_last_turn(episode), skip_special_tokens=True)
        completions.append(
            Completion(
                [episode.token_ids[i] for i in sampled],
                [episode.logprobs[i] for i in sampled],
                text,
                episode.finish_reason,
            )
        )
        counts.append(episode.replies + int(ends_with_request(episode, call_close)))
    return EpisodeRollouts(groups, completions, counts, stats)


def count_where_they_looked(
    stats: EpisodeStats, groups: Sequence[Sequence[Episode]], relevant_spans: Sequence[Span | None]
) -> None:
    """Add to ``stats`` the span hits and coverage of each group's episodes against its request's
    relevant stretch (groups without one are not counted)."""
    for group, relevant in zip(groups, relevant_spans, strict=True):
        if relevant is None:
            continue
        for episode in group:
            share = coverage(episode.served_spans, relevant)
            stats.located += 1
            stats.span_hits += share >= HIT_COVERAGE
            stats.span_coverage += share
