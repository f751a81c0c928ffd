"""Completion scoring: a prompt forwarded once for all its completions equals every row forwarded whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.scoring_helpers import video_scoring_rows
from helpers.tolerances import FORWARD_ULPS, GRADIENT_ULPS, assert_float32_close

from core.layout import ScoringBatch
from models.loading import load_model
from models.logprobs import completion_logprobs, first_row_of_prompt


@pytest.fixture(scope="module")
def video_rows(tiny_model_dir: Path, synth_dir: Path) -> tuple[ScoringBatch, list[torch.Tensor]]:
    """Six rows over two real video prompts, in GRPO's layout but shuffled and ragged.

    Rows 0, 1, 2 and 5 share prompt A (so its rows are not contiguous), rows 3 and 4 share
    prompt B (a different length), row 2 has an empty completion, completions differ in length.
    """
    return video_scoring_rows(tiny_model_dir, synth_dir, [0, 0, 0, 1, 1, 0], [5, 9, 0, 3, 7, 1])


def scores_and_gradients(
    model: torch.nn.Module, scoring: ScoringBatch, videos: list[torch.Tensor], share: bool
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    for video in videos:
        video.grad = None
    entropy = torch.zeros(scoring.completion_mask.shape)
    logprobs = completion_logprobs(model, scoring, videos, entropy=entropy, share_prompts=share)
    weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))
    (logprobs * weights).sum().backward()
    gradients = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    gradients.update({f"video{i}": v.grad.clone() for i, v in enumerate(videos) if v.grad is not None})
    return logprobs.detach(), entropy, gradients


def test_rows_of_one_prompt_are_grouped(video_rows: tuple[ScoringBatch, list[torch.Tensor]]) -> None:
    scoring, _ = video_rows
    assert scoring.prompt_of_row == [0, 0, 0, 1, 1, 0]
    assert first_row_of_prompt(scoring) == [0, 0, 0, 3, 3, 0]


def test_shared_prompt_scoring_equals_whole_rows(
    tiny_model_dir: Path, video_rows: tuple[ScoringBatch, list[torch.Tensor]]
) -> None:
    scoring, videos = video_rows
    model = load_model(tiny_model_dir).train()
    whole, whole_entropy, whole_grads = scores_and_gradients(model, scoring, videos, share=False)
    shared, shared_entropy, shared_grads = scores_and_gradients(model, scoring, videos, share=True)
    valid = scoring.completion_mask.bool()
    assert int(valid.sum()) == 25 and whole[valid].abs().min() > 0
    # Sharing a prompt pass reorders the batch's reductions, nothing else: float32 bars scaled
    # to the values (FORWARD_ULPS, GRADIENT_ULPS say why); a row scored against another row's
    # prompt or positions is off by >= 1e-2, thousands of bars.
    why = "one prompt pass shared by its rows vs every row whole"
    assert_float32_close(shared, whole, ulps=FORWARD_ULPS, reason=f"log-probs, {why}")
    assert_float32_close(shared_entropy, whole_entropy, ulps=FORWARD_ULPS, reason=f"entropy, {why}")
    assert whole_grads.keys() == shared_grads.keys() and "video0" in whole_grads
    for name, gradient in whole_grads.items():
        assert_float32_close(
            shared_grads[name], gradient, ulps=GRADIENT_ULPS, reason=f"{name} gradient, {why}"
        )
    # And both equal scoring each row on its own (no batching or padding effects).
    with torch.no_grad():
        for row in range(len(scoring.prompt_lengths)):
            alone = completion_logprobs(model, scoring.select([row]), videos)
            assert_float32_close(
                alone[0], whole[row], ulps=FORWARD_ULPS, reason=f"row {row} alone vs in the batch"
            )


def test_shared_prompt_gradients_are_the_same_in_every_run_on_two_threads(
    tiny_model_dir: Path, synth_dir: Path
) -> None:
    # The rows of a prompt add their gradients into its one prompt pass; on several threads that
    # sum must still be taken in one order (exact resume and reruns depend on it). Advanced
    # indexing's backward adds with atomics once a selection has 32768 elements (torch's grain
    # size; 16 rows of the tiny model's prompt keys exceed it) and then differed in most repeats.
    scoring, videos = video_scoring_rows(tiny_model_dir, synth_dir, [0] * 16, [3] * 16)
    model = load_model(tiny_model_dir).train()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _, _, first = scores_and_gradients(model, scoring, videos, share=True)
        for repeat in range(12):
            _, _, again = scores_and_gradients(model, scoring, videos, share=True)
            for name, gradient in first.items():
                assert torch.equal(again[name], gradient), f"{name} gradient differs in repeat {repeat}"
    finally:
        torch.set_num_threads(threads)
