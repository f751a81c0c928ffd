"""The SFT module: loss over assistant tokens only, frozen vision tower, checkpointing, LR schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.tolerances import FORWARD_ULPS, assert_float32_close
from transformers import AutoConfig, AutoProcessor

from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from families import family_of
from models.sft import SFTModule
from models.vision import vision_tower


@pytest.fixture(scope="module")
def batch(tiny_model_dir: Path, synth_dir: Path) -> dict:
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = [s for _, s in zip(range(2), stream, strict=False)]
    family = family_of(AutoConfig.from_pretrained(tiny_model_dir))
    return VideoQACollator(AutoProcessor.from_pretrained(tiny_model_dir), family=family)(samples)


def test_loss_is_the_mean_over_assistant_tokens(tiny_model_dir: Path, batch: dict) -> None:
    module = SFTModule(str(tiny_model_dir))
    module.configure_model()
    loss = module.token_mean_loss(batch)
    logits = module.forward_logits(batch).float()
    # By hand: log-softmax at each position predicts the next token; average over labelled ones.
    terms = []
    for i in range(batch["input_ids"].shape[0]):
        for t in range(1, batch["input_ids"].shape[1]):
            label = int(batch["labels"][i, t])
            if label != -100:
                terms.append(-torch.log_softmax(logits[i, t - 1], dim=-1)[label])
    assert len(terms) == int((batch["labels"] != -100).sum())
    # The same logits (same module, same batch) reduced two ways: the loss's fused log-softmax
    # and token mean vs a log_softmax per position and a stacked mean. Each reorders a
    # reduction over 1024 logits and one over the labelled tokens: a few ulps of the loss (~7);
    # 64 ulps bound it, and a token off by one position changes the loss by >= 1e-2.
    assert_float32_close(loss, torch.stack(terms).mean(), ulps=64, reason="module loss vs hand token mean")


def test_frozen_vision_and_gradient_checkpointing(tiny_model_dir: Path, batch: dict) -> None:
    module = SFTModule(str(tiny_model_dir), freeze_vision=True, gradient_checkpointing=True)
    module.configure_model()
    assert module.model.is_gradient_checkpointing and module.model.training
    module.token_mean_loss(batch).backward()
    tower = vision_tower(module.model)
    assert all(p.grad is None and not p.requires_grad for p in tower.parameters())
    text_grads = [p.grad for n, p in module.model.named_parameters() if "language_model" in n]
    assert text_grads and all(g is not None for g in text_grads)
    optimizer = module.configure_optimizers()["optimizer"]
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in tower.parameters()}


def test_warmup_then_constant_learning_rate(tiny_model_dir: Path) -> None:
    module = SFTModule(str(tiny_model_dir), learning_rate=1e-3, warmup_steps=4)
    module.configure_model()
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.25e-3, 0.5e-3, 0.75e-3, 1e-3, 1e-3, 1e-3])
    with pytest.raises(ValueError, match="max_steps"):
        SFTModule(str(tiny_model_dir), lr_schedule="cosine").configure_optimizers()
    with pytest.raises(ValueError, match="lr_schedule"):
        SFTModule(str(tiny_model_dir), lr_schedule="linear")


def test_sft_forward_scores_like_the_rl_scorer(tiny_model_dir: Path, batch: dict) -> None:
    """SFT teacher forcing and RL scoring see the same layout and positions: same log-probs."""
    from core.layout import ScoringBatch
    from models.logprobs import completion_logprobs
    from models.vision import encode_videos

    module = SFTModule(str(tiny_model_dir))
    module.configure_model()
    model = module.model.eval()
    with torch.no_grad():
        logits = module.forward_logits(batch).float()
        videos = encode_videos(model, batch["pixel_values_videos"], batch["video_grid_thw"])
    prompts, targets = [], []
    for row, layout in enumerate(batch["prompts"]):
        labelled = batch["labels"][row] != -100
        start = int(labelled.nonzero()[0])
        # The RL prompt layout is the SFT row's prompt part, token for token.
        assert torch.equal(layout.token_ids, batch["input_ids"][row][:start])
        prompts.append(layout.token_ids.tolist())
        targets.append(batch["input_ids"][row][labelled].tolist())
    scoring = ScoringBatch.from_layouts(
        batch["prompts"], targets, range(len(targets)), pad_token_id=module.processor.tokenizer.pad_token_id
    )
    with torch.no_grad():
        scored = completion_logprobs(model, scoring, videos)
    for row, (prompt, target) in enumerate(zip(prompts, targets, strict=True)):
        sft = torch.log_softmax(logits[row, len(prompt) - 1 : len(prompt) - 1 + len(target)], dim=-1)
        sft = sft.gather(-1, torch.tensor(target).unsqueeze(-1)).squeeze(-1)
        assert_float32_close(
            scored[row, : len(target)],
            sft,
            ulps=FORWARD_ULPS,
            reason=f"row {row}: RL scorer vs SFT teacher forcing",
        )


def test_the_loss_computes_logits_only_where_labels_are_predicted(tiny_model_dir: Path, batch: dict) -> None:
    """Logits from the position before the first label on (a long prompt's would dominate
    memory), and the same loss as from every position's logits. The kept positions' logits are
    products of the same hidden states, but a matrix product over fewer rows may be blocked
    differently by the BLAS (by CPU model, and seen once under load): equal within the forward
    bar of the loss's scale, measured 9.5e-7 (2 ulps of the loss) where not identical; logits
    of a wrong position would differ by far more."""
    module = SFTModule(str(tiny_model_dir))
    module.configure_model()
    first_label = int((batch["labels"] != -100).any(dim=0).nonzero()[0])
    assert first_label > batch["input_ids"].shape[1] // 2  # the prompt is most of the row
    logits = module.forward_logits(batch)[:, :-1].float()
    every_position = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1)
    )
    assert_float32_close(
        module.token_mean_loss(batch),
        every_position,
        ulps=FORWARD_ULPS,
        reason="kept logits vs every position's",
    )
