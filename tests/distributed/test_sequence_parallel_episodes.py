"""Sequence-parallel tool-use episodes in 2 gloo processes against one process: scoring their
rows, and playing them (each peer samples a share of every round, the group encodes the replies'
frames together).

The rows: two episodes of one real video prompt (tiny Qwen2.5-VL, and Qwen3-VL, whose DeepStack
features each rank injects at its own visual tokens, the segments' included), each a request turn, the
tool's reply holding a different served segment of 4 frames, and a last turn. Their width is
split across the ranks so that segments and turns fall in different slices; Ulysses (every row
whole, and the prompt shared by both rows) and ring attention in its zigzag layout are compared
with :func:`models.logprobs.completion_logprobs` in one process: log-probs (zero at the replies)
and the gradients of the same loss, parameters and cached encodings (prompt video and segments),
within the float32 bars of the other sequence-parallel tests (sharding reorders reductions); and
the positions the LM head computes logits for, over both ranks, are exactly those that predict a
sampled token.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.episode_helpers import ScriptedEngine, video_prompt
from helpers.ranks import spawn_ranks
from helpers.tolerances import FORWARD_ULPS, GRADIENT_ULPS, assert_float32_close

from core.tool_use.episode import episode_scoring_batch
from core.tool_use.requests import FrameBudget
from models.loading import load_model
from models.logprobs import completion_logprobs, input_embeddings
from rollout.base import SamplingConfig
from rollout.episodes import run_episodes

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
    # Positions the LM head computes logits for on this rank (hidden states come in as
    # (rows, positions, hidden)).
    head_positions: list[int] = []
    model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: head_positions.append(args[0].shape[1])
    )
    for attention, layout, share in SHARDINGS:
        head_positions.clear()
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
        computed = torch.tensor(sum(head_positions))
        dist.all_reduce(computed, group=shard.group)
        if rank == 0:
            gradients = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            gradients.update({f"video{i}": v.grad for i, v in enumerate(leaves(prompt_video, segments))})
            results = (logprobs.detach(), gradients, int(computed))
            torch.save(results, Path(out_dir) / f"{attention}-{layout}-{share}.pt")
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
    spawn_ranks(
        _worker,
        args=(2, str(model_dir), str(tmp_path / "inputs.pt"), str(tmp_path / "store"), str(tmp_path)),
        nprocs=2,
    )
    sampled = scoring.completion_mask > 0
    for attention, layout, share in SHARDINGS:
        logprobs, gradients, head_positions = torch.load(tmp_path / f"{attention}-{layout}-{share}.pt")
        why = f"2 ranks {attention} {layout} (shared prompt: {share}) vs one process, episode rows"
        # Logits only where a sampled token is predicted, over both ranks: with rows whole, the
        # rows' sampled positions in common count once (both rows have the one prompt's length);
        # packed after a shared prompt, each completion has positions of its own. Not the prompt's
        # video, not the tool's served frames.
        expected_positions = int(sampled.sum()) if share else int(sampled.any(dim=0).sum())
        # (Every position would be at least one row's width: the count tells the two apart.)
        assert expected_positions < scoring.input_ids.shape[1]
        assert head_positions == expected_positions, why
        assert_float32_close(logprobs, expected.detach(), ulps=FORWARD_ULPS, reason=f"log-probs, {why}")
        assert gradients.keys() == reference.keys()
        for name, want in reference.items():
            assert_float32_close(gradients[name], want, ulps=GRADIENT_ULPS, reason=f"{name} gradient, {why}")


BUDGET = FrameBudget(max_calls=1, frames_per_call=4, frames_per_episode=4)
SAMPLING = SamplingConfig(n=3, max_new_tokens=64, seed=4)


def scripts_of(prompt) -> list[list[list[int]]]:
    """Per prompt: two episodes that ask for different spans, then answer; one that answers."""
    answer = prompt.ids("<think>seen</think><answer>B</answer><|im_end|>")
    return [
        [prompt.ids("<think>a</think>") + prompt.request_ids(1, 5), answer],
        [prompt.ids("<think>b</think>") + prompt.request_ids(5, 9), answer],
        [answer],
    ]


class CountingEngine(ScriptedEngine):
    """The scripted engine, counting the items of each call it gets."""

    def __init__(self, scripts: list[list[list[int]]]) -> None:
        super().__init__(scripts)
        self.items: list[int] = []

    def generate(self, requests, sampling):
        self.items.append(len(requests))
        return super().generate(requests, sampling)

    def generate_turns(self, requests, sampling):
        self.items.append(len(requests))
        return super().generate_turns(requests, sampling)


def _episode_worker(rank: int, world_size: int, model_dir: str, synth_dir: str, store: str, out: str) -> None:
    from functools import partial

    from helpers.group_encoding import group_encoder

    from parallel.collectives import share_out

    dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    prompt = video_prompt(Path(model_dir), Path(synth_dir))

    engine = CountingEngine(scripts_of(prompt))
    groups, stats = run_episodes(
        engine,
        [prompt.request(), prompt.request()],
        [prompt.source, prompt.source],
        SAMPLING,
        prompt.tool(BUDGET, group_encoder(prompt.model, dist.group.WORLD)),
        partial(share_out, group=dist.group.WORLD),
    )
    episodes = [(e.token_ids, e.sampled, [s.embeds for s in e.segments]) for g in groups for e in g]
    torch.save((episodes, engine.items, stats.served_frames), Path(out) / f"episodes-rank{rank}.pt")
    dist.destroy_process_group()


def test_sequence_parallel_peers_play_the_episodes_of_one_process(
    tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    prompt = video_prompt(tiny_model_dir, synth_dir)
    with torch.no_grad():
        groups, _ = run_episodes(
            ScriptedEngine(scripts_of(prompt)),
            [prompt.request(), prompt.request()],
            [prompt.source, prompt.source],
            SAMPLING,
            prompt.tool(BUDGET),
        )
    alone = [e for g in groups for e in g]
    spawn_ranks(
        _episode_worker,
        args=(2, str(tiny_model_dir), str(synth_dir), str(tmp_path / "store"), str(tmp_path)),
        nprocs=2,
    )
    ranks = [torch.load(tmp_path / f"episodes-rank{r}.pt", weights_only=False) for r in range(2)]
    for rank, (episodes, items, served) in enumerate(ranks):
        # Each peer sampled half of every call: 1 of the 2 first-turn requests, 2 of the 4 asks.
        assert items == [1, 2] and served == 16, rank
        for (token_ids, sampled, segments), expected in zip(episodes, alone, strict=True):
            assert token_ids == expected.token_ids and sampled == expected.sampled
            assert len(segments) == len(expected.segments)
            for ours, theirs in zip(segments, expected.segments, strict=True):
                why = f"rank {rank}: a segment encoded by the group vs one process"
                assert_float32_close(ours, theirs.embeds, ulps=FORWARD_ULPS, reason=why)
    # Every peer holds the same episodes, the same encodings.
    for (_, _, ours), (_, _, theirs) in zip(ranks[0][0], ranks[1][0], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
