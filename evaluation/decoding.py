"""A module's answers to a collated batch, decoded the way rollouts decode them.

Validation asks the model being trained for its answers. They are decoded by
:class:`~rollout.hf_engine.TransformersEngine` from each video encoded once, with the position
rule of training and rollout, so evaluation sees the model exactly as the RL stage will (HF
``generate`` would use transformers' own, different rule). With a frame budget the answers are
tool-use episodes (:mod:`rollout.episodes`), the greedy ones recorded with where they looked.

The module itself stays free of the rollout machinery: it offers what decoding needs
(:class:`DecodingModule`) and hands an :class:`ModelAnswers` to its
:class:`~evaluation.evaluator.Evaluator`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from core.tool_use.requests import FrameBudget
from core.tool_use.spans import where_it_looked
from families import ModelFamily
from rollout.base import RolloutRequest, SamplingConfig
from rollout.episodes import FrameTool, episode_rollouts, frame_sources, given_turns_of
from rollout.hf_engine import TransformersEngine

LocalEncoder = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], list[torch.Tensor]]
"""``(model, pixel_values_videos, video_grid_thw) -> one embedding per video``, on this rank alone."""


class DecodingModule(Protocol):
    """What a LightningModule offers for its answers to be decoded."""

    @property
    def processor(self) -> Any:
        """The model's processor (its tokenizer decodes and encodes the turns)."""
        ...

    @property
    def family(self) -> ModelFamily:
        """The model's family (the frames tool lays out replies by its rule)."""
        ...

    def gathered_model(self) -> AbstractContextManager[torch.nn.Module]:
        """The whole model for work whose length differs across ranks."""
        ...

    def encode_videos(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """The vision tower's output per video (shared out over a sequence-parallel group)."""
        ...


def validation_requests(batch: dict[str, Any], videos: list[torch.Tensor]) -> list[RolloutRequest]:
    """The rollout request of each prompt of a collated batch, its video encoded once (``videos``)."""
    return [
        RolloutRequest(layout, layout.encoded_video(embeds))
        for layout, embeds in zip(batch["prompts"], videos, strict=True)
    ]


class ModelAnswers:
    """The :class:`~evaluation.evaluator.AnswerGenerator` of a module: per prompt of a batch,
    ``sampling.n`` completion texts; with ``tool_budget``, tool-use episodes under that budget,
    whose tool replies are encoded by ``encode_locally`` (each rank its own episodes' frames).

    After greedy tool-use answers, :attr:`tool_records` holds one record per prompt: requests,
    frames served, the spans served, how well they cover the answer's stretch, and every turn.
    """

    def __init__(
        self, module: DecodingModule, tool_budget: FrameBudget | None, encode_locally: LocalEncoder
    ) -> None:
        self.module = module
        self.tool_budget = tool_budget
        self.encode_locally = encode_locally
        self.tool_records: list[dict[str, Any]] = []

    @torch.no_grad()
    def __call__(self, batch: dict[str, Any], *, sampling: SamplingConfig) -> list[list[str]]:
        module = self.module
        tokenizer = module.processor.tokenizer
        with module.gathered_model() as model:  # ranks decode different numbers of tokens
            engine = TransformersEngine.for_model(model, tokenizer)
            # Sequence-parallel peers evaluate the same questions: they encode the videos together,
            # each its share of the frames (a whole long video on every GPU would not fit).
            videos = module.encode_videos(batch["pixel_values_videos"], batch["video_grid_thw"])
            requests = validation_requests(batch, videos)
            if self.tool_budget is None:
                results = engine.generate(requests, sampling)
                return [[c.text for c in result.completions] for result in results]
            encode_locally = self.encode_locally
            tool = FrameTool(
                self.tool_budget,
                module.processor,
                module.family,
                lambda pixels, grid: encode_locally(model, pixels, grid),
            )
            given = given_turns_of(batch["meta"], tokenizer)
            played = episode_rollouts(
                engine, requests, frame_sources(batch["meta"]), sampling, tool, given_turns=given
            )
        n = sampling.n
        texts = [c.text for c in played.completions]
        if n == 1:  # the greedy answers are the ones counted
            self.tool_records = [
                {
                    "frame_requests": requests,
                    "frames_served": episode.served_frames,
                    "served_spans_s": [list(span) for span in episode.served_spans],
                    **where_it_looked(episode.served_spans, meta.get("relevant_span_s")),
                    "turns": tokenizer.decode(episode.sampled_ids, skip_special_tokens=True),
                }
                for requests, episode, meta in zip(
                    played.requests, played.episodes, batch["meta"], strict=True
                )
            ]
        return [texts[k * n : (k + 1) * n] for k in range(len(requests))]
