"""The benchmarks' input: one synthetic video of N frames with its question, through the processor."""

from __future__ import annotations

from typing import Any

from datamodules.prompts import chat_messages
from datatools.synthetic import SynthConfig, make_sample


def video_inputs(processor: Any, frames: int, side: int = 56) -> tuple[str, Any]:
    """``(chat prompt, processor output)``: a synthetic video, ``frames`` frames of ``side`` pixels, 2 fps."""
    row, pixels = make_sample(SynthConfig(num_frames=frames, fps=2.0, size=side), "test", 0)
    prompt = processor.apply_chat_template(chat_messages(row), tokenize=False, add_generation_prompt=True)
    metadata = {
        "fps": 2.0,
        "total_num_frames": frames,
        "frames_indices": list(range(frames)),
        "duration": frames / 2,
    }
    encoded = processor(text=[prompt], videos=[pixels], video_metadata=[metadata], return_tensors="pt")
    return prompt, encoded
