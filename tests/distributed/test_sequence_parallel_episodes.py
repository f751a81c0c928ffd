"""Sequence-parallel scoring of tool-use episode rows in 2 gloo processes against one process.

The rows: two episodes of one real video prompt (tiny Qwen2.5-VL, and Qwen3-VL, whose DeepStack
features each rank injects at its own visual tokens, the segments' included), each a request turn, the
tool's reply holding a different served segment of 4 frames, and a last turn. Their width is
split across the ranks so that segments and turns fall in different slices; Ulysses (every row
whole, and the prompt shared by both rows) and ring attention in its zigzag layout are compared
with :func:`models.logprobs.completion_logprobs` in one process: log-probs (zero at the replies)
and the gradients of the same loss, parameters and cached encodings (prompt video and segments),
within the float32 bars of the other sequence-parallel tests (sharding reorders reductions).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers.episode_helpers import video_prompt
from helpers.tolerances import FORWARD_ULPS, GRADIENT_ULPS, assert_float32_close

from core.episode import episode_scoring_batch
from models.loading import load_model
from models.logprobs import completion_logprobs, input_embeddings

SHARDINGS = (("ulysses", "contiguous", False), ("ulysses", "contiguous", True), ("ring", "zigzag", True))


def loss_of(logprobs: torch.Tensor) -> torch.Tensor:
    weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))
    return (logprobs * weights).sum()


def leaves(prompt_video: torch.Tensor, segments: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [prompt_video, *(s for row in segments for s in row)]


def _worker(rank: int, world_size: int, model_dir: str, inputs: str, store: str, out_dir: str) -> None:
    from parallel.prefill import sequence_parallel_completion_logprobs, sum_gradients_over
    from parallel.shard import SequenceShard

    dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    scoring, prompt_video, segments = torch.load(inputs, weights_only=False)
    model = load_model(model_dir).train()
    for attention, layout, share in SHARDINGS:
        model.zero_grad()
        for leaf in leaves(prompt_video, segments):
            leaf.grad = None
        shard = SequenceShard(dist.group.WORLD, attention, ring_layout=layout)
        embeddings = input_embeddings(model, scoring, [prompt_video], torch.device("cpu"), segments)
        logprobs = sequence_parallel_completion_logprobs(
            model,
            scoring,
            embeddings,
            shard,
            share_prompts=share,
            video_embeds=[prompt_video],
            segment_embeds=segments,
        )
        loss_of(logprobs).backward()
        sum_gradients_over(list(model.parameters()), shard.group)
        for leaf in leaves(prompt_video, segments):
            dist.all_reduce(leaf.grad, group=shard.group)
        if rank == 0:
            gradients = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            gradients.update({f"video{i}": v.grad for i, v in enumerate(leaves(prompt_video, segments))})
            torch.save((logprobs.detach(), gradients), Path(out_dir) / f"{attention}-{layout}-{share}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_episode_rows_score_sequence_parallel_as_in_one_process(
    family: str, family_model_dir, synth_dir: Path, tmp_path: Path
) -> None:
    model_dir = family_model_dir(family)
    prompt = video_prompt(model_dir, synth_dir)
    episodes = []
    for first in (2, 10):
        episode, _, _ = prompt.served_episode(tuple(range(first, first + 8, 2)))
        last = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
        episode.add_turn(last, [0.0] * len(last), "stop")
        episodes.append(episode)
    scoring = episode_scoring_batch(
        episodes, [0, 0], prompt.family.position_rule, pad_token_id=prompt.processor.tokenizer.pad_token_id
    )
    prompt_video = prompt.video_embeds.clone().requires_grad_(True)
    segments = [[e.segments[0].embeds.clone().requires_grad_(True)] for e in episodes]
    torch.save((scoring, prompt_video, segments), tmp_path / "inputs.pt")
    model = load_model(model_dir).train()
    expected = completion_logprobs(
        model, scoring, [prompt_video], share_prompts=False, segment_embeds=segments
    )
    loss_of(expected).backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    reference.update({f"video{i}": v.grad.clone() for i, v in enumerate(leaves(prompt_video, segments))})
    assert (expected[scoring.completion_mask == 0] == 0).all() and expected.abs().sum() > 0
    mp.start_processes(
        _worker,
        args=(2, str(model_dir), str(tmp_path / "inputs.pt"), str(tmp_path / "store"), str(tmp_path)),
        nprocs=2,
        start_method="spawn",
    )
    for attention, layout, share in SHARDINGS:
        logprobs, gradients = torch.load(tmp_path / f"{attention}-{layout}-{share}.pt")
        why = f"2 ranks {attention} {layout} (shared prompt: {share}) vs one process, episode rows"
        assert_float32_close(logprobs, expected.detach(), ulps=FORWARD_ULPS, reason=f"log-probs, {why}")
        assert gradients.keys() == reference.keys()
        for name, want in reference.items():
            assert_float32_close(gradients[name], want, ulps=GRADIENT_ULPS, reason=f"{name} gradient, {why}")
