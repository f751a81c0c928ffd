"""What a policy update reads of the experience it is handed: the consumer's side of the contract.

The rollout machinery (:mod:`rollout.experience`) produces a ``RolloutBatch`` with more in it
(completion texts, reward breakdowns, the tool's statistics, for metrics and records); the
update needs only what is listed here. Stating it as protocols keeps ``models`` free of the
rollout package: any object with these attributes trains, a test's included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from core.layout import PromptLayout, ScoringBatch
from core.tool_use.episode import Episode
from core.video import VideoEmbedding


class ExperiencePrompts(Protocol):
    """The prompts the rollouts answered: their layouts, metadata and videos."""

    layouts: list[PromptLayout]
    meta: list[dict[str, Any]]
    pixel_values_videos: torch.Tensor
    video_grid_thw: torch.Tensor


class Experience(Protocol):
    """Scored rollouts of one batch of prompts: rows are completions, G per prompt, prompt-major."""

    prompts: ExperiencePrompts
    videos: list[VideoEmbedding]
    """Each prompt's video, encoded once."""
    scoring: ScoringBatch
    """The rows ``prompt + completion`` as the policy scores them."""
    old_logprobs: torch.Tensor
    """``(rows, max_completion_len)`` behaviour-policy log-probs of the sampled tokens."""
    advantages: torch.Tensor
    """``(rows,)``."""
    row_mask: torch.Tensor
    """``(rows,)`` 1.0 for rows that train."""
    episodes: list[Episode] | None
    """Tool-use rollouts: each row's episode; None for single-turn rollouts."""

    def segment_embeds(self, rows: Sequence[int]) -> list[list[torch.Tensor]] | None:
        """The cached encodings of the video segments the tool put into each of ``rows``."""
        ...

    def segment_inputs(self, rows: Sequence[int]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Pixel values and grid of each segment of each of ``rows`` (a trainable tower encodes them)."""
        ...

    def video_embeds(self) -> list[torch.Tensor]:
        """Each prompt's cached encoding, indexed like ``scoring.prompt_of_row``."""
        ...
