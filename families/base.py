"""What lvrl needs to know of a vision-language model family, in one place per family.

A :class:`ModelFamily` is bound to one model config and answers, for that family: the M-RoPE
position rule (:class:`core.layout.PositionRule`), the width of a cached video encoding, how to
run the vision tower once, how the processor's output carries the video's timing, the scoring
forward that consumes cached encodings (Qwen3-VL's DeepStack features included), and what a
rollout engine is given for a video. Everything else in lvrl (collator, layouts, log-probs,
sequence-parallel prefill and encoding, engines, sharding) is family-agnostic and asks here.

A cached video encoding is **one** ``(visual_tokens, visual_width)`` tensor per video: the
merged embeddings that go into the video placeholders (the first ``language_width`` columns)
followed, for families with extra per-token features (DeepStack), by those features
concatenated on the last dimension, the layout vLLM's Qwen3-VL uses for its own encoder output.
One tensor keeps the cache, the sequence-parallel all-gather and the engines unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.layout import PositionRule
from core.positions import TemporalRule
from core.video import VideoEmbedding


@dataclass
class VisualFeatures:
    """Per-visual-token inputs a family injects inside the language model (DeepStack).

    ``mask`` marks the visual tokens of the rows being forwarded, ``(rows, length)``; ``extra``
    holds their features in the order ``mask.nonzero()`` lists them (row by row, left to right),
    ``(visual tokens, extra width)``.
    """

    mask: torch.Tensor
    extra: torch.Tensor

    def select(self, rows: Sequence[int] | torch.Tensor | None = None, columns: Any = None) -> VisualFeatures:
        """The features of ``mask[rows][:, columns]`` (rows and columns: anything that indexes a
        tensor dimension), in that sub-mask's own row-major order."""
        ordinal = torch.cumsum(self.mask.reshape(-1).long(), 0).reshape(self.mask.shape) - 1
        mask, ordinal = self.mask, ordinal
        if rows is not None:
            index = torch.as_tensor(rows, dtype=torch.long, device=mask.device)
            mask, ordinal = mask[index], ordinal[index]
        if columns is not None:
            mask, ordinal = mask[:, columns], ordinal[:, columns]
        return VisualFeatures(mask, self.extra[ordinal[mask].to(self.extra.device)])


class ModelFamily:
    """One family of Qwen-VL models (subclasses: one file each in :mod:`families`).

    The defaults are Qwen2.5-VL's; a family overrides what differs.
    """

    name: ClassVar[str]
    """The family's name on the command line (``lvrl model build --family``)."""
    model_types: ClassVar[tuple[str, ...]]
    """The ``model_type`` values of ``config.json`` this family serves."""
    temporal: ClassVar[TemporalRule]
    """How a temporal patch's index becomes a position (:mod:`core.positions`)."""
    video_token: ClassVar[str] = "<|video_pad|>"
    """The placeholder the processor repeats once per visual token."""
    vision_tokens: ClassVar[tuple[str, ...]] = (
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    )
    """The vision special tokens: only the processor writes them, around and as visual tokens."""
    vision_token_attributes: ClassVar[tuple[str, ...]] = (
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
    )
    """The config attributes that name vision token ids."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.vision = config.vision_config
        self.text = getattr(config, "text_config", config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config.model_type})"

    def vision_token_ids(self, tokenizer: Any) -> list[int]:
        """Ids a completion must never hold: the config's vision token ids and the tokenizer's
        vision special tokens. A sampled placeholder would make the next pass read the text as a
        video slot (a Qwen3-VL run crashed so: verl #5817)."""
        ids = {getattr(self.config, name, None) for name in self.vision_token_attributes}
        vocabulary = tokenizer.get_vocab()
        ids |= {vocabulary.get(token) for token in self.vision_tokens}
        return sorted(int(i) for i in ids if i is not None)

    # -- geometry and positions ------------------------------------------------------------------
    @property
    def spatial_merge_size(self) -> int:
        return int(self.vision.spatial_merge_size)

    @property
    def merged_patch_pixels(self) -> int:
        """The side in pixels of the square one merged visual token covers (28 for Qwen2/2.5-VL,
        32 for Qwen3-VL): frames whose sides are multiples of it are never resized by the processor."""
        return int(self.vision.patch_size) * self.spatial_merge_size

    @property
    def temporal_patch_size(self) -> int:
        return int(self.vision.temporal_patch_size)

    @property
    def tokens_per_second(self) -> float | None:
        """Temporal positions per second of video (``scaled`` families only)."""
        return None

    @property
    def position_rule(self) -> PositionRule:
        return PositionRule(self.spatial_merge_size, self.tokens_per_second, self.temporal)

    @property
    def language_width(self) -> int:
        """The language model's hidden size: the width of an embedding in a video slot."""
        return int(self.text.hidden_size)

    @property
    def visual_width(self) -> int:
        """The width of a cached video encoding (see the module docstring)."""
        return self.language_width

    # -- data -----------------------------------------------------------------------------------
    def second_per_grid(
        self, encoded: Mapping[str, Any], metadata: Sequence[Mapping[str, Any]]
    ) -> list[float]:
        """Seconds spanned by one temporal patch of each video of a processor call.

        The processor's own ``second_per_grid_ts`` where it returns one (Qwen2.5-VL), else the
        same formula from the metadata given to it: ``temporal_patch_size / sampled_fps`` with
        ``sampled_fps = len(frames_indices) / total_num_frames * fps``.
        """
        if "second_per_grid_ts" in encoded:
            return [float(t) for t in encoded["second_per_grid_ts"]]
        seconds = []
        for video in metadata:
            fps = float(video["fps"])
            indices = video.get("frames_indices")
            sampled_fps = len(indices) / int(video["total_num_frames"]) * fps if indices else fps
            seconds.append(self.temporal_patch_size / sampled_fps)
        return seconds

    def patch_timestamps(self, metadata: Mapping[str, Any]) -> list[float] | None:
        """Each temporal patch's time in seconds, for a family whose prompt writes it; None here."""
        return None

    def engine_template_ids(self, tokenizer: Any, prompt_text: str) -> list[int] | None:
        """The prompt an engine that expands the video itself is given, when collapsing each run
        of placeholders of the expanded prompt does not give it back; None when it does."""
        return None

    # -- vision ---------------------------------------------------------------------------------
    def encode_videos(
        self, model: torch.nn.Module, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor
    ) -> list[torch.Tensor]:
        """Run the vision tower (and merger) once: one ``(visual_tokens, visual_width)`` per video."""
        inner = getattr(model, "model", model)
        tower = inner.visual
        parameter = next(tower.parameters())
        pixels = pixel_values_videos.to(device=parameter.device, dtype=parameter.dtype)
        # The grid too: a tool reply's comes from the processor on the CPU, and Qwen3-VL's tower
        # indexes its position table with tensors made on the grid's device.
        grid = video_grid_thw.to(parameter.device)
        output = inner.get_video_features(pixels, grid, return_dict=True)
        return list(output.pooler_output)

    # -- the language model ---------------------------------------------------------------------
    def split_encoding(self, cached: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A cached encoding's placeholder embeddings and its extra per-token features (None:
        the family has none)."""
        return cached, None

    def visual_extras(self, encodings: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """The extra per-visual-token features (DeepStack) of the cached ``encodings``, in the
        order given (the order their visual tokens stand in the rows, as a mask of those rows
        lists them); None: the family has none, or there are no encodings."""
        extras = [self.split_encoding(cached)[1] for cached in encodings]
        if not extras or any(extra is None for extra in extras):
            return None
        return torch.cat([extra for extra in extras if extra is not None])

    def forward(self, model: torch.nn.Module, *, visual: VisualFeatures | None = None, **kwargs: Any) -> Any:
        """The model's forward on ``inputs_embeds`` (video slots already filled), with the
        family's per-visual-token features injected; returns the HF output (``logits``,
        ``past_key_values``)."""
        if visual is not None:
            raise ValueError(f"{self!r} has no per-visual-token features to inject")
        return model(**kwargs)

    # -- export ---------------------------------------------------------------------------------
    def released_state_dict(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """``state`` in the released checkpoints' tensor layout where transformers'
        ``save_pretrained`` does not write that layout itself (vLLM reads only the released one);
        None: it does (every family but Qwen3-VL-MoE)."""
        return None

    # -- engines --------------------------------------------------------------------------------
    def vllm_video_input(self, video: VideoEmbedding) -> dict[str, Any]:
        """The ``multi_modal_data["video"]`` entry vLLM takes for a cached encoding."""
        return {
            "video_embeds": video.embeds.detach().float().cpu(),
            "video_grid_thw": video.grid_thw.reshape(1, 3).cpu(),
            "second_per_grid_ts": torch.tensor([video.second_per_grid], dtype=torch.float32),
        }
