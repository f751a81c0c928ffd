"""vLLM fed lvrl's cached encodings = vLLM fed raw frames = lvrl's transformers engine, per family.

For Qwen2-VL and Qwen3-VL's tiny models (Qwen2.5-VL: ``tests/e2e/test_rollout_vllm.py``) a
16-frame video is laid out by the family (Qwen3-VL: timestamps between frames) and encoded once.
Greedy decoding must give the same tokens three ways, and the log-probs of the two cached-encoding
engines must agree within the float32 bar: vLLM computes the same model with other kernels, so
they differ by rounding only, while a wrong position, a missing timestamp or a dropped DeepStack
level changes the greedy tokens or moves log-probs by far more.
"""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
import torch
from helpers.tolerances import FORWARD_ULPS, assert_float32_close

from core.layout import PromptLayout
from families import family_of
from models.loading import load_model, load_processor
from models.vision import encode_videos
from rollout.base import PolicyHandle, RolloutRequest, SamplingConfig
from rollout.hf_engine import TransformersEngine

pytest.importorskip("vllm")

NEW_TOKENS = 12
METADATA = {"fps": 2.0, "total_num_frames": 16, "frames_indices": list(range(16)), "duration": 8.0}


@pytest.mark.parametrize("family_name", ["qwen2_vl", "qwen3_vl"])
def test_cached_encodings_raw_frames_and_the_trainer_agree(family_name: str, family_model_dir) -> None:
    from vllm import SamplingParams

    from rollout.vllm_engine import VLLMEngine

    model_dir = family_model_dir(family_name)
    model, processor = load_model(model_dir), load_processor(model_dir)
    family = family_of(model.config)
    side = 2 * family.merged_patch_pixels  # kept as given by the processor
    frames = np.random.default_rng(0).integers(0, 256, (16, side, side, 3), dtype=np.uint8)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    encoded = dict(processor(text=[text], videos=[frames], video_metadata=[METADATA], return_tensors="pt"))
    encoded["second_per_grid_ts"] = family.second_per_grid(encoded, [METADATA])
    video_token = processor.tokenizer.convert_tokens_to_ids(family.video_token)
    layout = PromptLayout.from_processor_output(
        encoded,
        0,
        video_token,
        family.position_rule,
        family.engine_template_ids(processor.tokenizer, text),
        family.patch_timestamps(METADATA),
    )
    with torch.no_grad():
        (embeds,) = encode_videos(model, encoded["pixel_values_videos"], encoded["video_grid_thw"])
    request = RolloutRequest(layout, layout.encoded_video(embeds))
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=NEW_TOKENS)
    trainer = (
        TransformersEngine.for_model(model, processor.tokenizer).generate([request], greedy)[0].completions[0]
    )
    engine = VLLMEngine(dtype="float32", max_model_len=1024, max_num_seqs=4)
    engine.start(PolicyHandle(str(model_dir), model, processor.tokenizer))
    try:
        cached = engine.generate([request], greedy)[0].completions[0]
        # the engine bans ids with no token behind them (rollout.guardrails): so does the raw call
        params = SamplingParams(
            temperature=0.0, max_tokens=NEW_TOKENS, logprobs=0, allowed_token_ids=engine.allowed_token_ids
        )
        with torch.compiler.set_stance(engine.compile_stance):  # as the engine's own calls run
            raw = engine.llm.generate(
                {"prompt": text, "multi_modal_data": {"video": (frames, METADATA)}}, params, use_tqdm=False
            )[0]
    finally:
        engine.shutdown()
        del engine
        gc.collect()
    assert raw.prompt_token_ids == layout.token_ids.tolist()  # vLLM expands the video as the processor does
    assert cached.token_ids == list(raw.outputs[0].token_ids) == trainer.token_ids
    count = min(len(cached.logprobs), len(trainer.logprobs))
    scale = max(math.log(model.config.text_config.vocab_size), max(abs(x) for x in trainer.logprobs))
    assert_float32_close(
        torch.tensor(cached.logprobs[:count]),
        torch.tensor(trainer.logprobs[:count]),
        ulps=FORWARD_ULPS,
        scale=scale,
        reason=f"{family_name}: vLLM from cached encodings vs the transformers engine",
    )
