"""The collator: SFT labels cover exactly the assistant tokens; prompts match between layouts."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers.tolerances import assert_float32_close
from transformers import AutoConfig, AutoProcessor

from datamodules.collate import IGNORE_INDEX, VideoQACollator
from datamodules.prompts import assistant_target
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from families import family_of
from rewards.registry import SAMPLE_FIELDS


def _batch(model_dir: Path, synth_dir: Path, n: int = 3):
    processor = AutoProcessor.from_pretrained(model_dir)
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = [s for _, s in zip(range(n), stream, strict=False)]
    family = family_of(AutoConfig.from_pretrained(model_dir))
    collator = VideoQACollator(processor, with_targets=True, family=family)
    return processor, samples, collator(samples)


def test_label_mask_covers_exactly_the_assistant_tokens(tiny_model_dir: Path, synth_dir: Path) -> None:
    processor, samples, batch = _batch(tiny_model_dir, synth_dir)
    tokenizer = processor.tokenizer
    for i, sample in enumerate(samples):
        labelled = batch["labels"][i] != IGNORE_INDEX
        # The labelled span is one contiguous block that decodes to the target and the end of turn.
        positions = labelled.nonzero().flatten()
        assert (positions == torch.arange(positions[0], positions[-1] + 1)).all()
        target_ids = batch["labels"][i][labelled]
        assert torch.equal(target_ids, batch["input_ids"][i][labelled])
        assert tokenizer.decode(target_ids) == assistant_target(sample.row) + "<|im_end|>"
        # Everything before it is the prompt, which is exactly the generation prompt.
        prompt_len = int(positions[0])
        prompt = batch["prompts"][i].token_ids
        assert torch.equal(prompt, batch["input_ids"][i][:prompt_len])
        assert tokenizer.decode(prompt).rstrip().endswith("<|im_start|>assistant")
        # Padding is neither attended nor labelled.
        pad = batch["attention_mask"][i] == 0
        assert not labelled[pad].any()


def test_video_tokens_and_metadata(tiny_model_dir: Path, synth_dir: Path) -> None:
    _, samples, batch = _batch(tiny_model_dir, synth_dir)
    grid = batch["video_grid_thw"]
    assert grid.shape == (len(samples), 3) and grid.tolist()[0] == [4, 4, 4]  # 8 frames of 56x56
    merged_tokens_per_video = (grid.prod(-1) // 4).tolist()
    for i in range(len(samples)):
        assert int(batch["video_mask"][i].sum()) == merged_tokens_per_video[i]
        assert int(batch["prompts"][i].video_slots.sum()) == merged_tokens_per_video[i]
        assert not batch["video_mask"][i][batch["labels"][i] != IGNORE_INDEX].any()
    # 20 frames at 2 fps = 10 s; 8 sampled frames -> 0.8 fps -> a temporal patch (2 frames) spans 2.5 s.
    # 2 frames / 0.8 fps: two float roundings of a value exact in binary, so a few ulps at most.
    assert_float32_close(
        batch["second_per_grid_ts"], torch.full((len(samples),), 2.5), ulps=4, reason="2 frames / 0.8 fps"
    )
    assert batch["pixel_values_videos"].shape[0] == int(grid.prod(-1).sum())
    assert [m["key"] for m in batch["meta"]] == [s.key for s in samples]
    # Every sample field a reward function may ask for (rewards.registry.SAMPLE_FIELDS) is there.
    assert all(set(SAMPLE_FIELDS) <= set(m) for m in batch["meta"])
    assert [m["reasoning"] for m in batch["meta"]] == [s.row.reasoning for s in samples]
    assert len({int(p.token_ids[-1]) for p in batch["prompts"]}) == 1  # every prompt ends alike
