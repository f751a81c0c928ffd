"""A tool-use episode: the prompt, then turns the engine sampled and replies the tool wrote.

An episode grows turn by turn: the engine samples an assistant turn (its tokens carry log-probs
and are trained), and when the turn ends with a frame request the tool appends a reply (a user
turn holding the frames as a video segment, and the next assistant header: tokens the model
reads but did not write, so they carry no log-prob and are masked from the loss). The episode
keeps both forms of every token the tool wrote:

- **expanded** (one placeholder per visual token, the form the trainer scores and positions are
  computed on), and
- **as the chat template wrote it** (one placeholder per video, the form an engine that expands
  videos itself is given: vLLM), so the next turn's prompt is exactly the tokens so far, never
  re-tokenised text.

Positions follow :mod:`core.positions` over the whole sequence: a segment is one more video, so
its temporal positions advance with its frames' true spacing (``second_per_grid`` is the
frames' real interval times the temporal patch size), measured from where the segment starts,
and the text after it continues one past the largest position, the rule vLLM applies to the
same tokens. The segment's place in the source video is written in the reply's text (and, for
Qwen3-VL, before each frame by its processor): the position rule of every Qwen-VL family counts
a video's time from its own first frame, in vLLM as in transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from core.layout import PositionRule, PromptLayout, ScoringBatch, pad_rows
from core.placeholders import collapse_video_placeholders
from core.positions import mrope_positions_1d
from core.video import VideoEmbedding


@dataclass
class ToolReply:
    """What the tool appends after a request: a reply turn and the next assistant header."""

    token_ids: list[int]
    """Expanded: one placeholder per visual token of ``video``."""
    video_slots: list[bool]
    """True at ``video``'s placeholders."""
    video: VideoEmbedding | None
    """The served frames, encoded (None: the request was rejected; the reply is text only)."""
    template_ids: list[int] | None = None
    """The reply as the chat template wrote it, when collapsing the placeholders does not give it
    back (Qwen3-VL writes timestamps between frames); None: collapse ``token_ids``."""
    pixel_values_videos: torch.Tensor | None = None
    """The served frames as the vision tower takes them (kept for a trainable tower, which
    encodes them again with grad in the policy pass); None: not kept, or no video."""

    def __post_init__(self) -> None:
        if len(self.video_slots) != len(self.token_ids):
            raise ValueError("video_slots must mark every token of the reply")
        if any(self.video_slots) != (self.video is not None):
            raise ValueError("a reply has video placeholders exactly when it holds a video")

    def engine_ids(self) -> list[int]:
        if self.template_ids is not None:
            return list(self.template_ids)
        return collapse_video_placeholders(self.token_ids, self.video_slots)


@dataclass
class Episode:
    """One multi-turn rollout of ``prompt``: every token after it, in order."""

    prompt: PromptLayout
    rule: PositionRule | None = None
    """The model's position rule (what :meth:`positions` uses when given none)."""
    token_ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    """True where the engine sampled the token (it has a log-prob and is trained)."""
    logprobs: list[float] = field(default_factory=list)
    """The engine's log-prob of each token (0.0 where the tool wrote it)."""
    video_slots: list[bool] = field(default_factory=list)
    """True at the placeholders of the tool's video segments."""
    segments: list[VideoEmbedding] = field(default_factory=list)
    """The tool's video segments, encoded, in order."""
    segment_pixels: list[torch.Tensor | None] = field(default_factory=list)
    """Each segment's pixel values (:attr:`ToolReply.pixel_values_videos`), in order."""
    engine_ids: list[int] = field(default_factory=list)
    """The tokens after the prompt as an engine that expands videos itself is given them."""
    turns: int = 0
    """Assistant turns sampled so far."""
    turn_lengths: list[int] = field(default_factory=list)
    """Tokens of each sampled turn, in order (each turn has the engine's ``max_new_tokens``)."""
    replies: int = 0
    """Tool replies so far (one per request answered, served or not)."""
    given: int = 0
    """Tokens of a turn written for the model at the episode's start (:meth:`add_given_turn`)."""
    served_frames: int = 0
    """Source frames the replies held, all together."""
    served_spans: list[tuple[float, float]] = field(default_factory=list)
    """The stretch of the video each served reply samples, in seconds, in order
    (:attr:`core.tool_use.requests.FramePlan.span`)."""
    finish_reason: str = ""
    """How the last turn ended: ``stop`` (end of turn or a request) or ``length``."""

    def add_turn(self, token_ids: Sequence[int], logprobs: Sequence[float], finish_reason: str) -> None:
        """Append an assistant turn the engine sampled."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} log-probs")
        self.token_ids += token_ids
        self.sampled += [True] * len(token_ids)
        self.logprobs += [float(x) for x in logprobs]
        self.video_slots += [False] * len(token_ids)
        self.engine_ids += token_ids
        self.turns += 1
        self.turn_lengths.append(len(token_ids))
        self.finish_reason = finish_reason

    def add_given_turn(self, token_ids: Sequence[int]) -> None:
        """Start the episode with an assistant turn written for the model (a request given with
        the question, as the oracle-crop baseline gives the right one): in its place in the
        sequence, but neither sampled nor trained."""
        if self.token_ids:
            raise ValueError("a given turn starts an episode")
        self.token_ids += token_ids
        self.sampled += [False] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        self.video_slots += [False] * len(token_ids)
        self.engine_ids += token_ids
        self.given = len(token_ids)

    def add_reply(self, reply: ToolReply) -> None:
        """Append the tool's reply (read by the model, not trained)."""
        self.token_ids += reply.token_ids
        self.sampled += [False] * len(reply.token_ids)
        self.logprobs += [0.0] * len(reply.token_ids)
        self.video_slots += reply.video_slots
        self.engine_ids += reply.engine_ids()
        if reply.video is not None:
            self.segments.append(reply.video)
            self.segment_pixels.append(reply.pixel_values_videos)
        self.replies += 1

    def __len__(self) -> int:
        """Tokens after the prompt."""
        return len(self.token_ids)

    def segment_inputs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each segment's ``(pixel_values_videos, grid_thw)``, in order: what a trainable vision
        tower encodes again with grad."""
        inputs = []
        for segment, pixels in zip(self.segments, self.segment_pixels, strict=True):
            if pixels is None:
                raise ValueError(
                    "a segment's pixel values were not kept (FrameTool.keep_pixels): "
                    "it cannot be encoded again"
                )
            inputs.append((pixels, segment.grid_thw))
        return inputs

    @property
    def sampled_ids(self) -> list[int]:
        """The tokens the model wrote, all turns together (what rewards read)."""
        return [t for t, s in zip(self.token_ids, self.sampled, strict=True) if s]

    def positions(self, rule: PositionRule | None = None) -> torch.Tensor:
        """``(3, len(prompt) + len(self))`` M-RoPE positions of the whole sequence (the prompt's
        video first, then the segments: the order of the sequence's video slots)."""
        rule = rule or self.rule
        if rule is None:
            raise ValueError("an episode's positions need the model's position rule")
        # On the CPU, like the token bookkeeping: the prompt's grid arrives with its batch (on
        # the accelerator), a tool reply's from the processor (on the CPU).
        grids = [v.grid_thw.reshape(3).cpu() for v in self.segments]
        seconds = [v.second_per_grid for v in self.segments]
        if self.prompt.video_grid_thw is not None and self.prompt.second_per_grid is not None:
            grids.insert(0, self.prompt.video_grid_thw.reshape(3).cpu())
            seconds.insert(0, self.prompt.second_per_grid)
        positions, _ = mrope_positions_1d(
            self.prompt.video_slots.tolist() + self.video_slots,
            torch.stack(grids) if grids else torch.zeros(0, 3, dtype=torch.long),
            torch.tensor(seconds, dtype=torch.float32),
            spatial_merge_size=rule.spatial_merge_size,
            tokens_per_second=rule.tokens_per_second,
            temporal=rule.temporal,
        )
        return positions

    def engine_prompt(self) -> list[int]:
        """The next turn's prompt as an engine that expands videos itself is given it."""
        return self.prompt.collapsed_ids() + self.engine_ids


def episode_scoring_batch(
    episodes: Sequence[Episode],
    prompt_of_row: Sequence[int],
    rule: PositionRule | None = None,
    *,
    pad_token_id: int,
    length_multiple: int = 1,
) -> ScoringBatch:
    """Rows ``prompt + everything after it`` of ``episodes``, right-padded, for the scoring passes.

    The row's completion is every token after the prompt; ``completion_mask`` marks the sampled
    ones (the tool's replies are read, not trained), and ``video_mask`` the prompt's and the
    segments' placeholders: the rows' videos are the prompt's then the segments, in order. Rows
    with the same ``prompt_of_row`` must share their prompt (their prompt pass is shared).
    ``rule``: the model's position rule, if the episodes do not carry it.
    """
    if len(prompt_of_row) != len(episodes):
        raise ValueError(f"{len(prompt_of_row)} prompt indices for {len(episodes)} episodes")
    lengths = [len(e.prompt) + len(e) for e in episodes]
    width = -(-max(lengths) // length_multiple) * length_multiple
    rows = len(episodes)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(rows, width, dtype=torch.long)
    video_mask = torch.zeros(rows, width, dtype=torch.bool)
    positions = torch.zeros(3, rows, width, dtype=torch.long)
    for i, episode in enumerate(episodes):
        start, stop = len(episode.prompt), lengths[i]
        input_ids[i, :start] = episode.prompt.token_ids
        input_ids[i, start:stop] = torch.tensor(episode.token_ids, dtype=torch.long)
        attention_mask[i, :stop] = 1
        video_mask[i, :start] = episode.prompt.video_slots
        video_mask[i, start:stop] = torch.tensor(episode.video_slots, dtype=torch.bool)
        positions[:, i, :stop] = episode.positions(rule)
    completion_ids, _ = pad_rows([e.token_ids for e in episodes], torch.long)
    sampled, _ = pad_rows([[float(s) for s in e.sampled] for e in episodes], torch.float32)
    return ScoringBatch(
        input_ids,
        attention_mask,
        video_mask,
        positions,
        [len(e.prompt) for e in episodes],
        completion_ids,
        sampled,
        list(prompt_of_row),
    )
