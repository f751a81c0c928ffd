"""The memory plan of every shipped real-size config (and an 8,192-frame variant) on 8 x 80 GB GPUs, as data.

For each config, what ``lvrl plan --config CONFIG --architecture ARCH --gpus 8 --gpu-memory 80GB``
prints, kept as numbers: the total per GPU in each phase, the peak and its phase, the headroom,
and vLLM's check (its share, what it needs inside it). The 8,192-frame variant is
``grpo_7b_4096f.yaml`` with ``data.num_frames: 8192`` and ``max_model_len`` left to the engine.

Usage: python bench/plan_configs.py [--out bench/results/plan/configs.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

from app.lightning_cli import parsed_fit_config  # noqa: E402
from evaluation.provenance import provenance  # noqa: E402
from planner.architectures import published_architecture  # noqa: E402
from planner.memory import GIB, Device, plan_memory  # noqa: E402
from planner.run_config import run_settings, with_engine_limits  # noqa: E402

CONFIGS = {
    "grpo_3b.yaml": "qwen2.5-vl-3b",
    "grpo_7b.yaml": "qwen2.5-vl-7b",
    "sft_7b.yaml": "qwen2.5-vl-7b",
    "grpo_7b_4096f.yaml": "qwen2.5-vl-7b",
}
DEVICE_MEMORY = 80 * GIB  # "80GB": GPUs are sold in GiB


def eight_k_variant() -> dict[str, Any]:
    config = parsed_fit_config(ROOT / "configs/qwen2_5_vl/grpo_7b_4096f.yaml")
    config["data"]["init_args"]["num_frames"] = 8192
    engine = config["trainer"]["callbacks"][0]["init_args"]["engine"]["init_args"]
    engine["max_model_len"] = None
    return config


def planned(name: str, config: dict[str, Any], architecture: str) -> dict[str, Any]:
    arch = published_architecture(architecture)
    settings = with_engine_limits(arch, run_settings(config, gpus=8))
    plan = plan_memory(arch, settings, Device("cuda", DEVICE_MEMORY))
    engine = plan.engine
    return {
        "config": name,
        "architecture": architecture,
        "frames": settings.num_frames,
        "video_tokens": plan.tokens.video,
        "sequence_parallel": settings.sequence_parallel_size,
        "attention": settings.sequence_parallel_attention,
        "phase_totals_gib": {phase: round(total / GIB, 2) for phase, total in plan.phase_totals.items()},
        "peak_gib": round(plan.peak / GIB, 2),
        "peak_phase": plan.peak_phase,
        "headroom_gib": round(plan.headroom / GIB, 2),
        "fits": plan.fits,
        "vllm": None
        if engine is None
        else {
            "reserved_gib": round(engine.reserved / GIB, 2),
            "weights_gib": round(engine.weights / GIB, 2),
            "activations_gib": round(engine.activations / GIB, 2),
            "encoder_cache_gib": round(engine.encoder_cache / GIB, 2),
            "kv_needed_gib": round(engine.kv_needed / GIB, 2),
            "kv_available_gib": round(engine.kv_available / GIB, 2),
            "fits": engine.fits,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/plan/configs.json")
    args = parser.parse_args()
    rows = [
        planned(name, parsed_fit_config(ROOT / "configs/qwen2_5_vl" / name), architecture)
        for name, architecture in CONFIGS.items()
    ]
    rows.append(planned("grpo_7b_4096f.yaml at 8,192 frames", eight_k_variant(), "qwen2.5-vl-7b"))
    summary = {
        **provenance(["python", "bench/plan_configs.py", *sys.argv[1:]]),
        "device": "8 x 80 GB GPUs",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    for row in rows:
        verdict = "fits" if row["fits"] else "does not fit"
        print(
            f"{row['config']}: peak {row['peak_gib']} GiB ({row['peak_phase']}), "
            f"headroom {row['headroom_gib']} GiB: {verdict}"
        )


if __name__ == "__main__":
    main()
