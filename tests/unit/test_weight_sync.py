"""Weight sync in buckets, in one process: what the engine receives, and the memory the sync holds.

The sharded (FSDP2, 2 processes) side is in tests/distributed/test_sharded_weights.py; the real
vLLM engine in tests/e2e/test_rollout_vllm.py. Here the parameters are plain tensors (they pass
through the gather) and the engine is a recorder that groups parameters as vLLM fuses them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.recording_engines import WeightRecorder
from helpers.tolerances import assert_identical

from families.published import PUBLISHED_CONFIGS
from models.loading import load_model
from models.lora import engine_weights
from rollout.hf_engine import TransformersEngine
from rollout.weight_sync import MIB, SyncReport, fused_module_key, sync_weights

KIB = 2**10


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> torch.nn.Module:
    """The tiny model with its vision tower frozen, as GRPO trains it by default."""
    model = load_model(tiny_model_dir)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("visual" not in name)
    return model


def group_sizes(engine: WeightRecorder, named: list[tuple[str, torch.Tensor]], itemsize: int) -> Counter[str]:
    sizes: Counter[str] = Counter()
    for name, parameter in named:
        sizes[engine.weight_group(name)] += parameter.numel() * itemsize
    return sizes


def test_every_trainable_parameter_arrives_once_whole_and_in_the_engine_dtype(policy) -> None:
    engine = WeightRecorder(dtype="bfloat16")
    report = sync_weights(engine, engine_weights(policy), bucket_bytes=64 * KIB)
    trainable = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    received = engine.received()
    assert list(received) == [n for n, _ in trainable]  # in named_parameters order, each once
    assert not any("visual" in name for name in received)
    for name, parameter in trainable:
        assert_identical(received[name], parameter.detach().to(torch.bfloat16), reason=f"{name}, cast")
    assert engine.finished == 1 and report.buckets == len(engine.calls) > 1
    assert report.parameters == len(trainable)


@pytest.mark.parametrize("bucket_kib", [16, 256])
def test_buckets_stay_within_the_bound_and_keep_fused_layers_whole(policy, bucket_kib: int) -> None:
    bucket_bytes = bucket_kib * KIB
    engine = WeightRecorder(dtype="float32", keep_values=False)
    report = sync_weights(engine, engine_weights(policy), bucket_bytes=bucket_bytes)
    sizes = group_sizes(engine, list(engine_weights(policy)), itemsize=4)
    largest_group = max(sizes.values())
    # Each vLLM layer (q/k/v together, gate/up together) arrives in one call.
    groups_per_call = [{engine.weight_group(name) for name, _ in call} for call in engine.calls]
    assert sum(len(groups) for groups in groups_per_call) == len(sizes)
    for groups, size in zip(groups_per_call, engine.call_bytes, strict=True):
        assert size <= bucket_bytes or len(groups) == 1, f"{size} bytes in {len(groups)} layers"
    # Alive at once: one bucket (the sync drops it before gathering the next), never more.
    assert report.peak_bytes == max(engine.call_bytes) == report.largest_bucket_bytes
    assert report.peak_bytes <= bucket_bytes + largest_group
    assert report.bytes_sent == sum(sizes.values())


class KeepsTheTensors(WeightRecorder):
    """An engine that holds on to the tensors it was handed (a leak the peak must show)."""

    def update_weights(self, named_tensors) -> None:
        self.kept = [*getattr(self, "kept", []), *named_tensors]
        super().update_weights(self.kept[-1:])


def test_the_peak_counts_tensors_still_alive(policy) -> None:
    engine = KeepsTheTensors(dtype="bfloat16", keep_values=False)
    report = sync_weights(engine, engine_weights(policy), bucket_bytes=16 * KIB)
    assert report.buckets > 10 and report.peak_bytes == report.bytes_sent


class FailsOnSecondBucket(WeightRecorder):
    """An engine whose weight loading fails part way (a crashed worker, memory exhausted)."""

    def update_weights(self, named_tensors) -> None:
        if len(self.calls) == 1:
            raise MemoryError("engine ran out of memory loading weights")
        super().update_weights(named_tensors)


def test_an_engine_failing_mid_sync_still_lets_every_gather_happen(policy) -> None:
    """Each parameter read stands for a gather the other ranks take part in: all are read, then
    the engine's error is raised, and the engine is not told the update finished."""
    read: list[str] = []

    def gathered() -> Iterator[tuple[str, torch.Tensor]]:
        for name, parameter in engine_weights(policy):
            read.append(name)
            yield name, parameter

    engine = FailsOnSecondBucket(dtype="float32", keep_values=False)
    with pytest.raises(MemoryError, match="loading weights"):
        sync_weights(engine, gathered(), bucket_bytes=16 * KIB)
    assert read == [name for name, _ in engine_weights(policy)]
    assert len(engine.calls) == 1 and engine.finished == 0


def test_a_fused_layer_split_by_the_order_is_refused(policy) -> None:
    attention = "model.language_model.layers.0.self_attn"
    named = dict(policy.named_parameters())
    order = [f"{attention}.q_proj.weight", f"{attention}.o_proj.weight", f"{attention}.k_proj.weight"]
    with pytest.raises(ValueError, match="qkv_proj"):
        sync_weights(WeightRecorder(), [(n, named[n]) for n in order])


def test_an_engine_that_samples_with_the_policy_gathers_nothing() -> None:
    def untouchable() -> Iterator[tuple[str, torch.Tensor]]:
        raise AssertionError("the parameters were read")
        yield  # a generator

    assert sync_weights(TransformersEngine(), untouchable()) == SyncReport()


def test_names_are_the_hugging_face_names_under_wrappers() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList([checkpoint_wrapper(torch.nn.Linear(2, 2))])})
    assert next(n for n, _ in model.named_parameters()) == "layers.0._checkpoint_wrapped_module.weight"
    assert [n for n, _ in engine_weights(model)] == ["layers.0.weight", "layers.0.bias"]
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    attention = "model.layers.3.self_attn"
    assert fused_module_key(f"{attention}.v_proj.bias", packed) == f"{attention}.qkv_proj"
    assert fused_module_key("lm_head.weight", packed) == "lm_head"


def test_qwen2_5_vl_7b_sync_holds_one_embedding_at_most() -> None:
    """Real 7B shapes on the meta device (nothing allocated): the peak a 512 MiB bucket gives.

    The embedding and the LM head (152,064 x 3,584 in bf16: 1,039.5 MiB each) are the largest
    layers: each goes alone, and bounds the peak; every other bucket stays under 512 MiB.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    # Qwen2.5-VL-7B-Instruct's config.json sizes (the planner's copy of the published file).
    published = PUBLISHED_CONFIGS["qwen2.5-vl-7b"]
    config = Qwen2_5_VLConfig(**{k: v for k, v in published.items() if k != "model_type"})
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("visual" not in name)
    engine = WeightRecorder(dtype="bfloat16", keep_values=False)
    report = sync_weights(engine, engine_weights(model), bucket_bytes=512 * MIB)
    embedding = 152064 * 3584 * 2
    assert report.peak_bytes == embedding  # 1,039.5 MiB
    assert sorted(engine.call_bytes)[-3] <= 512 * MIB < embedding == sorted(engine.call_bytes)[-2]
    assert report.bytes_sent == sum(p.numel() * 2 for _, p in engine_weights(model))
