"""Each model family end to end on its tiny model: lvrl's scoring equals the model's own forward.

For every family the collator lays out real video prompts (synthetic shards, decoded with PyAV)
through the family's own processor; lvrl then scores completions from the **cached** video
encodings (the vision tower run once; Qwen3-VL's DeepStack features injected by the family),
every row whole and with the prompt shared by its rows, and the model's own HF forward scores
the same rows from pixels, at lvrl's positions. Qwen3-VL's own ``get_rope_index`` gives lvrl's
positions exactly; transformers' Qwen2-VL and Qwen2.5-VL rule differs from vLLM's after the
video (``core.positions`` says why), and lvrl follows vLLM's. Dropping DeepStack must move
Qwen3-VL's scores far beyond the bar, or the test could not see it missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.scoring_helpers import video_scoring_rows
from helpers.tolerances import FORWARD_ULPS, assert_float32_close
from transformers import AutoProcessor

from families import family_of
from models.loading import load_model
from models.logprobs import completion_logprobs

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")


def own_forward_logprobs(model: torch.nn.Module, scoring, pixels, grids, position_ids) -> torch.Tensor:
    """The model's own forward from pixels, one row at a time, at the given positions."""
    out = torch.zeros(scoring.completion_mask.shape)
    offsets = [0, *grids.prod(dim=-1).cumsum(0).tolist()]
    for row, prompt in enumerate(scoring.prompt_of_row):
        length = int(scoring.attention_mask[row].sum())
        ids = scoring.input_ids[row : row + 1, :length]
        logits = model(
            input_ids=ids,
            pixel_values_videos=pixels[offsets[prompt] : offsets[prompt + 1]],
            video_grid_thw=grids[prompt : prompt + 1],
            position_ids=position_ids[:, row : row + 1, :length],
        ).logits[0]
        start, count = scoring.prompt_lengths[row], int(scoring.completion_mask[row].sum())
        targets = scoring.completion_ids[row, :count]
        log_probs = torch.log_softmax(logits[start - 1 : start - 1 + count].float(), dim=-1)
        out[row, :count] = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def family_rows(request: pytest.FixtureRequest, family_model_dir, synth_dir: Path) -> dict:
    directory = family_model_dir(request.param)
    scoring, videos = video_scoring_rows(directory, synth_dir, [0, 1, 0, 1], [5, 9, 3, 1])
    model = load_model(directory)
    processor = AutoProcessor.from_pretrained(directory)
    return {
        "name": request.param,
        "dir": directory,
        "model": model,
        "processor": processor,
        "scoring": scoring,
        "videos": [v.detach() for v in videos],
    }


def pixels_of(rows: dict, synth_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The two prompts' pixel patches and grids, as the collator gave them."""
    from datamodules.collate import VideoQACollator
    from datamodules.shards import resolve_shards
    from datamodules.stream import VideoQAStream

    family = family_of(rows["model"].config)
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = [s for _, s in zip(range(2), stream, strict=False)]
    batch = VideoQACollator(rows["processor"], family=family)(samples)
    return batch["pixel_values_videos"], batch["video_grid_thw"]


@torch.no_grad()
def test_scoring_from_cached_encodings_equals_the_models_own_forward(
    family_rows: dict, synth_dir: Path
) -> None:
    model, scoring, videos = family_rows["model"], family_rows["scoring"], family_rows["videos"]
    family = family_of(model.config)
    assert videos[0].shape[1] == family.visual_width
    pixels, grids = pixels_of(family_rows, synth_dir)
    if family.name == "qwen3_vl":
        # The model's own rule gives lvrl's positions (one row at a time, no padding).
        for row in range(len(scoring.prompt_of_row)):
            length = int(scoring.attention_mask[row].sum())
            ids = scoring.input_ids[row : row + 1, :length]
            grid = grids[scoring.prompt_of_row[row] : scoring.prompt_of_row[row] + 1]
            kinds = (ids == model.config.video_token_id).int() * 2
            own, _ = model.model.get_rope_index(ids, kinds, None, grid.clone())
            assert torch.equal(own, scoring.position_ids[:, row : row + 1, :length]), f"row {row}"
    expected = own_forward_logprobs(model, scoring, pixels, grids, scoring.position_ids)
    for share in (False, True):
        ours = completion_logprobs(model, scoring, videos, share_prompts=share)
        assert_float32_close(
            ours,
            expected,
            ulps=FORWARD_ULPS,
            reason=f"{family_rows['name']}, cached encodings (shared prompts: {share}) vs its own forward",
        )
    if family.name == "qwen3_vl":
        # Zero DeepStack features add nothing to the hidden states: the scores without them.
        without_deepstack = [
            torch.cat([v[:, : family.language_width], 0 * v[:, family.language_width :]], 1) for v in videos
        ]
        dropped = completion_logprobs(model, scoring, without_deepstack, share_prompts=False)
        mask = scoring.completion_mask.bool()
        assert (dropped - expected)[mask].abs().max() > 1e-2, "DeepStack features seem to have no effect"


def test_a_qwen3_vl_moe_export_is_in_the_released_layout(family_model_dir, tmp_path: Path) -> None:
    from safetensors import safe_open

    from models.export import save_hf_model
    from models.loading import load_processor

    source = family_model_dir("qwen3_vl_moe")
    model = load_model(source)
    out = save_hf_model(model, load_processor(source), tmp_path / "export")
    name = next(n for n, _ in model.named_parameters() if n.endswith("mlp.experts.down_proj"))
    held = dict(model.named_parameters())[name]  # (experts, hidden, width) in memory
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as weights:
        keys = weights.keys()  # (a safetensors handle is not iterable)
        stored = weights.get_tensor(next(k for k in keys if k.endswith("mlp.experts.down_proj")))
    assert stored.shape == (held.shape[0], held.shape[2], held.shape[1])  # what vLLM reads
    reloaded = dict(load_model(out).named_parameters())
    for parameter_name, parameter in model.named_parameters():
        assert torch.equal(reloaded[parameter_name], parameter), parameter_name
