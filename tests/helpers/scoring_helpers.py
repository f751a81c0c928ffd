"""Real video rows in the rollout layout, for tests of completion scoring."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoProcessor

from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from models.loading import load_model
from models.logprobs import ScoringBatch, build_scoring_batch
from models.vision import encode_videos
from rollout.base import VideoEmbedding


def video_scoring_rows(
    model_dir: Path, synth_dir: Path, which: list[int], completion_lengths: list[int], seed: int = 0
) -> tuple[ScoringBatch, list[torch.Tensor]]:
    """Rows ``prompt[which[i]] + random completion of completion_lengths[i]`` over two val videos.

    The two prompts differ in length. Returned video tensors require grad and rows of one
    prompt share the same tensor object, as the rollout callback hands them over.
    """
    processor = AutoProcessor.from_pretrained(model_dir)
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = [s for _, s in zip(range(2), stream, strict=False)]
    batch = VideoQACollator(processor)(samples)
    model = load_model(model_dir)
    with torch.no_grad():
        videos = encode_videos(model, batch["pixel_values_videos"], batch["video_grid_thw"])
    prompts, embeddings = [], []
    for row in range(2):
        labelled = batch["labels"][row] != -100
        ids = batch["input_ids"][row][batch["attention_mask"][row].bool()]
        prompts.append(ids[: int(labelled.nonzero()[0])])
        embeddings.append(
            VideoEmbedding(videos[row], batch["video_grid_thw"][row], float(batch["second_per_grid_ts"][row]))
        )
    assert len(prompts[0]) != len(prompts[1])
    generator = torch.Generator().manual_seed(seed)
    completions = [torch.randint(20, 300, (n,), generator=generator).tolist() for n in completion_lengths]
    tokenizer = processor.tokenizer
    scoring = build_scoring_batch(
        [prompts[k].tolist() for k in which],
        completions,
        [embeddings[k] for k in which],
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        pad_token_id=tokenizer.pad_token_id,
        spatial_merge_size=2,
        tokens_per_second=float(model.config.vision_config.tokens_per_second),
    )
    trainable = [v.clone().requires_grad_(True) for v in videos]
    return scoring, [trainable[k] for k in which]
