"""The rollout engine interface, kept small: generate, update weights, sleep and wake.

Requests carry the prompt token ids with **one** placeholder per video (as the chat template
writes it) and the video's cached embeddings, never raw frames: the video was encoded once by
the trainer and every rollout, the reference pass and the policy pass reuse that encoding.
Results carry the prompt ids as the engine expanded them (one placeholder per visual token):
that expanded layout is the one the trainer must score.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are sampled.

    Args:
        n: completions per prompt (G, the group size).
        temperature: softmax temperature of sampling (log-probs are reported at temperature 1).
        top_p: nucleus sampling mass.
        max_new_tokens: generation budget per completion.
        seed: base seed of the sampler (None: nondeterministic).
    """

    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be at least 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")


@dataclass
class VideoEmbedding:
    """One video, encoded: what the language model sees instead of frames."""

    embeds: torch.Tensor
    """``(num_visual_tokens, hidden)`` output of the vision tower's merger."""
    grid_thw: torch.Tensor
    """``(3,)`` grid in patches: temporal patches, height patches, width patches."""
    second_per_grid: float
    """Seconds spanned by one temporal patch (drives the temporal M-RoPE positions)."""


@dataclass
class RolloutRequest:
    prompt_ids: list[int]
    """Prompt token ids with one video placeholder token per video."""
    video: VideoEmbedding | None = None


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each sampled token under the engine's weights, at temperature 1."""
    text: str
    finish_reason: str
    """``stop`` (end of turn) or ``length`` (budget exhausted)."""


@dataclass
class RolloutResult:
    prompt_ids: list[int]
    """The prompt as the engine saw it: video placeholders expanded to one per visual token."""
    completions: list[Completion] = field(default_factory=list)


class RolloutEngine(Protocol):
    def generate(
        self, requests: Sequence[RolloutRequest], sampling: SamplingConfig
    ) -> list[RolloutResult]: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


def num_visual_tokens(grid_thw: torch.Tensor, spatial_merge_size: int) -> int:
    """Placeholder tokens of one video: temporal x height x width patches / merge^2.

    >>> num_visual_tokens(torch.tensor([8, 4, 4]), 2)
    32
    """
    t, h, w = (int(x) for x in grid_thw)
    return t * h * w // (spatial_merge_size**2)


def expand_video_placeholders(
    prompt_ids: Sequence[int], video_token_id: int, tokens_per_video: Sequence[int]
) -> list[int]:
    """Repeat each video placeholder as many times as the video has visual tokens.

    A prompt that is already expanded (as many placeholders as visual tokens) is returned as is.

    >>> expand_video_placeholders([1, 9, 2], 9, [3])
    [1, 9, 9, 9, 2]
    >>> expand_video_placeholders([1, 9, 9, 9, 2], 9, [3])
    [1, 9, 9, 9, 2]
    """
    placeholders = sum(1 for t in prompt_ids if t == video_token_id)
    if placeholders == sum(tokens_per_video):
        return list(prompt_ids)
    if placeholders != len(tokens_per_video):
        raise ValueError(f"{placeholders} video placeholders but {len(tokens_per_video)} videos")
    out: list[int] = []
    counts = iter(tokens_per_video)
    for token in prompt_ids:
        out.extend([token] * next(counts) if token == video_token_id else [token])
    return out


def collapse_video_placeholders(prompt_ids: Sequence[int], video_token_id: int) -> list[int]:
    """Undo :func:`expand_video_placeholders`: each run of placeholders becomes one.

    >>> collapse_video_placeholders([1, 9, 9, 9, 2], 9)
    [1, 9, 2]
    """
    out: list[int] = []
    for token in prompt_ids:
        if token == video_token_id and out and out[-1] == video_token_id:
            continue
        out.append(token)
    return out
