"""Qwen3-VL (and Qwen3-VL-MoE): timestamps between frames, DeepStack features, interleaved M-RoPE.

Three things differ from Qwen2.5-VL, and each has its place here:

- **Prompt layout.** The processor writes every temporal patch as its own run of placeholders,
  preceded by its timestamp as text (``<1.0 seconds><|vision_start|><|video_pad|>...
  <|vision_end|>``), so time is read rather than encoded in the positions: the ``frames``
  temporal rule (:mod:`core.positions`) gives each run ``t = 0``. Collapsing the runs does not
  give back the chat template's prompt, so the collator keeps that prompt
  (:meth:`Qwen3_VL.engine_template_ids`) for an engine that expands the video itself.
- **DeepStack.** The vision tower also returns, per visual token, the features of a few of its
  intermediate blocks (``vision_config.deepstack_visual_indexes``); the language model adds
  level ``i`` to the hidden states of the visual tokens after its decoder layer ``i``. Dropping
  them changes the model's scores (by up to 0.32 nat in a tiny random model). lvrl caches them
  with the merged embeddings (one tensor, the levels concatenated on the last dimension, as
  vLLM's Qwen3-VL lays out its encoder output) and injects them in :meth:`Qwen3_VL.forward`.
- **Interleaved M-RoPE** is inside the model; the positions lvrl passes are the usual three rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from core.positions import TemporalRule
from core.video import VideoEmbedding
from families.base import ModelFamily, VisualFeatures


class Qwen3_VL(ModelFamily):
    """Qwen3-VL (``qwen3_vl``) and its mixture-of-experts variant (``qwen3_vl_moe``)."""

    name = "qwen3_vl"
    model_types: ClassVar[tuple[str, ...]] = ("qwen3_vl", "qwen3_vl_moe")
    temporal: ClassVar[TemporalRule] = "frames"

    @property
    def deepstack_levels(self) -> int:
        return len(self.vision.deepstack_visual_indexes)

    @property
    def visual_width(self) -> int:
        return int(self.vision.out_hidden_size) * (1 + self.deepstack_levels)

    def patch_timestamps(self, metadata: Mapping[str, Any]) -> list[float]:
        """The processor's timestamps: each sampled frame's time (its index in the source video
        over the source fps), averaged over the frames of a temporal patch (the last frame
        repeated to fill the final patch)."""
        fps = float(metadata["fps"])
        if not metadata.get("frames_indices"):
            raise ValueError("Qwen3-VL dates its frames from video_metadata['frames_indices']: missing")
        indices = list(metadata["frames_indices"])
        patch = self.temporal_patch_size
        indices += [indices[-1]] * (-len(indices) % patch)
        return [(indices[i] / fps + indices[i + patch - 1] / fps) / 2 for i in range(0, len(indices), patch)]

    def released_state_dict(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Qwen3-VL-MoE's fused experts transposed to the released layout: transformers 5.19
        holds ``gate_up_proj`` as (experts, 2 x width, hidden) and ``down_proj`` as (experts,
        hidden, width) and saves them so, while the released checkpoints (the only layout vLLM
        0.32 reads) store (experts, hidden, 2 x width) and (experts, width, hidden); transformers
        loads either."""
        if self.config.model_type != "qwen3_vl_moe":
            return None
        fused = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
        return {
            name: tensor.transpose(1, 2).contiguous() if name.endswith(fused) else tensor
            for name, tensor in state.items()
        }

    def engine_template_ids(self, tokenizer: Any, prompt_text: str) -> list[int]:
        return list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])

    def encode_videos(
        self, model: torch.nn.Module, pixel_values_videos: torch.Tensor, video_grid_thw: torch.Tensor
    ) -> list[torch.Tensor]:
        inner = getattr(model, "model", model)
        parameter = next(inner.visual.parameters())
        pixels = pixel_values_videos.to(device=parameter.device, dtype=parameter.dtype)
        # The grid too: a tool reply's comes from the processor on the CPU, and Qwen3-VL's tower
        # indexes its position table with tensors made on the grid's device.
        grid = video_grid_thw.to(parameter.device)
        output = inner.get_video_features(pixels, grid, return_dict=True)
        # deepstack_features: one entry per level; from transformers 5.18 each is a tuple of one
        # tensor per video (like pooler_output), before that one tensor of every video's tokens.
        sizes = [len(merged) for merged in output.pooler_output]
        levels = [
            level if isinstance(level, (tuple, list)) else torch.split(level, sizes)
            for level in output.deepstack_features
        ]
        return [
            torch.cat([merged, *(level[video] for level in levels)], dim=-1)
            for video, merged in enumerate(output.pooler_output)
        ]

    def split_encoding(self, cached: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        width = self.language_width
        return cached[..., :width], cached[..., width:]

    def forward(self, model: torch.nn.Module, *, visual: VisualFeatures | None = None, **kwargs: Any) -> Any:
        if visual is None or not bool(visual.mask.any()):
            return model(**kwargs)
        # The top-level forward computes DeepStack features only from pixels; with cached ones the
        # language model is called directly (it takes them) and the LM head applied here.
        from transformers.modeling_outputs import CausalLMOutputWithPast

        keep = kwargs.pop("logits_to_keep", 0)
        inner = getattr(model, "model", model)
        levels = list(visual.extra.split(self.language_width, dim=-1))
        hidden = inner.language_model(visual_pos_masks=visual.mask, deepstack_visual_embeds=levels, **kwargs)
        states = hidden.last_hidden_state
        # As the model's own forward: the last ``keep`` positions, or the positions a tensor lists.
        kept = slice(-keep, None) if isinstance(keep, int) else keep
        logits = model.lm_head(states[:, kept])
        return CausalLMOutputWithPast(logits=logits, past_key_values=hidden.past_key_values)

    def vllm_video_input(self, video: VideoEmbedding) -> dict[str, Any]:
        """vLLM's Qwen3-VL takes the encoding with its DeepStack levels concatenated (our cache's
        layout), the grid, and the timestamps it writes into the prompt between frames."""
        if video.timestamps is None:
            raise ValueError("a Qwen3-VL video needs its temporal patches' timestamps (set by the collator)")
        return {
            "video_embeds": video.embeds.detach().float().cpu(),
            "video_grid_thw": video.grid_thw.reshape(1, 3).cpu(),
            "timestamps": [list(video.timestamps)],  # one entry per video
        }
