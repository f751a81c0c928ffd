"""Greedy decoding of a model directory in transformers and in vLLM, for engine-agreement tests.

Test-only helpers (kept out of the package): both take the same prompt token ids and return
the generated ids, so a test can assert the two engines agree token for token. With
``ignore_eos=True`` both mask the stop tokens (transformers' ``min_new_tokens``, vLLM's
``min_tokens``, which mask the same ids: the generation config's ``eos_token_id`` list), so
exactly ``max_new_tokens`` ids come back and the comparison always covers that many steps.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from models.loading import load_model

# In-process engine (~3 s to start instead of ~16 s) and a KV cache that fits a CI machine.
VLLM_ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}


@functools.lru_cache(maxsize=2)
def _hf_model(model_dir: str) -> Any:
    return load_model(model_dir, dtype=torch.float32)


def greedy_ids_transformers(
    model_dir: str | Path, prompt_ids: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False
) -> list[int]:
    """Greedy continuation of ``prompt_ids`` with ``model.generate`` (float32, one sequence)."""
    model = _hf_model(str(model_dir))
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens if ignore_eos else 0,
        )
    return out[0, input_ids.shape[1] :].tolist()


def as_the_cpu_engine_runs() -> Any:
    """A context in which vLLM runs its torch.compile'd helper ops eagerly, as
    ``rollout.vllm_engine.VLLMEngine`` runs them on the CPU (``compile_stance``): for an engine
    a test builds or calls itself, which would otherwise pay inductor's C++ build of them."""
    return torch.compiler.set_stance("force_eager")


_ENGINE: dict[str, Any] = {}
"""The in-process vLLM engine of the last model directory asked for (starting one costs seconds)."""


def vllm_engine(model_dir: str, max_model_len: int = 1024) -> Any:
    """One in-process float32 vLLM engine, kept for the next call with the same model directory.

    An engine for another directory first shuts the kept one down, here and now: an in-process
    engine's shutdown tears down vLLM's process-wide parallel groups, which the next engine
    shares, so leaving the old one to the garbage collector lets it pull them from under the
    new one whenever a collection happens to run (seen on CI as "pipeline model parallel group
    is not initialized" in the middle of a generate).
    """
    key = f"{model_dir}|{max_model_len}"
    if key in _ENGINE:
        return _ENGINE[key]
    drop_vllm_engine()
    for name, value in VLLM_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from vllm import LLM

    with as_the_cpu_engine_runs():
        _ENGINE[key] = LLM(
            model=model_dir,
            dtype="float32",
            max_model_len=max_model_len,
            max_num_seqs=8,
            enforce_eager=True,
            limit_mm_per_prompt={"image": 0, "video": 1},
            seed=0,
        )
    return _ENGINE[key]


def drop_vllm_engine() -> None:
    """Shut the kept engine down now (and with it vLLM's process-wide parallel state)."""
    if not _ENGINE:
        return
    for engine in _ENGINE.values():
        engine.llm_engine.engine_core.shutdown()
    _ENGINE.clear()
    gc.collect()


def greedy_ids_vllm(
    model_dir: str | Path, prompt_ids: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False
) -> list[int]:
    """Greedy continuation of ``prompt_ids`` with vLLM (temperature 0, float32)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = vllm_engine(str(model_dir))
    params = SamplingParams(
        temperature=0.0, max_tokens=max_new_tokens, min_tokens=max_new_tokens if ignore_eos else 0
    )
    with as_the_cpu_engine_runs():
        outputs = llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids))], params, use_tqdm=False)
    return list(outputs[0].outputs[0].token_ids)
