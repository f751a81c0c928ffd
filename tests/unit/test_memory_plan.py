"""The memory planner: its arithmetic against hand computation and real models, the verdict and
its suggestions, ``lvrl plan`` on the real-size configs, and the start-up refusal on a GPU."""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from helpers.cli import REPO_ROOT, lvrl
from helpers.tolerances import assert_identical

from app.validation import ConfigError, validate_config
from core.tool_use.reply import reply_text
from core.tool_use.requests import FramePlan, served_text
from families.published import PUBLISHED_CONFIGS, QWEN3_VL_PUBLISHED, QWEN3_VL_VISION
from planner.advice import combined_changes, suggestions
from planner.architectures import QWEN3_VL_TIMESTAMP_TOKENS, architecture_from_config, published_architecture
from planner.memory import (
    GIB,
    RING_QUERY_CHUNK,
    TOOL_REPLY_TEXT_TOKENS,
    Device,
    EngineSettings,
    MemoryPlan,
    RunSettings,
    decoder_layer_saved_bytes,
    plan_memory,
)
from planner.run_config import PlanInputError, memory_problem, run_settings

# A made-up architecture small enough to count by hand.
SMALL_CONFIG = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 10,
    "tie_word_embeddings": False,
    "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 0]},
    "vision_config": {
        "depth": 1,
        "hidden_size": 4,
        "intermediate_size": 8,
        "num_heads": 2,
        "out_hidden_size": 8,
    },
}
SMALL = architecture_from_config(SMALL_CONFIG, "small")

REAL_CONFIGS = {
    "grpo_3b.yaml": "qwen2.5-vl-3b",
    "grpo_7b.yaml": "qwen2.5-vl-7b",
    "sft_7b.yaml": "qwen2.5-vl-7b",
    "grpo_7b_4096f.yaml": "qwen2.5-vl-7b",
}


def meta_model_parameters(config: dict) -> tuple[int, int]:
    """``(all, vision)`` parameter counts of transformers' model built from ``config`` on the meta device."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    hf_config = Qwen2_5_VLConfig(**{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(hf_config)
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.model.visual.parameters())


def grpo_settings(**changes) -> RunSettings:
    settings = RunSettings(
        kind="grpo",
        world_size=8,
        devices_per_node=8,
        num_frames=512,
        max_pixels_per_frame=128 * 28 * 28,
        text_tokens=1024,
        completion_tokens=1024,
        sequence_parallel_size=4,
        micro_batch_rows=2,
        batch_size=1,
        num_generations=8,
        reference="sharded",
        engine=EngineSettings(gpu_memory_utilization=0.4, max_model_len=40960, sleep_mode=True),
    )
    return replace(settings, **changes)


def line(plan, name: str) -> float:
    return next(item.bytes for item in plan.lines if item.name.startswith(name))


# -- parameter counts -------------------------------------------------------------------------
def test_parameter_counts_by_hand() -> None:
    text, vision = SMALL.text, SMALL.vision
    # Per layer: two norms 2*8; q 8*8+8; k and v 2*(8*4+4); o 8*8; gate/up/down 3*8*16.
    assert text.layer_parameters() == 16 + 72 + 72 + 64 + 384
    assert text.parameters() == 8 * 10 + 2 * 608 + (8 * 10 + 8)
    # Patch embedding 3*2*14*14*4; block 2*4 + (4*12+12) + (4*4+4) + 2*(4*8+8) + (8*4+4);
    # merger 4 + (16*16+16) + (16*8+8).
    assert vision.parameters() == 4704 + 204 + 412


@pytest.mark.parametrize("name", ["small", *PUBLISHED_CONFIGS])
def test_parameter_counts_equal_transformers_model(name: str) -> None:
    config = SMALL_CONFIG if name == "small" else PUBLISHED_CONFIGS[name]
    arch = architecture_from_config(config, name)
    total, vision = meta_model_parameters(config)
    assert_identical(arch.parameters(), total, reason=f"{name}: counted vs built on the meta device")
    assert_identical(arch.vision.parameters(), vision, reason=f"{name}: vision tower")


def test_published_counts_are_the_model_cards() -> None:
    # Qwen2.5-VL-3B-Instruct: 3.75B parameters, -7B-Instruct: 8.29B (the model cards' figures).
    assert round(published_architecture("qwen2.5-vl-3b").parameters() / 1e9, 2) == 3.75
    assert round(published_architecture("qwen2.5-vl-7b").parameters() / 1e9, 2) == 8.29


def test_a_built_model_directory_reads_the_same(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert "text_config" in config  # transformers 5's nested layout
    total, _ = meta_model_parameters(config)
    assert_identical(architecture_from_config(config).parameters(), total, reason="tiny model directory")


def qwen3_config(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int) -> dict:
    """A made-up Qwen3-VL ``config.json`` (nested layout), small enough to build on the CPU."""
    return {
        "model_type": "qwen3_vl",
        "tie_word_embeddings": True,
        "text_config": {
            "vocab_size": 300,
            "hidden_size": hidden,
            "intermediate_size": intermediate,
            "num_hidden_layers": 2,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5]},
        },
        "vision_config": {
            **QWEN3_VL_VISION,
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_heads": 2,
            "deepstack_visual_indexes": [0, 1],
            "out_hidden_size": hidden,
        },
    }


@pytest.mark.parametrize("name", sorted(QWEN3_VL_PUBLISHED))
def test_qwen3_vl_counts_equal_transformers_model(name: str) -> None:
    """Qwen3-VL's tower (LayerNorms, GELU MLP, biased patch embedding, position table,
    DeepStack mergers) and decoder (q/k norms, no q/k/v bias, head_dim 128)."""
    from models.build import count_parameters
    from models.published import build_published

    counts = count_parameters(build_published(name, "meta", torch.bfloat16)[0])
    arch = published_architecture(name)
    assert_identical(arch.text.parameters(), counts["text"], reason=f"{name}: language model")
    assert_identical(arch.vision.parameters(), counts["vision"], reason=f"{name}: vision tower")
    assert arch.vision.deepstack_levels == 3 and arch.vision.pixels_per_token == 32 * 32


def test_a_qwen3_vl_directory_reads_the_same() -> None:
    """A config as `lvrl model build --family qwen3_vl` writes it (transformers' to_dict)."""
    from models.build import build_model, count_parameters

    model, _ = build_model("tiny", family="qwen3_vl")
    counts = count_parameters(model)
    arch = architecture_from_config(model.config.to_dict(), "qwen3 tiny")
    assert_identical(
        (arch.text.parameters(), arch.vision.parameters()), (counts["text"], counts["vision"]), reason="tiny"
    )


@pytest.mark.parametrize("attention_bias", [False, True])
def test_qwen3_attention_bias_is_counted(attention_bias: bool) -> None:
    """Qwen3's attention_bias puts a bias on q, k, v and o: the count follows the built model."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = qwen3_config(hidden=96, heads=4, kv_heads=2, head_dim=32, intermediate=160)
    config["text_config"]["attention_bias"] = attention_bias
    hf_config = Qwen3VLConfig(
        text_config=config["text_config"], vision_config=config["vision_config"], tie_word_embeddings=True
    )
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(hf_config)
    language = sum(p.numel() for p in model.model.language_model.parameters())
    arch = architecture_from_config(config)
    assert_identical(arch.text.parameters(), language, reason=f"attention_bias={attention_bias}")
    biases = 2 * (4 * 32 + 2 * 2 * 32 + 96) if attention_bias else 0  # q, k, v, o in 2 layers
    unbiased = replace(arch.text, qkv_bias=False, o_bias=False).parameters()
    assert arch.text.parameters() - unbiased == biases


def test_qwen3_vl_prompts_carry_timestamps_and_deepstack_features() -> None:
    """Each temporal patch adds its written time and vision start/end tokens to the prompt; the
    cached video embedding holds the three DeepStack levels beside the embedding itself."""
    qwen3, run = published_architecture("qwen3-vl-4b"), grpo_settings(max_pixels_per_frame=64 * 32 * 32)
    plan = plan_memory(qwen3, run, Device("cuda", 80 * GIB))
    video = 256 * 64  # 512 frames: 256 temporal patches of 64 merged tokens each
    assert plan.tokens.prompt == video + run.text_tokens + 256 * QWEN3_VL_TIMESTAMP_TOKENS
    assert line(plan, "video embeddings") == run.batch_size * video * 4 * 2560 * 4  # float32 tower output


# -- activations ------------------------------------------------------------------------------
def saved_by_autograd(model: torch.nn.Module, hidden_size: int, dtype: torch.dtype, tokens: int = 48) -> int:
    """Bytes autograd saves in the first decoder layer of ``model`` for ``tokens`` tokens (SDPA,
    causal, no mask: the flash-style path), parameters and rotary cos/sin excluded (shared by
    layers); each storage counted once."""
    language = model.model.language_model
    hidden = torch.randn(1, tokens, hidden_size, dtype=dtype, requires_grad=True)
    positions = torch.arange(tokens).view(1, 1, tokens).expand(3, 1, tokens)
    rotary = language.rotary_emb(hidden, positions)
    excluded = {p.untyped_storage().data_ptr() for p in model.parameters()}
    excluded |= {t.untyped_storage().data_ptr() for t in rotary}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        language.layers[0](hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
    return sum(saved.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layer_saved_bytes_equal_autograd(dtype: torch.dtype) -> None:
    """The per-token count equals what autograd saves in a real Qwen2.5-VL decoder layer."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = {
        **SMALL_CONFIG,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    hf_config = Qwen2_5_VLConfig(**{k: v for k, v in config.items() if k != "model_type"})
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(hf_config).to(dtype).train()
    arch = architecture_from_config(config)
    per_token = decoder_layer_saved_bytes(
        arch.text, 4 if dtype == torch.float32 else 2, grpo_settings(sequence_parallel_size=1)
    )
    assert_identical(
        saved_by_autograd(model, 64, dtype), per_token * 48, reason="autograd's saved bytes vs the count"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qwen3_decoder_layer_saved_bytes_equal_autograd(dtype: torch.dtype) -> None:
    """The same for Qwen3-VL's layer, whose q/k norms save their own tensors (head_dim 32 with 4
    heads of a 96-wide model: not hidden / heads)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = qwen3_config(hidden=96, heads=4, kv_heads=2, head_dim=32, intermediate=160)
    hf_config = Qwen3VLConfig(
        text_config=config["text_config"], vision_config=config["vision_config"], tie_word_embeddings=True
    )
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(hf_config).to(dtype).train()
    arch = architecture_from_config(config)
    assert arch.text.qk_norm and arch.text.head_dim == 32
    per_token = decoder_layer_saved_bytes(
        arch.text, 4 if dtype == torch.float32 else 2, grpo_settings(sequence_parallel_size=1)
    )
    assert_identical(
        saved_by_autograd(model, 96, dtype), per_token * 48, reason="autograd's saved bytes vs the count"
    )


def test_ring_chunk_is_the_ring_attentions() -> None:
    from parallel.ring import QUERY_CHUNK

    assert RING_QUERY_CHUNK == QUERY_CHUNK


# -- the plan's lines -------------------------------------------------------------------------
def test_lines_by_hand() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    run = grpo_settings()
    plan = plan_memory(arch, run, Device("cuda", 80 * GIB))
    lm = arch.text.parameters()
    assert line(plan, "parameters") == lm * 4 / 8
    assert line(plan, "optimizer") == 2 * lm * 4 / 8
    assert line(plan, "gradients") == lm * 4 / 8
    assert line(plan, "vision tower") == arch.vision.parameters() * 4
    assert line(plan, "reference") == arch.text.parameters() * 2 / 8  # no vision tower
    # 512 frames of 128 x 28 x 28 pixels: 256 temporal patches x 128 tokens.
    assert plan.tokens.video == 32768 and plan.tokens.prompt == 32768 + 1024
    # Two rows of prompt + completion, forwarded whole, split over 4 ranks.
    assert plan.tokens.layer_tokens == 2 * (33792 + 1024) // 4
    assert line(plan, "activations: decoder layers") == 28 * plan.tokens.layer_tokens * 2 * 3584
    assert line(plan, "logits") == 2 * 1024 * 152064 * (2 + 12)
    # vLLM: the prompt's KV once (prefix caching) + 8 completions, in bfloat16, 28 layers x 4 KV heads x 128.
    assert plan.engine is not None
    assert plan.engine.kv_tokens == 33792 + 8 * 1024  # more than one max_model_len (40,960) sequence
    assert plan.engine.kv_needed == (33792 + 8 * 1024) * 28 * 2 * 512 * 2
    assert plan.engine.reserved == 0.4 * 80 * GIB


def test_sampling_with_the_policy_gathers_it_and_holds_a_kv_cache() -> None:
    """The transformers engine samples with the policy: under FSDP2 every unit is gathered for it
    (a whole bf16 copy on each rank, whatever the world), and one prompt's 8 samples hold their
    keys and values; both in the rollout phase only. A replicated policy needs no copy; vLLM
    (its own reserved share) neither."""
    arch = published_architecture("qwen2.5-vl-3b")
    run = grpo_settings(engine=None, policy_generates=True, sequence_parallel_size=1)
    plan = plan_memory(arch, run, Device("cuda", 80 * GIB))
    row = plan.tokens.prompt + 1024
    kv = 8 * row * 36 * 2 * (2 * 128) * 2  # 36 layers, keys and values, 2 KV heads x 128, bf16
    gathered = arch.text.parameters() * 2
    assert line(plan, "policy gathered for generation") == gathered
    assert line(plan, "generation KV cache") == kv
    without = plan_memory(arch, replace(run, policy_generates=False), Device("cuda", 80 * GIB))

    def tensors(plan: MemoryPlan, phase: str) -> float:  # the overhead line's fragmentation follows the peak
        return sum(
            item.bytes for item in plan.lines if item.held_in(phase) and item.name != "framework overhead"
        )

    assert tensors(plan, "rollout") - tensors(without, "rollout") == pytest.approx(gathered + kv)
    for phase in ("head", "layers"):
        assert tensors(plan, phase) == tensors(without, phase)
    replicated = plan_memory(arch, replace(run, sharding="replicated"), Device("cuda", 80 * GIB))
    assert not any(item.name.startswith("policy gathered") for item in replicated.lines)
    assert line(replicated, "generation KV cache") == kv
    vllm = plan_memory(arch, grpo_settings(sequence_parallel_size=1), Device("cuda", 80 * GIB))
    assert not any(item.name.startswith(("policy gathered", "generation KV")) for item in vllm.lines)


def test_sharding_divides_by_the_world() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    one = plan_memory(
        arch, grpo_settings(world_size=1, devices_per_node=1, sequence_parallel_size=1), Device("cpu", GIB)
    )
    eight = plan_memory(arch, grpo_settings(sequence_parallel_size=1), Device("cpu", GIB))
    for name in ("parameters", "optimizer", "gradients", "reference"):
        assert line(one, name) == 8 * line(eight, name)
    hybrid = plan_memory(arch, grpo_settings(world_size=16, sharding="hybrid"), Device("cpu", GIB))
    assert line(hybrid, "parameters") == line(eight, "parameters")  # 8 GPUs per node, replicated over 2


def test_sequence_parallelism_divides_activations() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    plans = {
        sp: plan_memory(arch, grpo_settings(sequence_parallel_size=sp), Device("cpu", GIB))
        for sp in (1, 2, 4)
    }
    assert plans[2].tokens.layer_tokens == -(-2 * 34816 // 2)
    assert line(plans[1], "activations: decoder layers") == 4 * line(plans[4], "activations: decoder layers")
    assert plans[4].tokens.patches * 4 == plans[1].tokens.patches  # MR-SP stage 1 splits the frames too


def test_checkpointing_keeps_one_hidden_state_per_layer() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    on = plan_memory(arch, grpo_settings(), Device("cpu", GIB))
    off = plan_memory(arch, grpo_settings(gradient_checkpointing=False), Device("cpu", GIB))
    saved = decoder_layer_saved_bytes(arch.text, 2, grpo_settings())
    assert line(off, "activations: decoder layers") == 28 * on.tokens.layer_tokens * saved
    assert line(on, "activations: decoder layers") == 28 * on.tokens.layer_tokens * 2 * 3584


def test_cpu_offload_and_a_host_reference_leave_the_gpu() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    plan = plan_memory(arch, grpo_settings(cpu_offload=True, reference="cpu"), Device("cuda", 80 * GIB))
    for name in ("parameters", "optimizer", "gradients", "reference"):
        assert line(plan, name) == 0


# -- verdict and suggestions --------------------------------------------------------------------
def test_a_plan_that_does_not_fit_says_what_to_change() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    run = grpo_settings(
        gradient_checkpointing=False,
        sequence_parallel_size=2,
        engine=replace(grpo_settings().engine, sleep_mode=False),
    )
    plan = plan_memory(arch, run, Device("cuda", 80 * GIB))
    assert not plan.fits and plan.headroom < 0
    ideas = suggestions(plan)
    assert ideas[0].change == "model.init_args.gradient_checkpointing: true"
    assert ideas[1].change.startswith("trainer.strategy.init_args.sequence_parallel_size: 4")
    for idea in ideas:  # each saving is the peak difference of the plan with that change alone
        assert idea.saving == plan.peak - idea.plan.peak
    assert ideas[0].saving > 100 * GIB  # 28 layers of saved activations at 17k tokens
    combined = combined_changes(plan)
    assert combined[-1].plan.fits
    assert [c.change for c in combined] == [i.change for i in ideas[: len(combined)]]


def test_an_engine_share_too_small_for_its_kv_cache_comes_first() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    engine = EngineSettings(gpu_memory_utilization=0.2, max_model_len=40960, sleep_mode=True)
    plan = plan_memory(arch, grpo_settings(engine=engine), Device("cuda", 80 * GIB))
    assert plan.engine is not None and not plan.engine.fits and not plan.fits
    first = suggestions(plan)[0]
    assert first.change.startswith("engine init_args.gpu_memory_utilization: 0.2")  # 0.2x, rounded up
    assert first.plan.engine is not None and first.plan.engine.fits


def test_an_oversized_engine_share_can_be_lowered() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    engine = EngineSettings(gpu_memory_utilization=0.9, max_model_len=40960, sleep_mode=False)
    plan = plan_memory(arch, grpo_settings(engine=engine), Device("cuda", 80 * GIB))
    assert not plan.fits and plan.engine is not None and plan.engine.fits
    lower = [s for s in suggestions(plan) if "gpu_memory_utilization" in s.change]
    assert lower and lower[0].saving > 0 and lower[0].plan.engine.fits


# -- reading configs ------------------------------------------------------------------------------
@functools.cache
def _parsed(relative: str, overrides: tuple[str, ...]) -> dict:
    from app.lightning_cli import parsed_fit_config

    return parsed_fit_config(REPO_ROOT / relative, overrides)


def parsed(relative: str, *overrides: str) -> dict:
    """The config file as ``lvrl fit`` parses it (every class's defaults in), a copy to change."""
    return copy.deepcopy(_parsed(relative, overrides))


def test_the_planner_reads_the_parsed_config_and_restates_no_default() -> None:
    # The zoom GRPO config leaves the advantage, the engine's max_num_seqs and the strategy's
    # sharding out; the parse fills them in from the classes' own signatures.
    config = parsed("configs/zoom/grpo_tool.yaml")
    rollout = config["trainer"]["callbacks"][0]["init_args"]
    assert rollout["advantage"] == "grpo" and rollout["engine"]["init_args"]["max_num_seqs"] == 64
    assert run_settings(config).num_generations == rollout["num_generations"]
    # A file read as it is lacks them: refused, saying how to plan it.
    raw = yaml.safe_load((REPO_ROOT / "configs/zoom/grpo_tool.yaml").read_text())
    with pytest.raises(PlanInputError, match=r"has no '[a-z_]+': plan a config as LightningCLI parses it"):
        run_settings(raw)


def test_run_settings_of_a_real_config() -> None:
    config = parsed("configs/qwen2_5_vl/grpo_7b_4096f.yaml")
    run = run_settings(config)
    assert (run.kind, run.world_size, run.sequence_parallel_size, run.num_frames) == ("grpo", 8, 8, 4096)
    assert run.master_dtype == "float32" and run.param_dtype == "bfloat16" and run.sharding == "full"
    assert run.engine is not None and run.engine.dtype == "bfloat16"
    assert run_settings(config, gpus=4, nodes=2).world_size == 8
    assert not run.policy_generates
    config["trainer"]["callbacks"][0]["init_args"]["engine"] = {
        "class_path": "rollout.hf_engine.TransformersEngine"
    }
    run = run_settings(config)
    assert run.engine is None and run.policy_generates


def test_the_issues_arithmetic_for_a_replicated_bf16_run() -> None:
    """The sharded strategy's starting point: grpo_7b.yaml under a replicating strategy with bf16-true, vLLM
    awake at 0.4: ~110 GB per GPU before any activation, so it cannot fit 80 GB."""
    config = parsed("configs/qwen2_5_vl/grpo_7b.yaml")
    config["trainer"].update(strategy="ddp", precision="bf16-true")
    config["trainer"]["callbacks"][0]["init_args"]["engine"]["init_args"]["enable_sleep_mode"] = False
    run = run_settings(config)
    assert (run.sharding, run.master_dtype, run.param_dtype) == ("replicated", "bfloat16", "bfloat16")
    plan = plan_memory(published_architecture("qwen2.5-vl-7b"), run, Device("cuda", 80 * GIB))
    before_activations = sum(
        line.bytes for line in plan.lines if line.phase == "always" and line.name != "framework overhead"
    )
    assert 100e9 < before_activations + line(plan, "gradients") < 120e9
    assert not plan.fits


# -- lvrl plan --------------------------------------------------------------------------------------
HEADROOM_GIB = 8
"""What every phase of a shipped real-size config leaves free on its GPU, at least: the planner's
allowances (CUDA context, NCCL, fragmentation, vLLM outside its share) are estimates."""


@pytest.mark.parametrize("config", list(REAL_CONFIGS))
def test_each_real_config_fits_eight_80gb_gpus_with_headroom_in_every_phase(config: str) -> None:
    path = f"configs/qwen2_5_vl/{config}"
    args = ["--architecture", REAL_CONFIGS[config], "--gpus", "8", "--gpu-memory", "80GB"]
    result = lvrl("plan", "--config", path, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\nfits: peak" in result.stdout
    assert "vLLM" in result.stdout or config.startswith("sft")
    header = next(line for line in result.stdout.splitlines() if "train: blocks" in line)
    assert "validation" in header  # every shipped config validates during training: planned
    plan = json.loads(lvrl("plan", "--config", path, *args, "--json").stdout)
    free = {phase: 80 - total / 2**30 for phase, total in plan["phase_totals"].items()}
    assert "validation" in free and min(free.values()) >= HEADROOM_GIB, free


@pytest.mark.parametrize(
    ("config", "old_settings", "phase"),
    [
        # 9d84ddc's 512-frame config: the sanity check validates with vLLM wholly awake.
        ("grpo_7b.yaml", {"trainer.num_sanity_val_steps": None}, "validation"),
        # 9d84ddc's 4,096-frame config: vLLM's share too small once it profiles 262k tokens, and a
        # 266k-token validation prompt on each GPU.
        (
            "grpo_7b_4096f.yaml",
            {
                "trainer.num_sanity_val_steps": None,
                "data.init_args.val_num_frames": None,
                "model.init_args.vision_patches_per_pass": None,
                "model.init_args.reference_placement": "sharded",
                "trainer.strategy.init_args.cpu_offload": False,
                "trainer.callbacks.0.init_args.engine.init_args.gpu_memory_utilization": 0.5,
            },
            "validation",
        ),
    ],
)
def test_the_previous_real_configs_do_not_fit(
    config: str, old_settings: dict[str, object], phase: str, tmp_path: Path
) -> None:
    settings = yaml.safe_load((REPO_ROOT / "configs/qwen2_5_vl" / config).read_text())
    for dotted, value in old_settings.items():
        *parents, key = dotted.split(".")
        node = settings
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    path = tmp_path / config
    path.write_text(yaml.safe_dump(settings))
    result = lvrl("plan", "--config", str(path), "--architecture", "qwen2.5-vl-7b", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    plan = json.loads(result.stdout)
    assert plan["phase_totals"][phase] > 80 * 2**30


def test_lvrl_plan_json_and_a_config_that_does_not_fit(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO_ROOT / "configs/qwen2_5_vl/grpo_7b.yaml").read_text())
    config["model"]["init_args"]["gradient_checkpointing"] = False
    path = tmp_path / "no_checkpointing.yaml"
    path.write_text(yaml.safe_dump(config))
    result = lvrl("plan", "--config", str(path), "--architecture", "qwen2.5-vl-7b", "--json")
    assert result.returncode == 1
    plan = json.loads(result.stdout)
    assert not plan["fits"] and plan["peak"] > 80 * GIB
    assert plan["suggestions"][0]["change"] == "model.init_args.gradient_checkpointing: true"
    text = lvrl("plan", "--config", str(path), "--architecture", "qwen2.5-vl-7b")
    assert (
        text.returncode == 1
        and "does not fit" in text.stdout
        and "gradient_checkpointing: true" in text.stdout
    )


def test_lvrl_plan_reads_the_model_directory_or_names_the_presets(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = yaml.safe_load((REPO_ROOT / "configs/demo/grpo.yaml").read_text())
    config["model"]["init_args"]["model_path"] = str(tiny_model_dir)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    result = lvrl("plan", "--config", str(path), "--gpus", "1", "--device", "cpu", "--gpu-memory", "8GB")
    assert result.returncode == 0, result.stderr
    assert f"{tiny_model_dir}, 914K parameters" in result.stdout  # its config.json, not a preset
    config["model"]["init_args"]["model_path"] = str(tmp_path / "missing")
    path.write_text(yaml.safe_dump(config))
    result = lvrl("plan", "--config", str(path), "--gpus", "1")
    assert result.returncode != 0
    assert (
        "pass --architecture NAME (built-in: qwen2.5-vl-3b, qwen2.5-vl-7b, qwen3-vl-2b, qwen3-vl-4b)"
        in result.stderr
    )


def test_lvrl_plan_plans_a_published_qwen3_vl_model() -> None:
    """The zoom task's GRPO config at Qwen3-VL-4B's widths: 16 frames of 64 x 64 are 8 temporal
    patches of 4 tokens, each preceded by its written time."""
    result = lvrl(
        "plan", "--config", str(REPO_ROOT / "configs/zoom/grpo_tool.yaml"), "--architecture", "qwen3-vl-4b",
        "--gpus", "1", "--text-tokens", "195",
    )  # fmt: skip
    assert "qwen3-vl-4b, 4.44B parameters" in result.stdout, result.stderr
    timestamps = 8 * QWEN3_VL_TIMESTAMP_TOKENS
    written = f"video 32 (16 frames; {timestamps} more in the prompt for their times)"
    assert f"{written}, prompt {32 + 195 + timestamps}" in result.stdout
    assert "x 4 levels (the embedding and its DeepStack features)" in result.stdout
    # The config's episodes: two requests of 16 frames (each 8 patches of 4 tokens, their times,
    # its text), three turns.
    replies = 2 * (32 + timestamps + TOOL_REPLY_TEXT_TOKENS)
    assert (
        f"3 turns x 96 = 288, replies {replies} (2 request(s), 32 frames = 64 video tokens" in result.stdout
    )


# -- frames on request ----------------------------------------------------------------------------
def test_a_tool_use_row_holds_every_turn_and_reply_at_the_budgets() -> None:
    """Token counts of tool-use episodes by hand: 2 requests, 32 frames served in all, 3 turns."""
    arch = published_architecture("qwen2.5-vl-7b")
    single = grpo_settings()
    tool = replace(single, tool_calls=2, tool_frames=32)
    one, episodes = (
        plan_memory(arch, single, Device("cuda", 80 * GIB)),
        plan_memory(arch, tool, Device("cuda", 80 * GIB)),
    )
    served = 16 * 128  # 32 frames: 16 temporal patches of 128 tokens (no written times in Qwen2.5-VL)
    assert episodes.tokens.prompt == one.tokens.prompt == 32768 + 1024
    assert (episodes.tokens.completion, episodes.tokens.served_video) == (3 * 1024, served)
    assert episodes.tokens.replies == served + 2 * TOOL_REPLY_TEXT_TOKENS
    row = 33792 + served + 2 * TOOL_REPLY_TEXT_TOKENS + 3 * 1024
    assert episodes.tokens.row == row
    assert episodes.tokens.layer_tokens == 2 * row // 4  # two whole rows over 4 sequence-parallel ranks
    assert episodes.tokens.logit_positions == 2 * 3 * 1024  # every turn is scored, no reply token
    # Every episode served frames of its own, encoded once in the step and cached with the prompt's.
    assert episodes.tokens.patches == -(-(32768 + 8 * served) * 4 // 4)
    assert line(episodes, "video embeddings") == (32768 + 8 * served) * 3584 * 4
    assert episodes.engine is not None
    assert episodes.engine.kv_tokens == 33792 + 8 * (served + 2 * TOOL_REPLY_TEXT_TOKENS + 3 * 1024)
    assert episodes.engine.max_model_len_needed == row
    assert episodes.engine.encoder_cache == (32768 + 8 * served) * 3584 * 2
    qwen3 = plan_memory(published_architecture("qwen3-vl-4b"), tool, Device("cuda", 80 * GIB))
    per_patch = QWEN3_VL_TIMESTAMP_TOKENS  # each served temporal patch is preceded by its time
    assert qwen3.tokens.replies == qwen3.tokens.served_video + 16 * per_patch + 2 * TOOL_REPLY_TEXT_TOKENS


def test_a_reply_has_no_more_text_tokens_than_the_planner_allows() -> None:
    """A byte-level BPE tokenizer writes at most one token per UTF-8 byte, a special token
    (``<|im_start|>``, the video's markers) being one: the longest served reply (times past ten
    hours, a four-digit frame count) stays in the bound."""
    plan = FramePlan((0, 30 * 36_000 * 10 - 1), source_fps=30.0)  # up to 99:59:59.9
    message = served_text(plan).replace("2 frames", "9999 frames")
    text = reply_text(message, with_video=True)
    specials = re.findall(r"<\|[a-z_]+\|>", text)
    assert len(specials) == 7  # two turn ends, two turn starts, the video's start, pad and end
    bound = len(text.encode()) - sum(len(token) - 1 for token in specials)
    assert "9999 frames" in text and bound <= TOOL_REPLY_TEXT_TOKENS


def test_run_settings_read_the_rollouts_tool_budget() -> None:
    config = parsed("configs/zoom/grpo_tool.yaml")
    run = run_settings(config)
    assert (run.tool_calls, run.tool_frames, run.completion_tokens) == (2, 32, 96)
    rollout = config["trainer"]["callbacks"][0]["init_args"]
    rollout["tool_use"] = {"max_calls": 3, "frames_per_call": 8, "frames_per_episode": 32}
    assert (run_settings(config).tool_calls, run_settings(config).tool_frames) == (3, 24)  # 3 x 8 < 32
    rollout["tool_use"] = {}
    assert (run_settings(config).tool_calls, run_settings(config).tool_frames) == (3, 32)  # the defaults
    rollout["tool_use"] = {"max_call": 2}
    with pytest.raises(ValueError, match=r"tool_use: unknown settings \['max_call'\]"):
        run_settings(config)
    rollout["tool_use"] = None
    assert (run_settings(config).tool_calls, run_settings(config).tool_frames) == (0, 0)


def test_lvrl_plan_help_names_every_input() -> None:
    result = lvrl("plan", "--help")
    for key in (
        "sequence_parallel_size",
        "sharding",
        "param_dtype",
        "cpu_offload",
        "freeze_vision",
        "gradient_checkpointing",
        "reference_placement",
        "micro_batch_rows",
        "num_frames",
        "max_pixels_per_frame",
        "batch_size",
        "gpu_memory_utilization",
        "max_model_len",
        "num_generations",
        "max_new_tokens",
        "enable_sleep_mode",
    ):
        assert key in result.stdout, key


# -- the start-up check -------------------------------------------------------------------------------
def sharded_demo_config(tiny_model_dir: Path, synth_dir: Path, **strategy: object) -> dict:
    settings = {"sequence_parallel_size": 1, **strategy}
    return parsed(
        "configs/demo/grpo.yaml",
        f"--model.init_args.model_path={tiny_model_dir}",
        f"--data.init_args.train_shards={synth_dir / 'train-*.tar'}",
        f"--data.init_args.val_shards={synth_dir / 'val-*.tar'}",
        "--trainer.devices=1",
        "--trainer.accelerator=gpu",
        "--trainer.strategy=parallel.strategy.SequenceParallelStrategy",
        *(f"--trainer.strategy.init_args.{key}={value}" for key, value in settings.items()),
    )


def test_a_gpu_too_small_for_the_plan_is_refused_with_the_suggestions(tiny_model_dir, synth_dir) -> None:
    config = sharded_demo_config(tiny_model_dir, synth_dir)
    model_config = json.loads((tiny_model_dir / "config.json").read_text())
    assert memory_problem(config, model_config, 80 * GIB) is None
    # The framework overhead alone (2 GiB) exceeds a 1 GiB device.
    problem = memory_problem(config, model_config, GIB)
    assert problem is not None and "cannot fit" in problem and "check_memory_plan: false" in problem
    with pytest.raises(ConfigError) as caught:
        validate_config("fit", config, device_memory=GIB)
    assert "the memory plan says this run cannot fit" in str(caught.value)
    validate_config("fit", config, device_memory=80 * GIB)
    off = sharded_demo_config(tiny_model_dir, synth_dir, check_memory_plan=False)
    validate_config("fit", off, device_memory=GIB)
    assert memory_problem(off, model_config, GIB) is None


def test_the_check_names_what_would_fit(tiny_model_dir) -> None:
    config = parsed("configs/qwen2_5_vl/grpo_7b.yaml")
    config["model"]["init_args"]["gradient_checkpointing"] = False
    problem = memory_problem(config, PUBLISHED_CONFIGS["qwen2.5-vl-7b"], 80 * GIB)
    assert problem is not None
    assert "model.init_args.gradient_checkpointing: true: saves" in problem
    assert "Applied in that order, these fit: model.init_args.gradient_checkpointing: true" in problem


def test_no_check_on_a_cpu_machine(tiny_model_dir, synth_dir) -> None:
    """Without a CUDA device (this machine) the check does not run: nothing to compare with."""
    config = sharded_demo_config(tiny_model_dir, synth_dir)
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the check runs here")
    validate_config("fit", config)


# -- LoRA --------------------------------------------------------------------------------------
def test_lora_parameter_count_equals_peft_on_the_tiny_model(tiny_model_dir: Path) -> None:
    from models.loading import load_model
    from models.lora import LANGUAGE_PROJECTIONS, LoraSettings, adapter_parameters, apply_lora

    config = json.loads((tiny_model_dir / "config.json").read_text())
    arch = architecture_from_config(config)
    for rank, targets in ((16, LANGUAGE_PROJECTIONS), (4, ("q_proj", "v_proj"))):
        model = apply_lora(load_model(tiny_model_dir), LoraSettings(r=rank, target_modules=targets))
        adapters = sum(p.numel() for p in adapter_parameters(model).values())
        assert_identical(arch.text.lora_parameters(rank, targets), adapters, reason=f"r={rank} {targets}")


def test_lora_trains_adapters_only_and_needs_no_reference_copy() -> None:
    arch = published_architecture("qwen2.5-vl-7b")
    device = Device("cuda", 80 * GIB)
    full = plan_memory(arch, grpo_settings(reference="sharded"), device)
    lora = plan_memory(
        arch, grpo_settings(lora_rank=16, lora_targets=("q_proj", "v_proj"), reference="none"), device
    )
    adapters = arch.text.lora_parameters(16, ("q_proj", "v_proj"))
    assert line(lora, "optimizer") == 2 * adapters * 4 / 8
    assert line(lora, "gradients") == adapters * 4 / 8
    assert line(lora, "parameters") == (arch.text.parameters() + adapters) * 4 / 8  # the frozen base too
    assert line(full, "reference") > 0 and not any(item.name.startswith("reference") for item in lora.lines)


def test_run_settings_of_a_lora_config() -> None:
    config = parsed("configs/demo/grpo_lora.yaml")
    config["model"]["init_args"]["kl_coef"] = 0.04  # even with a KL term: the reference is the base
    run = run_settings(config, gpus=1)
    assert run.lora_rank is not None and run.lora_targets and run.reference == "none" and run.freeze_vision
