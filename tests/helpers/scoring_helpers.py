"""Real video prompts and rows in the rollout layout, for tests of rollouts and completion scoring."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoProcessor

from core.layout import ScoringBatch
from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from families import family_of
from models.loading import load_model
from models.vision import encode_videos
from rollout.experience import PromptBatch


def prompt_batch(
    model_dir: Path,
    synth_dir: Path,
    *,
    count: int = 2,
    start: int = 0,
    num_frames: int = 8,
    split: str = "val",
) -> PromptBatch:
    """Samples ``start`` to ``start + count`` of a synthetic split, collated as rollout prompts
    for ``model_dir``."""
    stream = VideoQAStream(
        resolve_shards(str(synth_dir / f"{split}-*.tar")), num_frames=num_frames, max_pixels=56 * 56
    )
    samples = [s for _, s in zip(range(start + count), stream, strict=False)][start:]
    family = family_of(AutoConfig.from_pretrained(model_dir))
    return PromptBatch.of(VideoQACollator(AutoProcessor.from_pretrained(model_dir), family=family)(samples))


def video_scoring_rows(
    model_dir: Path,
    synth_dir: Path,
    which: list[int],
    completion_lengths: list[int],
    seed: int = 0,
    length_multiple: int = 1,
) -> tuple[ScoringBatch, list[torch.Tensor]]:
    """Rows ``prompt[which[i]] + random completion of completion_lengths[i]`` over two val videos.

    The two prompts differ in length. Returned are the scoring rows (``prompt_of_row`` is
    ``which``) and the two prompts' video encodings, which require grad.
    """
    processor = AutoProcessor.from_pretrained(model_dir)
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = [s for _, s in zip(range(2), stream, strict=False)]
    model = load_model(model_dir)
    batch = VideoQACollator(processor, family=family_of(model.config))(samples)
    with torch.no_grad():
        videos = encode_videos(model, batch["pixel_values_videos"], batch["video_grid_thw"])
    prompts = batch["prompts"]
    assert len(prompts[0]) != len(prompts[1])
    generator = torch.Generator().manual_seed(seed)
    completions = [torch.randint(20, 300, (n,), generator=generator).tolist() for n in completion_lengths]
    pad = processor.tokenizer.pad_token_id
    scoring = ScoringBatch.from_layouts(
        prompts, completions, which, pad_token_id=pad, length_multiple=length_multiple
    )
    return scoring, [v.clone().requires_grad_(True) for v in videos]
