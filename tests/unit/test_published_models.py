"""Random-weight models at published widths (models/published.py, `lvrl model build --published`):
the architecture is the published one (parameter counts by hand and by the planner), and the
command writes a directory that loads, or its config alone."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig

from app.commands import model as model_commands
from families import published
from families.published import PUBLISHED_CONFIGS, published_names
from models.build import PRESETS, count_parameters
from models.loading import load_model, load_processor
from models.published import build_published, published_spec
from models.tokenizer import train_tokenizer
from planner.architectures import architecture_from_config, published_architecture


def _run_cli(*argv: str) -> None:
    parser = argparse.ArgumentParser()
    model_commands.register(parser)
    args = parser.parse_args(["build", *argv])
    args.run(args)


def text_parameters_by_hand(text: dict[str, Any], tied: bool) -> int:
    """A Qwen decoder's parameters from its widths: embedding (and LM head unless tied), per layer
    q/k/v/o projections (Qwen2.5's with q/k/v biases, Qwen3's with per-head q/k norms instead),
    the gated MLP and two norms; the final norm."""
    hidden, heads, kv_heads = text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"]
    head_dim = text.get("head_dim", hidden // heads)
    qwen3 = "head_dim" in text
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    attention += 2 * head_dim if qwen3 else heads * head_dim + 2 * kv_heads * head_dim
    layer = attention + 3 * hidden * text["intermediate_size"] + 2 * hidden
    embedding = text["vocab_size"] * hidden
    return embedding * (1 if tied else 2) + text["num_hidden_layers"] * layer + hidden


@pytest.fixture(scope="module")
def meta_models() -> Iterator[dict[str, Any]]:
    """Every published model on the meta device (no memory), built once."""
    yield {name: build_published(name, "meta", torch.bfloat16)[0] for name in published_names()}


@pytest.mark.parametrize("name", published_names())
def test_the_language_model_has_the_published_widths(meta_models: dict[str, Any], name: str) -> None:
    """Qwen3-VL's head_dim (128) is not hidden / heads (80 for the 4B model): a config that
    derived it would count other numbers."""
    _, spec = published_spec(name)
    counts = count_parameters(meta_models[name])
    assert counts["text"] == text_parameters_by_hand(spec["text"], spec["tie_word_embeddings"])
    assert all(p.dtype == torch.bfloat16 and p.is_meta for p in meta_models[name].parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_qwen2_5_vl_models_count_what_the_memory_planner_plans(
    meta_models: dict[str, Any], name: str
) -> None:
    """Text and vision tower alike: the planner's count of the published config.json."""
    assert count_parameters(meta_models[name])["total"] == published_architecture(name).parameters()


def test_config_only_writes_what_the_planner_and_transformers_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, corpus = tmp_path / "q3b", tmp_path / "corpus.txt"
    corpus.write_text("Markers by colour: crimson huge at 01:52. " * 200)
    _run_cli("--published", "qwen2.5-vl-3b", "--out", str(out), "--config-only", "--corpus", str(corpus))
    assert "built qwen2.5-vl-3b (qwen2_5_vl)" in capsys.readouterr().out
    assert not list(out.glob("*.safetensors"))
    config = json.loads((out / "config.json").read_text())
    planned = architecture_from_config(config, "q3b").parameters()
    assert planned == published_architecture("qwen2.5-vl-3b").parameters() == 3_754_622_976
    loaded = AutoConfig.from_pretrained(out)
    assert (loaded.text_config.hidden_size, loaded.text_config.num_hidden_layers) == (2048, 36)
    assert loaded.tie_word_embeddings
    tokenizer = load_processor(out).tokenizer
    assert tokenizer.convert_tokens_to_ids("<|video_pad|>") == loaded.video_token_id
    # The tokenizer a preset built with the same corpus has (what the zoom prompts were measured with).
    assert (
        tokenizer.get_vocab()
        == train_tokenizer(PRESETS["small"].vocab_size, [corpus.read_text()]).get_vocab()
    )
    assert len(tokenizer.encode(" crimson")) == 1
    _run_cli("--published", "qwen2.5-vl-3b", "--out", str(out), "--config-only", "--reuse")
    assert "kept the qwen2.5-vl-3b model" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"hidden size 2048 and 36 layers, not qwen2\.5-vl-7b's 3584 and 28"):
        _run_cli("--published", "qwen2.5-vl-7b", "--out", str(out), "--config-only", "--reuse")
    with pytest.raises(SystemExit, match="holds a qwen2_5_vl model, not qwen3_vl"):
        _run_cli("--published", "qwen3-vl-2b", "--out", str(out), "--config-only", "--reuse")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "tiny", "--dtype", "bfloat16"], "--dtype is for --published models"),
        (["--preset", "tiny", "--config-only"], "--config-only is for --published models"),
        (["--published", "qwen3-vl-2b", "--family", "qwen2_5_vl"], "is a qwen3_vl model, not qwen2_5_vl"),
        (["--published", "qwen3-vl-2b", "--corpus", "missing.txt"], "corpus file missing.txt does not exist"),
    ],
)
def test_options_of_the_other_kind_of_build_are_refused(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        _run_cli(*argv, "--out", str(tmp_path / "m"))
    assert not (tmp_path / "m").exists()


def test_a_preset_and_a_published_model_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):  # argparse: one of --preset / --published, exactly
        _run_cli("--preset", "tiny", "--published", "qwen3-vl-2b", "--out", str(tmp_path / "m"))
    with pytest.raises(SystemExit):
        _run_cli("--out", str(tmp_path / "m"))


MINI_QWEN3_VL = {  # a published-style spec: head_dim 64 with 2 heads of a 96-wide model, tied
    "text": {
        "vocab_size": 4096,
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "rope_parameters": {**published.QWEN3_VL_ROPE, "mrope_section": [12, 10, 10]},
    },
    "vision": {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 4,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "deepstack_visual_indexes": [0, 1],
        "num_position_embeddings": 2304,
        "out_hidden_size": 96,
    },
    "tie_word_embeddings": True,
}


def test_weights_are_written_in_the_dtype_and_load_with_the_published_widths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole path at a width a test affords: drawn on the CPU in bfloat16, saved, loaded."""
    monkeypatch.setitem(published.QWEN3_VL_PUBLISHED, "mini", MINI_QWEN3_VL)
    out = tmp_path / "mini"
    _run_cli("--published", "mini", "--out", str(out), "--device", "cpu", "--seed", "3")
    assert "bfloat16 weights drawn on cpu" in capsys.readouterr().out
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_slice(key).get_dtype() for key in weights.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}
    model = load_model(out)
    assert model.config.text_config.head_dim == 64 and model.config.text_config.hidden_size == 96
    assert count_parameters(model)["text"] == text_parameters_by_hand(MINI_QWEN3_VL["text"], tied=True)
    again = build_published("mini", "cpu", torch.bfloat16, seed=3)[0].state_dict()
    loaded = model.state_dict()
    assert again.keys() == loaded.keys()
    assert all(torch.equal(again[key], loaded[key].to(torch.bfloat16)) for key in again)  # the seed's draw
