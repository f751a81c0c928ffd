"""vLLM's own limits, met before start-up: a 4,096-frame video against vLLM's encoder cache, for real.

The model is the tiny one with the released Qwen2.5-VL processor's frame budget (12,845,056 pixels
a frame at most): vLLM sizes its encoder cache from that processor's largest dummy video (14
frames at the largest frame size: 114,688 tokens), so a video of 4,096 frames at 128 tokens a
frame pair (262,144 tokens, the 4,096-frame config's) is refused, request by request, by an engine
started with the arguments it had before (:func:`rollout.engine_limits.batched_tokens_for` did not
exist). Sized for the run's shape (:meth:`rollout.vllm_engine.VLLMEngine.admit`), the same engine
takes it. The request is the engine's own (its prompt and video embedding as a rollout sends
them), submitted and withdrawn before it runs: the check is vLLM's, the 262k-token prefill is
not done.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoProcessor

from core.layout import PromptLayout
from families import position_rule_of
from models.loading import load_model
from rollout.base import PolicyHandle, RolloutRequest
from rollout.engine_limits import EngineLimitError, RolloutShape
from rollout.vllm_engine import VLLMEngine

RELEASED_MAX_PIXELS = 12_845_056
"""The released Qwen2.5-VL processor's largest frame (``max_pixels``), whose dummy sizes vLLM's cache."""
GRID = (2048, 16, 32)
"""4,096 frames (2,048 temporal patches) of 224 x 448 pixels: 128 merged tokens a patch."""
VIDEO_TOKENS = GRID[0] * GRID[1] * GRID[2] // 4


@pytest.fixture(scope="module")
def released_pixels_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("released-pixels") / "tiny"
    shutil.copytree(tiny_model_dir, out)
    path = out / "processor_config.json"
    config = json.loads(path.read_text())
    for part in ("image_processor", "video_processor"):
        config[part]["size"] = {"longest_edge": RELEASED_MAX_PIXELS, "shortest_edge": 3136}
    path.write_text(json.dumps(config, indent=1))
    return out


def long_video_request(model_dir: Path) -> tuple[RolloutRequest, int]:
    """A rollout request with a 262,144-token video, and its length in tokens."""
    processor = AutoProcessor.from_pretrained(model_dir)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    template = list(processor.tokenizer(text)["input_ids"])
    video_id = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    slot = template.index(video_id)
    ids = template[:slot] + [video_id] * VIDEO_TOKENS + template[slot + 1 :]
    config = load_model(model_dir).config
    layout = PromptLayout.build(ids, video_id, position_rule_of(config), torch.tensor(GRID), 1.0)
    hidden = config.vision_config.out_hidden_size
    return RolloutRequest(layout, layout.encoded_video(torch.zeros(VIDEO_TOKENS, hidden))), len(ids)


def started(engine: VLLMEngine, model_dir: Path) -> VLLMEngine:
    model = load_model(model_dir)
    engine.start(PolicyHandle(str(model_dir), model, AutoProcessor.from_pretrained(model_dir).tokenizer))
    return engine


def test_a_4096_frame_video_is_refused_by_vllm_unless_the_engine_is_sized_for_it(
    released_pixels_model: Path,
) -> None:
    request, length = long_video_request(released_pixels_model)
    shape = RolloutShape(video_tokens=VIDEO_TOKENS, row_tokens=length + 1)
    settings = {"dtype": "float32", "max_num_seqs": 4, "allow_long_max_model_len": True}
    # As after an earlier engine in this process (an in-process engine core caches vLLM's
    # environment as it starts): the engine's own setting must still reach vLLM's config check.
    import vllm.envs

    vllm.envs.enable_envs_cache()

    before = started(VLLMEngine(max_model_len=shape.row_tokens, **settings), released_pixels_model)
    try:
        refusal = before.refusal(request)
    finally:
        before.shutdown()
    assert refusal is not None and "exceeds the pre-allocated encoder cache size 114688" in refusal, refusal

    sized = VLLMEngine(**settings)
    sized.admit(shape, max_position_embeddings=32768)
    assert sized.batched_tokens == VIDEO_TOKENS and sized.llm_args["max_model_len"] == shape.row_tokens
    started(sized, released_pixels_model)
    try:
        assert sized.refusal(request) is None
    finally:
        sized.shutdown()


def test_settings_vllm_would_refuse_are_named_before_start_up() -> None:
    shape = RolloutShape(video_tokens=VIDEO_TOKENS, row_tokens=VIDEO_TOKENS + 5_000)
    engine = VLLMEngine(max_model_len=200_000, max_num_batched_tokens=16_384)
    with pytest.raises(EngineLimitError) as refused:
        engine.admit(shape, max_position_embeddings=128_000)
    message = str(refused.value)
    assert "max_model_len is 200,000" in message and f"max_model_len: {shape.row_tokens}" in message
    assert "max_num_batched_tokens is 16,384" in message and f"at least {VIDEO_TOKENS}" in message
    assert "above the model's max_position_embeddings 128,000" in message
    assert "allow_long_max_model_len: true" in message
    VLLMEngine(allow_long_max_model_len=True).admit(shape, max_position_embeddings=128_000)  # derived: fits
