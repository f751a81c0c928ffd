"""Building Qwen2.5-VL directories offline: presets, determinism, tokenizer, template, processor, loading."""

from __future__ import annotations

import argparse
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from models.build import PRESETS, build_model, build_model_dir, count_parameters
from models.loading import load_model, load_processor
from models.tokenizer import CHAT_TEMPLATE, REASONING_TAGS, SPECIAL_TOKENS, train_tokenizer

VIDEO_MESSAGES = [
    {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which colour comes first?"}]}
]


@pytest.fixture(scope="module")
def processor(tiny_model_dir: Path) -> Any:
    return load_processor(tiny_model_dir)


@pytest.mark.parametrize(("preset", "low", "high"), [("tiny", 0.8e6, 1.2e6), ("small", 5e6, 8e6)])
def test_preset_parameter_counts(preset: str, low: float, high: float) -> None:
    model, processor = build_model(preset, seed=0)
    counts = count_parameters(model)
    assert low <= counts["total"] <= high, counts
    assert counts["text"] + counts["vision"] == counts["total"]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    spec = PRESETS[preset]
    text, vision = model.config.text_config, model.config.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (
        spec.hidden_size,
        spec.num_layers,
        spec.vocab_size,
    )
    assert sum(text.rope_parameters["mrope_section"]) * 2 == text.hidden_size // text.num_attention_heads
    assert (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) == (14, 2, 2)
    assert vision.out_hidden_size == text.hidden_size
    # Every id the tokenizer can produce has an embedding row (the rest are unused, as in Qwen).
    assert len(processor.tokenizer) <= text.vocab_size


def test_build_is_deterministic_in_the_seed(tmp_path: Path) -> None:
    first = build_model_dir("tiny", tmp_path / "a", seed=0)
    again = build_model_dir("tiny", tmp_path / "b", seed=0)
    other = build_model_dir("tiny", tmp_path / "c", seed=1)
    names = sorted(p.name for p in first.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names and "processor_config.json" in names
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    assert (first / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_directory_loads_in_transformers(tiny_model_dir: Path, processor: Any) -> None:
    model = load_model(tiny_model_dir)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert model.config.model_type == "qwen2_5_vl" and not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert type(processor.video_processor).__name__ == "Qwen2VLVideoProcessor"
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor"
    tokenizer = processor.tokenizer
    assert model.config.video_token_id == tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert model.config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert model.config.vision_start_token_id == tokenizer.convert_tokens_to_ids("<|vision_start|>")
    assert model.generation_config.eos_token_id == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]


def test_loading_rejects_what_is_not_a_model_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_processor(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    # transformers would guess the type from the path; we refuse.
    with pytest.raises(ValueError, match="no 'model_type'"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "  leading and trailing spaces \n\n\ttabs ",
        "ümlauts, naïve café, 日本語のテキスト, emoji 🚀🎬, ZWJ 👩‍👩‍👧, RTL שלום",
        "00:07-01:23 red background, square top left. <think>x</think>\n<answer>B</answer>",
        "control \x00\x07 chars and combining e\u0301",
    ],
)
def test_tokenizer_round_trips_unicode(processor: Any, text: str) -> None:
    import unicodedata

    tokenizer = processor.tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False)
    # The NFC normalizer (as in Qwen2) composes "e" + combining acute into "é"; nothing else changes.
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_special_tokens_and_reasoning_tags_are_single_ids(processor: Any) -> None:
    tokenizer = processor.tokenizer
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in (*SPECIAL_TOKENS, *REASONING_TAGS)]
    assert all(len(i) == 1 for i in ids), ids
    assert len({i[0] for i in ids}) == len(ids)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    target = "<think>The red scene comes first.</think>\n<answer>A</answer>"
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode(target, add_special_tokens=False))
    assert (
        pieces[0] == "<think>" and pieces[-1] == "</answer>" and "</think>" in pieces and "<answer>" in pieces
    )
    # The tags are not special: decoding for a reward function keeps them.
    assert tokenizer.decode(tokenizer.encode(target), skip_special_tokens=True) == target


def test_chat_template_renders_qwen_turns(processor: Any) -> None:
    rendered = processor.apply_chat_template(VIDEO_MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Which colour comes first?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
    ]
    assert processor.tokenizer.apply_chat_template(conversation, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n"
    )
    assert processor.chat_template == processor.tokenizer.chat_template == CHAT_TEMPLATE


def _video_inputs(processor, frames: np.ndarray, metadata: dict[str, Any]) -> Any:
    prompt = processor.apply_chat_template(VIDEO_MESSAGES, tokenize=False, add_generation_prompt=True)
    return processor(text=[prompt], videos=[frames], video_metadata=[metadata], return_tensors="pt")


@pytest.mark.parametrize(
    ("metadata", "sampled_fps"),
    [
        # Source video: 30 fps, 900 frames; 16 frames sampled uniformly.
        (
            {
                "fps": 30.0,
                "total_num_frames": 900,
                "frames_indices": list(range(0, 900, 57))[:16],
                "duration": 30.0,
            },
            16 / 900 * 30.0,
        ),
        # Equivalent: describe the sampled frames themselves.
        ({"fps": 2.0, "total_num_frames": 16}, 2.0),
    ],
)
def test_processor_keeps_frames_and_derives_grid_timing(
    processor: Any, metadata: dict[str, Any], sampled_fps: float
) -> None:
    frames = np.random.default_rng(0).integers(0, 256, (16, 56, 56, 3), dtype=np.uint8)
    inputs = _video_inputs(processor, frames, metadata)
    assert inputs["video_grid_thw"].tolist() == [[8, 4, 4]]  # 56x56 kept: 4x4 patches of 14, 8 frame pairs
    assert inputs["pixel_values_videos"].shape == (8 * 4 * 4, 3 * 2 * 14 * 14)
    video_pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert int((inputs["input_ids"] == video_pad).sum()) == 32  # 8 x (4x4 / 2x2 merge)
    assert inputs["second_per_grid_ts"][0] == pytest.approx(2 / sampled_fps)


@pytest.mark.parametrize(("height", "width"), [(84, 112), (28, 28), (448, 448)])
def test_processor_leaves_multiples_of_28_untouched(processor: Any, height: int, width: int) -> None:
    frames = np.zeros((4, height, width, 3), dtype=np.uint8)
    inputs = _video_inputs(processor, frames, {"fps": 2.0, "total_num_frames": 4})
    assert inputs["video_grid_thw"].tolist() == [[2, height // 14, width // 14]]
    image = processor.image_processor(images=[frames[0]], return_tensors="pt")
    assert image["image_grid_thw"].tolist() == [[1, height // 14, width // 14]]


def test_forward_with_video_gives_finite_logits(tiny_model_dir: Path, processor: Any) -> None:
    model = load_model(tiny_model_dir)
    frames = np.random.default_rng(1).integers(0, 256, (16, 56, 56, 3), dtype=np.uint8)
    inputs = _video_inputs(processor, frames, {"fps": 2.0, "total_num_frames": 16})
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()


def test_corpus_files_extend_the_tokenizer(tmp_path: Path) -> None:
    word = "Zorblatt"
    row = {"problem": f"Is the {word} here?", "options": [word, "no"], "reasoning": f"{word} {word}."}
    (tmp_path / "extra.txt").write_text(f"{word} " * 20)
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    with tarfile.open(tmp_path / "train-00000.tar", "w") as tar:
        payload = json.dumps(row).encode()
        info = tarfile.TarInfo("sample0.json")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    from models.build import read_corpus_files

    texts = list(
        read_corpus_files([tmp_path / "extra.txt", tmp_path / "rows.jsonl", tmp_path / "train-00000.tar"])
    )
    assert sum(word in t for t in texts) == 7  # txt; jsonl problem/reasoning/options; tar likewise
    plain = train_tokenizer(1024)
    extended = train_tokenizer(1024, texts)
    assert len(extended.tokenize(f" {word}")) < len(plain.tokenize(f" {word}"))


def _run_cli(*argv: str) -> None:
    from app.commands import model as model_commands

    parser = argparse.ArgumentParser(prog="lvrl model")
    model_commands.register(parser)
    args = parser.parse_args(list(argv))
    args.run(args)


def test_cli_builds_and_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny"
    _run_cli("build", "--preset", "tiny", "--out", str(out))
    printed = capsys.readouterr().out
    assert re.search(r"parameters text [\d,]+ / vision [\d,]+ / total [\d,]+", printed), printed
    assert (out / "config.json").is_file()
    with pytest.raises(SystemExit, match="not empty; pass --force"):
        _run_cli("build", "--preset", "tiny", "--out", str(out), "--seed", "1")
    _run_cli("build", "--preset", "tiny", "--out", str(out), "--seed", "1", "--force")
    assert load_model(out).config.text_config.hidden_size == PRESETS["tiny"].hidden_size


def test_cli_reuse_keeps_a_matching_model_and_refuses_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    _run_cli("build", "--family", "qwen3_vl", "--preset", "tiny", "--out", str(out), "--reuse")
    assert "built tiny qwen3_vl" in capsys.readouterr().out
    weights = {p.name: p.stat().st_mtime_ns for p in out.glob("*.safetensors")}
    _run_cli("build", "--family", "qwen3_vl", "--preset", "tiny", "--out", str(out), "--reuse", "--seed", "1")
    assert "kept the tiny qwen3_vl model" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.safetensors")} == weights  # not rebuilt
    with pytest.raises(SystemExit, match="holds a qwen3_vl model, not qwen2_5_vl: pass --family qwen3_vl"):
        _run_cli("build", "--family", "qwen2_5_vl", "--preset", "tiny", "--out", str(out), "--reuse")
    with pytest.raises(SystemExit, match="hidden size 128 and 2 layers, not preset small's 256 and 4"):
        _run_cli("build", "--family", "qwen3_vl", "--preset", "small", "--out", str(out), "--reuse")
    with pytest.raises(SystemExit, match="has the local tokenizer, not qwen: pass --tokenizer local"):
        _run_cli(
            "build",
            "--family",
            "qwen3_vl",
            "--preset",
            "tiny",
            "--tokenizer",
            "qwen",
            "--out",
            str(out),
            "--reuse",
        )
    (out / "config.json").write_bytes(b"\xff{not json")
    with pytest.raises(SystemExit, match="is not a model config"):
        _run_cli("build", "--family", "qwen3_vl", "--preset", "tiny", "--out", str(out), "--reuse")
    with pytest.raises(SystemExit):  # argparse: --reuse and --force exclude each other
        _run_cli("build", "--preset", "tiny", "--out", str(out), "--reuse", "--force")
