"""Turning decoded samples into model inputs, through the model's own processor.

The processor expands the video placeholder to one ``<|video_pad|>`` per merged visual token
(Qwen3-VL's: one run per temporal patch, its timestamp written before it) and returns pixel
patches and ``video_grid_thw``; ``second_per_grid_ts`` comes from the processor or, for the
families whose processor does not return it, from the sampled frame rate we pass as metadata
(:meth:`families.ModelFamily.second_per_grid`). The prompt and the assistant target are tokenised
separately and concatenated, so the SFT label mask covers exactly the assistant tokens and
generation sees exactly the prompt it was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from core.layout import PromptLayout
from datamodules.prompts import assistant_target, chat_messages, encode_video_prompt
from datamodules.rows import QARow
from datamodules.stream import VideoQASample
from datamodules.tool_traces import ToolTraces, given_turn, stored_video, trace_target
from families import ModelFamily

IGNORE_INDEX = -100


def video_metadata(sample: VideoQASample) -> dict[str, Any]:
    """What the HF processor needs to know of the sampled frames.

    It derives ``second_per_grid_ts = temporal_patch_size / sampled_fps`` with
    ``sampled_fps = len(frames_indices) / total_num_frames * fps``; without this it assumes 24 fps.
    """
    video = sample.video
    return {
        "fps": video.fps,
        "total_num_frames": video.total_num_frames,
        "frames_indices": list(video.frame_indices),
        "duration": video.duration,
        "height": int(video.frames.shape[1]),
        "width": int(video.frames.shape[2]),
    }


def _pad(sequences: Sequence[torch.Tensor], value: int, side: str) -> torch.Tensor:
    length = max(len(s) for s in sequences)
    out = torch.full((len(sequences), length), value, dtype=sequences[0].dtype)
    for i, seq in enumerate(sequences):
        if side == "right":
            out[i, : len(seq)] = seq
        else:
            out[i, length - len(seq) :] = seq
    return out


END_OF_TURN = "<|im_end|>"


class TextTokenCounter:
    """``row -> (prompt tokens, target tokens)``: the text the collator will tokenise, counted.

    The prompt is the chat-templated user turn with its video placeholder unexpanded (one
    token: the frames' tokens are bounded by the frame count and pixel budget instead); the
    target is the CoT-SFT text (reasoning, answer, end of turn). The stream calls this before
    decoding a sample's video (:class:`datamodules.stream.VideoQAStream`), so a sample over the
    limits is skipped for the price of one tokenisation (about 0.5 s for a 200,000-character
    question).
    """

    def __init__(self, processor: Any, tool_use: bool = False) -> None:
        self.processor = processor
        self.tool_use = tool_use

    def __call__(self, row: QARow) -> tuple[int, int]:
        tokenizer = self.processor.tokenizer
        prompt = self.processor.apply_chat_template(
            chat_messages(row, self.tool_use), tokenize=False, add_generation_prompt=True
        )
        target = assistant_target(row) + END_OF_TURN
        return (
            len(tokenizer(prompt, add_special_tokens=False)["input_ids"]),
            len(tokenizer(target, add_special_tokens=False)["input_ids"]),
        )


class VideoQACollator:
    """Collates :class:`VideoQASample` lists into a batch dict.

    Always returns the video tensors and ``meta`` (one dict per sample: key, shard,
    problem_id, category, answer, options, problem_type). With ``with_targets`` it adds the teacher-forcing
    layout (prompt + target, right-padded) with ``labels`` that are ``-100`` outside the
    assistant tokens; ``video_mask`` marks the video slots of the prompt (a target that happens
    to contain the placeholder id is still text): the model module turns it into M-RoPE
    positions with :mod:`core.positions`. Given the model's ``family``, it adds ``prompts``: one
    :class:`~core.layout.PromptLayout` per sample, the prompt alone with its positions, from
    which generation, rollouts and the RL scoring rows are all derived (without it the processor
    must return ``second_per_grid_ts`` itself, as Qwen2.5-VL's does).
    """

    def __init__(
        self,
        processor: Any,
        *,
        with_targets: bool = True,
        family: ModelFamily | None = None,
        tool_traces: ToolTraces | None = None,
    ) -> None:
        if tool_traces is not None and family is None:
            raise ValueError("tool traces need the model's family (their replies are laid out by it)")
        self.tool_traces = tool_traces
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.with_targets = with_targets
        self.family = family
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            raise ValueError("the tokenizer has no pad token")
        self.end_of_turn = END_OF_TURN
        self.video_token_id = self.tokenizer.convert_tokens_to_ids("<|video_pad|>")

    def encode_prompt(self, sample: VideoQASample) -> dict[str, Any]:
        """The processor's output for one sample, with ``second_per_grid_ts`` and (for a family
        that needs it) ``template_ids``: the prompt before the video was expanded."""
        return encode_video_prompt(
            self.processor,
            sample.row,
            sample.video.frames,
            video_metadata(sample),
            tool_use=self.tool_traces is not None,
            family=self.family,
        )

    def encode_target(self, sample: VideoQASample) -> torch.Tensor:
        text = assistant_target(sample.row) + self.end_of_turn
        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    def __call__(self, samples: Sequence[VideoQASample]) -> dict[str, Any]:
        encoded = [self.encode_prompt(s) for s in samples]
        prompts = [e["input_ids"][0] for e in encoded]
        batch: dict[str, Any] = {
            "pixel_values_videos": torch.cat([e["pixel_values_videos"] for e in encoded]),
            "video_grid_thw": torch.cat([e["video_grid_thw"] for e in encoded]),
            "second_per_grid_ts": torch.tensor(
                [t for e in encoded for t in e["second_per_grid_ts"]], dtype=torch.float32
            ),
            "meta": [
                {
                    "key": s.key,
                    "shard": s.shard,
                    "problem_id": s.row.problem_id,
                    "problem": s.row.problem,
                    "category": s.row.category,
                    "answer": s.row.answer,
                    "options": list(s.row.options),
                    "problem_type": s.row.problem_type,
                    "reasoning": s.row.reasoning,
                    "num_frames": len(s.video.frame_indices),
                    "stream": (s.epoch, s.worker, s.position),
                    "duration": s.video.duration,
                    "relevant_span_s": s.row.relevant_span_s,
                    "frame_source": stored_video(s, self.tool_traces) if self.tool_traces else None,
                    "given_turn": given_turn(s, self.tool_traces),
                }
                for s in samples
            ],
        }
        if self.with_targets:
            self._add_targets(batch, samples, prompts, encoded)
        if self.family is not None:
            rule = self.family.position_rule
            batch["prompts"] = [
                PromptLayout.from_processor_output(
                    e, 0, self.video_token_id, rule, e["template_ids"], e["timestamps"]
                )
                for e in encoded
            ]
        return batch

    def _add_targets(
        self,
        batch: dict[str, Any],
        samples: Sequence[VideoQASample],
        prompts: list[torch.Tensor],
        encoded: list[dict[str, Any]],
    ) -> None:
        """The teacher-forcing layout: prompt + target per row, labels only on the target. A row
        with a tool trace (``tool_traces``) has the trace's episode as its target, and then the
        batch also carries the layout's videos in row order (``target_*`` keys: each row's prompt
        video, then its reply's segment)."""
        traces = [
            trace_target(self.processor, self.family, s, self.tool_traces, self.end_of_turn)
            if self.tool_traces is not None and self.family is not None
            else None
            for s in samples
        ]
        full, labels, video_slots = [], [], []
        for prompt, sample, trace in zip(prompts, samples, traces, strict=True):
            if trace is None:
                target = self.encode_target(sample)
                label = target
                slots = torch.zeros_like(target, dtype=torch.bool)
            else:
                target = torch.tensor(trace.token_ids, dtype=torch.long)
                label = target.masked_fill(~torch.tensor(trace.trained), IGNORE_INDEX)
                slots = torch.tensor(trace.video_slots)
            full.append(torch.cat([prompt, target]))
            labels.append(torch.cat([torch.full_like(prompt, IGNORE_INDEX), label]))
            video_slots.append(torch.cat([prompt == self.video_token_id, slots]))
        batch["input_ids"] = _pad(full, self.pad_id, "right")
        batch["attention_mask"] = _pad([torch.ones_like(f) for f in full], 0, "right")
        batch["labels"] = _pad(labels, IGNORE_INDEX, "right")
        batch["video_mask"] = _pad(video_slots, 0, "right")
        if any(trace is not None for trace in traces):
            pixels, grids, seconds = [], [], []
            for e, trace in zip(encoded, traces, strict=True):
                pixels.append(e["pixel_values_videos"])
                grids.append(e["video_grid_thw"])
                seconds.extend(float(t) for t in e["second_per_grid_ts"])
                if trace is not None:
                    pixels.append(trace.pixel_values_videos)
                    grids.append(trace.video_grid_thw)
                    seconds.extend(trace.seconds_per_grid)
            batch["target_pixel_values_videos"] = torch.cat(pixels)
            batch["target_video_grid_thw"] = torch.cat(grids)
            batch["target_second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
