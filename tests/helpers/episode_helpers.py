"""A real video prompt with its source video, and an engine that plays scripted turns, for
tests of tool-use episodes."""

from __future__ import annotations

import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoProcessor

from core.layout import PromptLayout
from core.tool_use.episode import Episode
from core.tool_use.reply import tokenize_reply
from core.tool_use.requests import CALL_CLOSE, FrameBudget, FramePlan, served_text
from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from datamodules.video import decode_frames
from families import ModelFamily, family_of
from models.loading import load_model
from models.vision import encode_videos
from rollout import scripted
from rollout.base import Completion, RolloutRequest, RolloutResult, SamplingConfig, TurnRequest
from rollout.episodes import EpisodeVideo, FrameTool

MAX_PIXELS = 56 * 56
REQUEST = (
    '<think>look</think>\n<tool_call>\n{{"name": "get_frames", "arguments": {{"start": {}, "end": {}}}}}\n'
)


@dataclass
class VideoPrompt:
    """One synthetic validation sample as a rollout prompt, with what the tool needs."""

    model: torch.nn.Module
    processor: Any
    family: ModelFamily
    layout: PromptLayout
    video_embeds: torch.Tensor
    """The prompt video's encoding."""
    pixel_values_videos: torch.Tensor
    video_grid_thw: torch.Tensor
    video_bytes: bytes
    source: EpisodeVideo

    def request(self) -> RolloutRequest:
        return RolloutRequest(self.layout, self.layout.encoded_video(self.video_embeds))

    def tool(self, budget: FrameBudget, encode=None, keep_pixels: bool = False) -> FrameTool:
        encode = encode or (lambda pixels, grid: encode_videos(self.model, pixels, grid))
        return FrameTool(budget, self.processor, self.family, encode, keep_pixels=keep_pixels)

    def ids(self, text: str) -> list[int]:
        """``text`` tokenised as the model would write it."""
        return list(self.processor.tokenizer(text, add_special_tokens=False)["input_ids"])

    def request_ids(self, start: float, end: float) -> list[int]:
        """A turn that asks for ``start``-``end`` s, ending with the call's closing tag."""
        return self.ids(REQUEST.format(start, end) + "</tool_call>")

    def served_episode(self, frame_indices: tuple[int, ...]) -> tuple[Episode, torch.Tensor, torch.Tensor]:
        """An episode of one request whose reply holds ``frame_indices`` (no last turn yet),
        with the segment's pixel values and grid."""
        plan = FramePlan(frame_indices, self.source.source_fps)
        frames = self.source.read(frame_indices)
        inputs = tokenize_reply(self.processor, self.family, served_text(plan), (plan, frames))
        assert inputs.pixel_values_videos is not None and inputs.video_grid_thw is not None
        grid = inputs.video_grid_thw.reshape(1, 3)
        with torch.no_grad():
            (embeds,) = encode_videos(self.model, inputs.pixel_values_videos, grid)
        episode = Episode(self.layout)
        turn = self.request_ids(frame_indices[0] / plan.source_fps, frame_indices[-1] / plan.source_fps)
        episode.add_turn(turn, [0.0] * len(turn), "stop")
        episode.add_reply(inputs.reply(embeds))
        return episode, inputs.pixel_values_videos, grid


def video_prompt(model_dir: Path, synth_dir: Path, model: torch.nn.Module | None = None) -> VideoPrompt:
    """The first validation sample of ``synth_dir`` (8 frames) as a prompt for ``model_dir``."""
    processor = AutoProcessor.from_pretrained(model_dir)
    model = model if model is not None else load_model(model_dir)
    family = family_of(model.config)
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=MAX_PIXELS)
    sample = next(iter(stream))
    batch = VideoQACollator(processor, family=family)([sample])
    with torch.no_grad():
        (embeds,) = encode_videos(model, batch["pixel_values_videos"], batch["video_grid_thw"])
    with tarfile.open(sample.shard) as tar:
        member = next(m for m in tar.getmembers() if m.name == f"{sample.key}.mp4")
        video_bytes = tar.extractfile(member).read()

    def read(indices) -> Any:
        return decode_frames(video_bytes, indices, MAX_PIXELS).frames

    source = EpisodeVideo(sample.key, sample.video.fps, sample.video.total_num_frames, read)
    return VideoPrompt(
        model,
        processor,
        family,
        batch["prompts"][0],
        embeds,
        batch["pixel_values_videos"],
        batch["video_grid_thw"],
        video_bytes,
        source,
    )


class ScriptedEngine(scripted.ScriptedEngine):
    """The project's scripted engine (log-prob -0.5 a token), checking that it is asked as an
    episode runner should ask (the request's closing tag a stop token, one completion per script)
    and recording each turn call's prompts, seed and stop tokens."""

    def __init__(self, scripts: list[list[list[int]]]) -> None:
        super().__init__(scripts, logprob=-0.5)
        self.turn_calls: list[tuple[list[list[int]], int | None, tuple[str, ...]]] = []

    def generate(self, requests: Sequence[RolloutRequest], sampling: SamplingConfig) -> list[RolloutResult]:
        assert CALL_CLOSE in sampling.stop_tokens and sampling.n == len(self.scripts)
        return super().generate(requests, sampling)

    def generate_turns(self, requests: Sequence[TurnRequest], sampling: SamplingConfig) -> list[Completion]:
        self.turn_calls.append(
            ([r.episode.engine_prompt() for r in requests], sampling.seed, sampling.stop_tokens)
        )
        return super().generate_turns(requests, sampling)
