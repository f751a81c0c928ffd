"""LoRA through PEFT (models/lora.py), in one process on the tiny model.

- the adapters sit on the language model's projections only, and only they train: after
  optimizer steps every base weight is bit-identical to the loaded model's;
- the GRPO reference of a LoRA policy (adapters disabled, no second copy) gives exactly the
  base model's log-probs;
- the engine receives merged weights under the base names, each fused vLLM layer whole, and
  the training model is left as it was;
- an export writes a plain merged model directory and the adapter in PEFT's format;
- a resumed LoRA run continues exactly where the uninterrupted one goes.

The real vLLM engine after a merged sync is in tests/e2e/test_lora_engine.py; sharded training in
tests/distributed/test_lora_sharded.py (with a sharded checkpoint restored at another world size).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.recording_engines import WeightRecorder
from helpers.sharded_runs import fit_on_rollouts, grpo_module, rollout_of, rollout_parts
from helpers.tolerances import FORWARD_ULPS, assert_float32_close, assert_identical
from transformers import AutoConfig, AutoProcessor

from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from families import family_of
from models.export import export_checkpoint, save_hf_model
from models.loading import load_model, load_processor
from models.logprobs import completion_logprobs
from models.lora import (
    LANGUAGE_PROJECTIONS,
    LoraSettings,
    adapter_parameters,
    apply_lora,
    base_model,
    engine_weights,
    lora_layers,
    merged_state_dict,
    parameter_bytes,
)
from models.sft import SFTModule
from models.vision import vision_tower
from rollout.weight_sync import sync_weights

LORA = {"r": 4, "alpha": 8.0}


def base_name(name: str) -> str:
    """The plain model's name of a parameter of the adapted model."""
    return name.replace(".base_layer.", ".")


def perturb_adapters(model: torch.nn.Module, seed: int = 0, scale: float = 0.1) -> None:
    """Give every adapter a non-zero update (B starts at zero: the adapted model would equal the base)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in adapter_parameters(model).values():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)


@pytest.fixture(scope="module")
def batch(tiny_model_dir: Path, synth_dir: Path) -> dict:
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = [s for _, s in zip(range(2), stream, strict=False)]
    family = family_of(AutoConfig.from_pretrained(tiny_model_dir))
    return VideoQACollator(AutoProcessor.from_pretrained(tiny_model_dir), family=family)(samples)


def test_adapters_sit_on_the_language_model_projections_and_alone_train(tiny_model_dir: Path) -> None:
    model = apply_lora(load_model(tiny_model_dir), LoraSettings(**LORA))
    layers = lora_layers(model)
    text = model.config.text_config
    assert len(layers) == text.num_hidden_layers * len(LANGUAGE_PROJECTIONS)
    assert all(path.startswith("model.language_model.layers.") for path in layers)
    # The vision blocks have gate/up/down projections of the same names: untouched.
    assert not any(".lora_" in name for name, _ in vision_tower(model).named_parameters())
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(adapter_parameters(model)) and trainable
    # The HF model keeps its class and paths (vision helpers, sharding layout and engines use them).
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert len(model.model.language_model.layers) == text.num_hidden_layers

    with_vision = apply_lora(load_model(tiny_model_dir), LoraSettings(**LORA, vision=True))
    vision_adapted = [path for path in lora_layers(with_vision) if path.startswith("model.visual.")]
    assert vision_adapted and all(path.rpartition(".")[2] in LANGUAGE_PROJECTIONS for path in vision_adapted)


def test_settings_are_checked_before_any_model_is_loaded(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown settings"):
        LoraSettings.of({"rank": 4})
    with pytest.raises(ValueError, match="r must be"):
        LoraSettings.of({"r": 0})
    with pytest.raises(ValueError, match="freeze_vision"):
        SFTModule(str(tiny_model_dir), freeze_vision=True, lora={"vision": True})
    with pytest.raises(ValueError, match="no module named"):
        apply_lora(load_model(tiny_model_dir), LoraSettings(target_modules=("qkv",)))


def test_only_adapters_change_over_optimizer_steps(tiny_model_dir: Path, batch: dict) -> None:
    # (With activations recomputed in backward: the adapters' gradients pass through checkpointed layers.)
    module = SFTModule(str(tiny_model_dir), learning_rate=1e-2, lora=LORA, gradient_checkpointing=True)
    module.configure_model()
    assert module.model.is_gradient_checkpointing
    optimizer = module.configure_optimizers()["optimizer"]
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    adapters = adapter_parameters(module.model)
    assert optimized == {id(p) for p in adapters.values()}
    before = {name: p.detach().clone() for name, p in adapters.items()}
    for _ in range(3):
        optimizer.zero_grad()
        module.token_mean_loss(batch).backward()
        assert all(p.grad is None for n, p in module.model.named_parameters() if n not in adapters)
        optimizer.step()
    loaded = dict(load_model(tiny_model_dir).named_parameters())
    base = {base_name(n): p for n, p in module.model.named_parameters() if n not in adapters}
    assert base.keys() == loaded.keys()
    for name, parameter in base.items():
        assert_identical(parameter.detach(), loaded[name].detach(), reason=f"{name}: frozen base weight")
    for name, parameter in adapters.items():  # A moves once B is non-zero (from the second step)
        assert not torch.equal(parameter.detach(), before[name]), f"{name} did not train"


def test_the_reference_is_the_base_model_without_a_copy(tiny_model_dir: Path, synth_dir: Path) -> None:
    module = grpo_module(tiny_model_dir, optimizer="adam", lora=LORA)
    module.configure_model()
    assert module.reference is None  # no second model in memory
    perturb_adapters(module.model)
    parts = rollout_parts(tiny_model_dir, synth_dir, prompts=2, steps=1)[0]
    pad = module.processor.tokenizer.pad_token_id
    rollout = rollout_of(parts, [0, 1], pad_token_id=pad, length_multiple=1)
    chunks = [[0, 1], [2, 3]]
    references = module._reference_logprobs(rollout, chunks)
    base = load_model(tiny_model_dir).eval()
    videos = rollout.video_embeds()
    with torch.no_grad():
        for rows, reference in zip(chunks, references, strict=True):
            expected = completion_logprobs(base, rollout.scoring.select(rows), videos)
            # Each adapted layer runs its base layer alone: the base model's very arithmetic.
            assert_identical(reference, expected, reason="adapters disabled vs the base model")
            policy = completion_logprobs(module.model, rollout.scoring.select(rows), videos)
            assert (policy - expected).abs().max() > 1e-3  # the adapters are back on afterwards
    assert module.model.training and all(m.training for m in module.model.modules())
    assert all(p.requires_grad for p in adapter_parameters(module.model).values())
    # What the copy would have cost: the language model in float32, about the whole tiny model.
    full = grpo_module(tiny_model_dir, optimizer="adam")
    full.configure_model()
    copy_bytes = parameter_bytes(list(full.reference.parameters()))
    tower_bytes = parameter_bytes(list(vision_tower(full.model).parameters()))
    assert copy_bytes == parameter_bytes(list(full.model.parameters())) - tower_bytes > 0


def test_the_engine_receives_merged_weights_under_the_base_names(tiny_model_dir: Path) -> None:
    model = apply_lora(load_model(tiny_model_dir), LoraSettings(**LORA))
    perturb_adapters(model)
    kept = {name: p.detach().clone() for name, p in model.named_parameters()}
    engine = WeightRecorder(dtype="float32")
    report = sync_weights(engine, engine_weights(model), bucket_bytes=2**14)
    received = engine.received()
    layers = lora_layers(model)
    expected_names = [
        f"{path}.{leaf}" for path, layer in layers.items() for leaf, _ in layer.base_layer.named_parameters()
    ]
    assert list(received) == expected_names and report.parameters == len(expected_names)
    assert not any(".lora_" in name or "base_layer" in name for name in received)
    # Each vLLM layer (q/k/v with their biases, gate/up) whole in one call.
    groups = [engine.weight_group(name) for call in engine.calls for name, _ in call]
    per_call = [{engine.weight_group(name) for name, _ in call} for call in engine.calls]
    assert sum(len(g) for g in per_call) == len(set(groups))
    params = dict(model.named_parameters())
    for path, layer in layers.items():
        weight = params[f"{path}.base_layer.weight"].double()
        a, b = (
            params[f"{path}.lora_A.default.weight"].double(),
            params[f"{path}.lora_B.default.weight"].double(),
        )
        # One float32 matmul over r=4 terms and an add: a few ulps; 8 bound them.
        assert_float32_close(
            received[f"{path}.weight"],
            weight + layer.scaling["default"] * b @ a,
            ulps=8,
            reason=f"{path} merged",
        )
        if f"{path}.bias" in received:
            assert_identical(
                received[f"{path}.bias"], params[f"{path}.base_layer.bias"].detach(), reason="bias"
            )
    for name, parameter in model.named_parameters():  # merged into new tensors, not in place
        assert_identical(parameter.detach(), kept[name], reason=f"{name} untouched by the sync")


def test_a_partial_target_still_sends_each_fused_layer_whole(tiny_model_dir: Path) -> None:
    model = apply_lora(load_model(tiny_model_dir), LoraSettings(**LORA, target_modules=("q_proj", "up_proj")))
    engine = WeightRecorder(dtype="float32")
    sync_weights(engine, engine_weights(model))
    received = engine.received()
    attention = "model.language_model.layers.0.self_attn"
    # k and v share vLLM's qkv_proj with q, down is gate/up's sibling: all of their parents' weights.
    for leaf in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert f"{attention}.{leaf}.weight" in received
    assert {"gate_proj", "up_proj", "down_proj"} <= {n.split(".")[-2] for n in received if ".mlp." in n}
    plain = dict(load_model(tiny_model_dir).named_parameters())
    for name, tensor in received.items():  # B = 0 at the start: merged = base, exactly
        assert_identical(tensor, plain[name].detach(), reason=f"{name}: a zero update merged")


def test_export_writes_the_merged_model_and_the_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = apply_lora(load_model(tiny_model_dir), LoraSettings(**LORA)).eval()
    perturb_adapters(model)
    out = save_hf_model(model, load_processor(tiny_model_dir), tmp_path / "hf")
    plain, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weight
    assert not any(".lora_" in n or "base_layer" in n for n, _ in plain.named_parameters())
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        merged = plain.eval()(input_ids=ids).logits
        # PEFT's own loader puts the adapter back on the base model: the very same arithmetic.
        reloaded = PeftModel.from_pretrained(load_model(tiny_model_dir), out / "adapter").eval()
        assert_identical(reloaded(input_ids=ids).logits, adapted, reason="adapter reloaded by PEFT")
    # (W + sBA) x vs W x + s B (A x): the same value, reductions grouped otherwise.
    assert_float32_close(merged, adapted, ulps=FORWARD_ULPS, reason="merged export vs adapted model")
    assert lora_layers(model)  # the live model keeps its adapters


def test_a_resumed_lora_run_continues_exactly(tiny_model_dir: Path, synth_dir: Path, tmp_path: Path) -> None:
    """Three AdamW updates straight vs two, a checkpoint (adapters, optimizer state), then the third."""
    parts = rollout_parts(tiny_model_dir, synth_dir, prompts=2, steps=3)
    prompts = [0, 1]

    def module():
        return grpo_module(tiny_model_dir, optimizer="adam", lora=LORA)

    fit_on_rollouts(module(), parts, prompts, tmp_path / "straight.pt", tmp_path / "straight")
    checkpoint = tmp_path / "step2.ckpt"
    fit_on_rollouts(
        module(), parts, prompts, tmp_path / "first.pt", tmp_path / "first", max_steps=2, save_to=checkpoint
    )
    fit_on_rollouts(
        module(),
        parts,
        prompts,
        tmp_path / "resumed.pt",
        tmp_path / "resumed",
        max_steps=3,
        resume_from=checkpoint,
    )
    saved = torch.load(checkpoint, weights_only=False)
    adapters = [k for k in saved["state_dict"] if ".lora_" in k]
    assert len(saved["optimizer_states"][0]["state"]) == len(adapters)  # moments of the adapters only
    straight, resumed = torch.load(tmp_path / "straight.pt"), torch.load(tmp_path / "resumed.pt")
    assert_identical(
        torch.tensor(resumed["losses"]), torch.tensor(straight["losses"][-1:]), reason="third loss"
    )
    assert resumed["weights"].keys() == straight["weights"].keys() == set(adapters)
    for name, weight in straight["weights"].items():
        assert_identical(resumed["weights"][name], weight, reason=f"{name} after a resume")
    # `lvrl model export` of the LoRA checkpoint: merged weights, adapter beside them.
    out = export_checkpoint(checkpoint, tmp_path / "exported")
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    plain = load_model(out)
    assert not any("lora" in n for n, _ in plain.named_parameters())


def tiny_family_model(family: str) -> torch.nn.Module:
    """A random 2-layer model of ``family`` from transformers' own classes (no processor needed)."""
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    text = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    text.update(num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    if family == "qwen2_vl":
        rope = {"type": "mrope", "mrope_section": [2, 3, 3]}
        config = Qwen2VLConfig(
            text_config={**text, "rope_scaling": rope},
            vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 2},
        )
        return Qwen2VLForConditionalGeneration(config).eval()
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    config = Qwen3VLConfig(
        text_config={**text, "head_dim": 16, "rope_scaling": rope},
        vision_config={**vision, "deepstack_visual_indexes": [0]},
    )
    return Qwen3VLForConditionalGeneration(config).eval()


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_other_families_adapt_disable_and_merge_alike(family: str) -> None:
    """Qwen2-VL and Qwen3-VL (q/k norms in the attention, DeepStack mergers in the tower): the
    same language-model targets, the adapter-free view is the base model, and the merged state
    dict is a plain model of the family that computes the adapted one (text-only forward)."""
    model = tiny_family_model(family)
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = model(input_ids=ids).logits
    apply_lora(model, LoraSettings(**LORA))
    assert len(lora_layers(model)) == 2 * len(LANGUAGE_PROJECTIONS)
    assert all(".language_model.layers." in path for path in lora_layers(model))
    perturb_adapters(model)
    plain = tiny_family_model(family)
    plain.load_state_dict(merged_state_dict(model, model.state_dict()), strict=True)
    with torch.no_grad():
        with base_model(model):
            assert_identical(model(input_ids=ids).logits, base, reason=f"{family}: adapters disabled vs base")
        adapted = model(input_ids=ids).logits
        assert (adapted - base).abs().max() > 1e-2
        merged = plain(input_ids=ids).logits
    assert_float32_close(merged, adapted, ulps=FORWARD_ULPS, reason=f"{family}: merged vs adapted")
    # The engine gets every parameter of each adapted layer's parent, under plain names.
    engine = WeightRecorder(dtype="float32")
    sync_weights(engine, engine_weights(model))
    received = engine.received()
    assert set(received) <= set(dict(plain.named_parameters()))
    for name, tensor in received.items():
        assert_identical(tensor, dict(plain.named_parameters())[name].detach(), reason=f"{name}: merged")
