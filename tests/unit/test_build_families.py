"""``lvrl model build --family``: every family's tiny directory builds, loads, runs, keeps our frames.

Per family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE): the directory loads through the
Auto classes as its own family, the config's special-token ids are the tokenizer's, the
model's own forward runs on the processor's output for a short video, and the processor
leaves frames of the family's accepted sizes untouched. Qwen3-VL's prompt layout (timestamps
between frames) is pinned token by token. The default family's directories are pinned by
digest: they are what ``lvrl model build`` wrote before families existed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.tolerances import FORWARD_ULPS, assert_float32_close, assert_identical

from core.tool_use.requests import TOOL_TAGS
from families.presets import DEFAULT_FAMILY, FAMILIES
from families.presets.qwen3_vl import VIDEO_MAX_PIXELS, mrope_section
from models.build import PRESETS, build_model, build_model_dir, count_parameters
from models.loading import load_model, load_processor
from models.tokenizer import CHAT_TEMPLATE, chat_template

QUESTION = "What happens?"
VIDEO_MESSAGES = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]
# 4 frames sampled at 1 fps: the temporal patches (2 frames each) are centred on 0.5 s and 2.5 s.
METADATA = {"fps": 1.0, "total_num_frames": 4, "frames_indices": [0, 1, 2, 3], "duration": 4.0}

# What `lvrl model build --preset P` wrote before --family existed (main at dfdc460), file by
# file: sha256 of the bytes, or of the JSON without its "transformers_version" for the files
# that record it (first 16 hex digits).
DEFAULT_FAMILY_DIGESTS = {
    "tiny": {
        "chat_template.jinja": "b310f89b9a1787e1",
        "config.json": "e5110adda4b54c6a",
        "generation_config.json": "6d3dee8f002bfc96",
        "model.safetensors": "85fdea9fb704ea72",
        "processor_config.json": "b4b48818e01233ee",
        "tokenizer.json": "1441abdce45bffae",
        "tokenizer_config.json": "f9dadc88d9e36a0b",
    },
    "small": {
        "chat_template.jinja": "b310f89b9a1787e1",
        "config.json": "f649a333e916e087",
        "generation_config.json": "6d3dee8f002bfc96",
        "model.safetensors": "e2dc875a9f6814fb",
        "processor_config.json": "b4b48818e01233ee",
        "tokenizer.json": "1441abdce45bffae",
        "tokenizer_config.json": "f9dadc88d9e36a0b",
    },
}
MODEL_CLASSES = {
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor"),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", "Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
    "qwen3_vl_moe": ("Qwen3VLMoeForConditionalGeneration", "Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: build_model_dir("tiny", root / name, seed=0, family=name) for name in FAMILIES}


def _frames(count: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, height, width, 3), dtype=np.uint8)


def _video_inputs(processor: Any, frames: np.ndarray, metadata: dict[str, Any] = METADATA) -> Any:
    prompt = processor.apply_chat_template(VIDEO_MESSAGES, tokenize=False, add_generation_prompt=True)
    return processor(text=[prompt], videos=[frames], video_metadata=[metadata], return_tensors="pt")


def _digest(path: Path) -> str:
    def without_version(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: without_version(v) for k, v in value.items() if k != "transformers_version"}
        return [without_version(v) for v in value] if isinstance(value, list) else value

    if path.suffix == ".json":
        data = json.dumps(without_version(json.loads(path.read_text())), sort_keys=True).encode()
    else:
        data = path.read_bytes()
    return hashlib.sha256(data).hexdigest()[:16]


def test_every_family_is_listed_with_its_recipe() -> None:
    assert list(FAMILIES) == ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"]
    assert DEFAULT_FAMILY == "qwen2_5_vl"
    with pytest.raises(ValueError, match="unknown model family 'llava'"):
        build_model("tiny", family="llava")


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_default_family_builds_what_it_built_before_families(tmp_path: Path, preset: str) -> None:
    out = build_model_dir(preset, tmp_path / preset, seed=0)
    # Since then the tokenizer has four more added tokens, the tool tags, after all the others
    # (so no earlier id moved): the file without them is the one built then.
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    added = tokenizer["added_tokens"]
    assert [t["content"] for t in added[-4:]] == list(TOOL_TAGS)
    assert [t["id"] for t in added[-5:]] == list(range(added[-5]["id"], added[-5]["id"] + 5))
    tokenizer["added_tokens"] = added[:-4]
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert {p.name: _digest(p) for p in sorted(out.iterdir())} == DEFAULT_FAMILY_DIGESTS[preset]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_directory_loads_as_its_family(family_dirs: dict[str, Path], family: str) -> None:
    model, processor = load_model(family_dirs[family]), load_processor(family_dirs[family])
    model_class, processor_class, video_processor_class = MODEL_CLASSES[family]
    assert type(model).__name__ == model_class and model.config.model_type == family
    assert type(processor).__name__ == processor_class
    assert type(processor.video_processor).__name__ == video_processor_class
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    tokenizer, config = processor.tokenizer, model.config
    for field, token in (
        ("video_token_id", "<|video_pad|>"),
        ("image_token_id", "<|image_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"),
    ):
        assert getattr(config, field) == tokenizer.convert_tokens_to_ids(token), field
    assert model.generation_config.eos_token_id == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]
    spec, text, vision = PRESETS["tiny"], config.text_config, config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (
        spec.hidden_size,
        spec.num_layers,
        spec.vocab_size,
    )
    assert len(tokenizer) <= text.vocab_size
    geometry = FAMILIES[family].geometry
    assert (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) == (
        geometry.patch_size,
        geometry.spatial_merge_size,
        geometry.temporal_patch_size,
    )
    assert processor.video_processor.patch_size == geometry.patch_size
    assert processor.video_processor.do_sample_frames is False


def test_family_specific_config_fields(family_dirs: dict[str, Path]) -> None:
    qwen2 = load_model(family_dirs["qwen2_vl"]).config
    # Qwen2-VL: embed_dim is the tower's width, hidden_size the merger's output (the LM's width).
    assert qwen2.vision_config.embed_dim == PRESETS["tiny"].vision_hidden_size
    assert qwen2.vision_config.hidden_size == qwen2.text_config.hidden_size
    for family in ("qwen3_vl", "qwen3_vl_moe"):
        config = load_model(family_dirs[family]).config
        rope = config.text_config.rope_parameters
        assert rope["mrope_interleaved"] is True and rope["mrope_section"] == [6, 5, 5]
        assert sum(rope["mrope_section"]) * 2 == config.text_config.head_dim
        assert config.vision_config.deepstack_visual_indexes == [0, 1]
        assert config.vision_config.out_hidden_size == config.text_config.hidden_size
    moe = load_model(family_dirs["qwen3_vl_moe"]).config.text_config
    assert (moe.num_experts, moe.num_experts_per_tok, moe.norm_topk_prob) == (8, 2, True)
    assert mrope_section(128) == [24, 20, 20]  # the released split


def test_qwen3_vl_moe_saves_the_released_expert_layout(family_dirs: dict[str, Path]) -> None:
    from safetensors import safe_open

    built, _ = build_model("tiny", seed=0, family="qwen3_vl_moe")
    name = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    with safe_open(family_dirs["qwen3_vl_moe"] / "model.safetensors", "pt") as saved:
        # Released checkpoints (and vLLM) want (experts, hidden, 2 x width); transformers holds the transpose.
        assert list(saved.get_slice(name).get_shape()) == [8, 128, 2 * 96]
    assert list(built.state_dict()[name].shape) == [8, 2 * 96, 128]
    loaded = load_model(family_dirs["qwen3_vl_moe"]).state_dict()
    for key, tensor in built.state_dict().items():
        assert_identical(loaded[key], tensor, reason=f"{key}: save + load is a round trip")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_forward_on_a_processed_video(family_dirs: dict[str, Path], family: str) -> None:
    model, processor = load_model(family_dirs[family]), load_processor(family_dirs[family])
    side = 2 * FAMILIES[family].geometry.pixel_factor
    inputs = _video_inputs(processor, _frames(4, side, side))
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()
    # The video matters: other frames, other logits.
    with torch.no_grad():
        other = model(**_video_inputs(processor, _frames(4, side, side, seed=1))).logits
    assert not torch.equal(logits, other)


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe"])
def test_deepstack_features_reach_the_language_model(family_dirs: dict[str, Path], family: str) -> None:
    model, processor = load_model(family_dirs[family]), load_processor(family_dirs[family])
    inputs = _video_inputs(processor, _frames(4, 64, 64))
    mergers = model.model.visual.deepstack_merger_list
    assert len(mergers) == 2  # one per DeepStack level: vision blocks 0 and 1
    with torch.no_grad():
        logits = model(**inputs).logits
        for merger in mergers:  # silence DeepStack: its features become zero
            merger.linear_fc2.weight.zero_()
            merger.linear_fc2.bias.zero_()
        without_deepstack = model(**inputs).logits
    video = inputs["input_ids"][0] == model.config.video_token_id
    first_video_token = int(video.nonzero()[0])
    # Text before the video is untouched (up to rounding: the MoE layers' per-expert matmuls see
    # other token batches); from the first visual token on, DeepStack changes the logits.
    assert_float32_close(
        without_deepstack[0, :first_video_token],
        logits[0, :first_video_token],
        ulps=FORWARD_ULPS,
        reason="logits before the video, with vs without DeepStack",
    )
    assert (without_deepstack[0, first_video_token:] - logits[0, first_video_token:]).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("family", "frames", "height", "width"),
    [
        ("qwen2_vl", 4, 28, 28),
        ("qwen2_vl", 6, 84, 112),
        ("qwen2_vl", 2, 448, 448),
        ("qwen2_5_vl", 5, 56, 84),
        ("qwen3_vl", 2, 32, 32),
        ("qwen3_vl", 6, 64, 96),
        ("qwen3_vl", 2, 448, 448),
        ("qwen3_vl", 32, 64, 64),
        ("qwen3_vl_moe", 4, 96, 64),
    ],
)
def test_processor_keeps_frames_of_accepted_sizes(
    family_dirs: dict[str, Path], family: str, frames: int, height: int, width: int
) -> None:
    processor = load_processor(family_dirs[family])
    patch = FAMILIES[family].geometry.patch_size
    video = _frames(frames, height, width)
    metadata = {"fps": 2.0, "total_num_frames": frames, "frames_indices": list(range(frames))}
    inputs = _video_inputs(processor, video, metadata)
    assert inputs["video_grid_thw"].tolist() == [[(frames + 1) // 2, height // patch, width // patch]]
    # Not only the grid: the pixels are the frames' own (rescaled and normalised, not resampled).
    first_patch = inputs["pixel_values_videos"][0].reshape(3, 2, patch, patch)
    mean = torch.tensor(processor.video_processor.image_mean).view(3, 1, 1, 1)
    std = torch.tensor(processor.video_processor.image_std).view(3, 1, 1, 1)
    expected = torch.from_numpy(video[:2, :patch, :patch]).permute(3, 0, 1, 2).float() / 255
    torch.testing.assert_close(first_patch, (expected - mean) / std, rtol=1e-5, atol=1e-5)
    image = processor.image_processor(images=[video[0]], return_tensors="pt")
    assert image["image_grid_thw"].tolist() == [[1, height // patch, width // patch]]


def test_qwen3_vl_resizes_what_is_not_a_multiple_of_32(family_dirs: dict[str, Path]) -> None:
    # The demo's 56x56 frames suit Qwen2(.5)-VL (2 x 28) but not Qwen3-VL: rounded up to 64x64.
    inputs = _video_inputs(load_processor(family_dirs["qwen3_vl"]), _frames(4, 56, 56))
    assert inputs["video_grid_thw"].tolist() == [[2, 4, 4]]
    assert VIDEO_MAX_PIXELS == 768 * 32 * 32 * 32  # the released per-video budget


def test_qwen3_vl_prompt_layout_writes_timestamps_between_frames(family_dirs: dict[str, Path]) -> None:
    processor = load_processor(family_dirs["qwen3_vl"])
    inputs = _video_inputs(processor, _frames(4, 64, 64))
    frame = "<|vision_start|>" + "<|video_pad|>" * 4 + "<|vision_end|>"
    # No default system turn (Qwen3-VL's template); the template's own vision_start/end stay outside.
    assert processor.tokenizer.decode(inputs["input_ids"][0]) == (
        "<|im_start|>user\n<|vision_start|>"
        f"<0.5 seconds>{frame}<2.5 seconds>{frame}"
        f"<|vision_end|>{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert processor.chat_template == chat_template(None)
    assert load_processor(family_dirs["qwen2_vl"]).chat_template == CHAT_TEMPLATE
    # The timestamps need frames_indices: without them the processor cannot date the frames.
    with pytest.raises(AttributeError):
        _video_inputs(processor, _frames(4, 64, 64), {"fps": 1.0, "total_num_frames": 4})


def test_parameter_counts_per_family() -> None:
    # Untrained sizes; the text side differs only where the family's language model does.
    counts = {family: count_parameters(build_model("tiny", family=family)[0]) for family in FAMILIES}
    assert counts["qwen2_vl"]["text"] == counts["qwen2_5_vl"]["text"]  # both Qwen2 with q/k/v biases
    assert counts["qwen3_vl"]["text"] < counts["qwen2_vl"]["text"]  # Qwen3: no biases, q/k norms
    assert counts["qwen3_vl_moe"]["vision"] == counts["qwen3_vl"]["vision"]
    assert counts["qwen3_vl_moe"]["text"] > counts["qwen3_vl"]["text"]  # 8 experts store 2x the MLP
    assert all(0.8e6 <= c["total"] <= 1.7e6 for c in counts.values()), counts


def test_cli_builds_a_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.commands import model as model_commands

    parser = argparse.ArgumentParser(prog="lvrl model")
    model_commands.register(parser)
    args = parser.parse_args(
        ["build", "--family", "qwen3_vl", "--preset", "tiny", "--out", str(tmp_path / "m")]
    )
    args.run(args)
    assert "built tiny qwen3_vl in" in capsys.readouterr().out
    assert load_model(tmp_path / "m").config.model_type == "qwen3_vl"
    with pytest.raises(SystemExit):
        parser.parse_args(["build", "--family", "llava", "--preset", "tiny", "--out", str(tmp_path / "x")])
