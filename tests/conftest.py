"""Shared fixtures: a small synthetic dataset in shards and a tiny model directory, built once per session."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# Tests never talk to wandb.ai, and the in-process vLLM engine starts in seconds.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist (`make test` runs two workers on the two cores) each worker computes on one
# thread, and the processes its tests start inherit that: more threads than cores only adds
# switching. (No verdict depends on the thread count: tests/helpers/tolerances.py says why.)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The files that take longest (subprocesses, several runs), longest first, by their worker-seconds
# in the latest suite record (bench/results/suite/, junit.xml). `make test` hands whole files to
# two workers in collection order (--no-loadscope-reorder), each worker taking the next file as its
# current one nears its end: longest first, the many short files left fill the two workers' ends
# evenly, and neither runs a long file alone at the end.
LONGEST_FILES = (
    "tests/e2e/test_resume.py",
    "tests/e2e/test_exit_hygiene.py",
    "tests/e2e/test_demo_script.py",
    "tests/e2e/test_sharded_resume.py",
    "tests/e2e/test_real_vocabulary.py",
    "tests/e2e/test_grpo_sp_cli.py",
    "tests/distributed/test_sharded_training.py",
    "tests/e2e/test_sft_cli.py",
    "tests/e2e/test_sft_sharded.py",
    "tests/distributed/test_lora_sharded.py",
    "tests/e2e/test_failures.py",
    "tests/e2e/test_build_families_vllm.py",
    "tests/e2e/test_engine_limits.py",
    "tests/e2e/test_qwen_video_parity.py",
    "tests/e2e/test_configs.py",
    "tests/unit/test_memory_plan.py",
)


@pytest.fixture(scope="module", autouse=True)
def _long_lived_heap_frozen() -> None:
    """Each test file starts with the worker's long-lived heap out of the collector's walks
    (:mod:`helpers.frozen_heap` says why and when it is safe)."""
    from helpers.frozen_heap import freeze_the_long_lived_heap

    freeze_the_long_lived_heap()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = {path: rank for rank, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))  # stable
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 train samples in 6 shards of 4, 8 val samples in 2 shards; 20 frames of 56x56 at 2 fps."""
    from datatools.shard_writer import write_shards
    from datatools.synthetic import SynthConfig, encoded_samples

    out = tmp_path_factory.mktemp("synth")
    config = SynthConfig(num_frames=20, fps=2.0, size=56, seed=7)
    for split, count in (("train", 24), ("val", 8)):
        write_shards(
            encoded_samples(config, split, count), out, split, max_samples_per_shard=4, progress=False
        )
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from models.build import build_model_dir

    return build_model_dir("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def family_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Callable[[str], Path]:
    """``family -> directory`` of that family's tiny preset (seed 0), each built once per session;
    ``qwen2_5_vl`` is ``tiny_model_dir`` itself."""
    from models.build import build_model_dir

    built: dict[str, Path] = {"qwen2_5_vl": tiny_model_dir}

    def directory(family: str) -> Path:
        if family not in built:
            out = tmp_path_factory.mktemp("models") / f"tiny-{family}"
            built[family] = build_model_dir("tiny", out, seed=0, family=family)
        return built[family]

    return directory
