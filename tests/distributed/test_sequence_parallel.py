"""Sequence-parallel prefill in 2 and 4 real gloo processes against one process.

The reference: :func:`models.logprobs.completion_logprobs` on every row whole, in this process.
The workers: the same rows, the sequence split across the group, Ulysses attention (contiguous
slices) or ring attention in its balanced zigzag layout and in contiguous slices; every row
forwarded whole, and (Ulysses, ring zigzag) each prompt forwarded once with its completions
packed after it (``share_prompts``: the rows of a prompt share its keys and values).
Compared: completion log-probs, entropy, and every parameter's gradient of the same loss plus
the cached video embeddings' gradient, within float32 bars scaled to the values
(``tolerances.FORWARD_ULPS`` / ``GRADIENT_ULPS``): sharding reorders reductions and nothing
else, whatever the thread count (the workers run one thread each, the reference the default).
The rows are real video prompts of two lengths with ragged completions, so the padded length
does not divide the group size and rows end in different slices; the tiny model has 4 query
heads and 2 key/value heads, so at 4 ranks Ulysses repeats the key/value heads (GQA). The rows'
width is a multiple of 4 but not of 8, so zigzag at 4 ranks (8 chunks) pads them itself.

Work balance: each worker counts the query x key scores its ring attention computes (a spy on
``parallel.ring._chunk_scores``); zigzag gives every rank the same count, contiguous slices give
the last rank P times the first's.

Both on the tiny Qwen2.5-VL and on the tiny Qwen3-VL, whose DeepStack features each rank injects
at its own positions' visual tokens (a rank that dropped or misplaced them would move the
log-probs by far more than the bar).

The same processes check stage 1: videos encoded with their temporal patches dealt across the
ranks equal the one-process encoding on every rank, including a video whose patch count does
not divide the group size and a batch with fewer patches than ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from helpers.scoring_helpers import video_scoring_rows
from helpers.tolerances import FORWARD_ULPS, GRADIENT_ULPS, assert_float32_close

from models.loading import load_model
from models.logprobs import completion_logprobs, input_embeddings
from models.vision import encode_videos

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
"""Qwen2.5-VL, and Qwen3-VL for its DeepStack features (each rank injects its own positions'; the
cached encodings' gradient flows through them). Qwen2-VL differs only in the positions, which the
layout computes before any split."""
SHARDINGS = (
    ("ulysses", "contiguous", False),
    ("ring", "zigzag", False),
    ("ring", "contiguous", False),
    ("ulysses", "contiguous", True),
    ("ring", "zigzag", True),
)
"""(attention, ring layout, share prompts): Ulysses always holds contiguous slices."""
# Temporal patches x patch rows x patch columns: 5 + 3 patches (a split inside the first video
# at 2 and at 4 ranks), and a single-patch video (ranks with nothing to encode).
ENCODING_GRIDS = (torch.tensor([[5, 4, 4], [3, 2, 4]]), torch.tensor([[1, 2, 2]]))


def encoding_inputs(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    config = model.config.vision_config
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    generator = torch.Generator().manual_seed(3)
    return [(torch.randn(int(g.prod(dim=-1).sum()), width, generator=generator), g) for g in ENCODING_GRIDS]


def loss_of(logprobs: torch.Tensor) -> torch.Tensor:
    """A loss touching every completion token with a different weight."""
    weights = torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(1))
    return (logprobs * weights).sum()


def name_of(attention: str, layout: str, share: bool) -> str:
    name = attention if attention == "ulysses" else f"ring-{layout}"
    return f"{name}-shared" if share else name


def _worker(rank: int, world_size: int, model_dir: str, inputs: str, store_path: str, out_dir: str) -> None:
    from helpers.group_encoding import group_encoder

    from parallel.prefill import sequence_parallel_completion_logprobs, sum_gradients_over
    from parallel.shard import SequenceShard

    dist.init_process_group(
        "gloo", store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size
    )
    torch.set_num_threads(1)
    import parallel.ring

    parallel.ring.QUERY_CHUNK = 16  # several query chunks per block, so the chunk offsets are exercised
    scores_computed = [0]
    chunk_scores = parallel.ring._chunk_scores

    def counting_chunk_scores(query: torch.Tensor, key: torch.Tensor, *args: object) -> torch.Tensor:
        scores_computed[0] += query.shape[2] * key.shape[2]
        return chunk_scores(query, key, *args)

    parallel.ring._chunk_scores = counting_chunk_scores
    scoring, videos = torch.load(inputs, weights_only=False)
    model = load_model(model_dir).train()
    work = {}
    for attention, layout, share in SHARDINGS:
        model.zero_grad()
        for video in videos:
            video.grad = None
        entropy = torch.zeros(scoring.completion_mask.shape)
        shard = SequenceShard(dist.group.WORLD, attention, ring_layout=layout)
        scores_computed[0] = 0
        embeddings = input_embeddings(model, scoring, videos, torch.device("cpu"))
        logprobs = sequence_parallel_completion_logprobs(
            model, scoring, embeddings, shard, entropy=entropy, share_prompts=share, video_embeds=videos
        )
        loss_of(logprobs).backward()
        sum_gradients_over(list(model.parameters()), shard.group)
        for video in videos:
            dist.all_reduce(video.grad, group=shard.group)
        work[name_of(attention, layout, share)] = scores_computed[0]
        if rank == 0:
            gradients = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            gradients.update({f"video{i}": v.grad for i, v in enumerate(videos)})
            torch.save(
                (logprobs.detach(), entropy, gradients),
                Path(out_dir) / f"{name_of(attention, layout, share)}.pt",
            )
    torch.save(work, Path(out_dir) / f"work-rank{rank}.pt")
    encode = group_encoder(model, dist.group.WORLD)
    encoded = [encode(pixels, grid) for pixels, grid in encoding_inputs(model)]
    torch.save(encoded, Path(out_dir) / f"encoding-rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=FAMILIES)
def reference(
    request: pytest.FixtureRequest,
    family_model_dir,
    synth_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict:
    model_dir = family_model_dir(request.param)
    # Width a multiple of 4, so that 2 and 4 ranks split the rows without re-padding.
    scoring, videos = video_scoring_rows(
        model_dir, synth_dir, [0, 1, 0, 1, 0], [5, 9, 3, 1, 12], length_multiple=4
    )
    folder = tmp_path_factory.mktemp("sp")
    torch.save((scoring, videos), folder / "inputs.pt")
    model = load_model(model_dir).train()
    entropy = torch.zeros(scoring.completion_mask.shape)
    logprobs = completion_logprobs(model, scoring, videos, entropy=entropy, share_prompts=False)
    loss_of(logprobs).backward()
    gradients = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    gradients.update({f"video{i}": v.grad.clone() for i, v in enumerate(videos)})
    with torch.no_grad():
        encoded = [encode_videos(model, pixels, grid) for pixels, grid in encoding_inputs(model)]
    return {
        "model_dir": model_dir,
        "inputs": folder / "inputs.pt",
        "logprobs": logprobs.detach(),
        "entropy": entropy,
        "grads": gradients,
        "encoded": encoded,
    }


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_prefill_matches_one_process(
    world_size: int, reference: dict, tmp_path: Path
) -> None:
    length = reference["logprobs"].shape[0]
    assert length == 5
    scoring, _ = torch.load(reference["inputs"], weights_only=False)
    assert scoring.input_ids.shape[1] % 8 == 4, "zigzag at 4 ranks should have to pad the rows"
    spawn_ranks(
        _worker,
        args=(
            world_size,
            str(reference["model_dir"]),
            str(reference["inputs"]),
            str(tmp_path / "store"),
            str(tmp_path),
        ),
        nprocs=world_size,
    )
    for case in SHARDINGS:
        logprobs, entropy, gradients = torch.load(tmp_path / f"{name_of(*case)}.pt")
        why = f"{world_size} {name_of(*case)} ranks vs one process"
        assert_float32_close(logprobs, reference["logprobs"], ulps=FORWARD_ULPS, reason=f"log-probs, {why}")
        assert_float32_close(entropy, reference["entropy"], ulps=FORWARD_ULPS, reason=f"entropy, {why}")
        assert gradients.keys() == reference["grads"].keys()
        for name, expected in reference["grads"].items():
            assert_float32_close(
                gradients[name], expected, ulps=GRADIENT_ULPS, reason=f"{name} gradient, {why}"
            )
    work = [torch.load(tmp_path / f"work-rank{rank}.pt") for rank in range(world_size)]
    assert [w["ulysses"] for w in work] == [0] * world_size
    zigzag = [w["ring-zigzag"] for w in work]
    contiguous = [w["ring-contiguous"] for w in work]
    assert min(zigzag) > 0 and len(set(zigzag)) == 1, f"zigzag scores per rank {zigzag}"
    assert contiguous == [(rank + 1) * contiguous[0] for rank in range(world_size)], contiguous
    assert max(zigzag) < contiguous[-1]
    for rank in range(world_size):
        encoded = torch.load(tmp_path / f"encoding-rank{rank}.pt")
        for batch, expected in zip(encoded, reference["encoded"], strict=True):
            assert [e.shape for e in batch] == [e.shape for e in expected]
            for video, want in zip(batch, expected, strict=True):
                # Dealing temporal patches across ranks reorders the vision tower's reductions:
                # 1.5e-5 on values near 10 was seen (13 ulps); a patch dealt to the wrong video
                # or position moves embeddings by O(1).
                assert_float32_close(
                    video, want, ulps=FORWARD_ULPS, reason=f"stage-1 encoding, rank {rank} of {world_size}"
                )
