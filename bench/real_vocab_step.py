"""What the real vocabulary costs a GRPO step, on the CPU: the scoring pattern, then whole steps.

1. **The scoring pattern.** The trainer takes each row's logits out of one ``(rows, positions,
   vocabulary)`` tensor. Indexed one row at a time (``logits[i]``, the code before the fix),
   autograd's backward of each index is a zero-filled gradient the size of the whole tensor, once
   per row; taken with ``unbind`` (the code now) each row's gradient is its own slice. Both are
   timed and their peak resident memory measured (``VmHWM`` reset before each), at Qwen's
   151,936-token vocabulary; the gradients must be bit-identical (the indexed backward only adds
   zeros).
2. **GRPO steps.** The tiny preset with lvrl's local tokenizer (1,024 rows) and with Qwen's
   published vocabulary (``--tokenizer qwen``: 151,936 rows), each in a process of its own:
   ``--steps`` steps of ``--prompts`` x ``--completions`` completions of up to ``--new-tokens``
   tokens (default 2 x 3 x 8, the tests' steps) with the in-process vLLM engine; the
   median step after the first (rollout, and training: scoring, loss, backward, optimizer) and
   the process's peak resident memory. The target set for it: the real-vocabulary step at most 3x
   the local one.

Usage: python bench/real_vocab_step.py [--steps 5] [--rows 64] [--positions 8] [--prompts 2]
       [--completions 3] [--new-tokens 8] [--out bench/results/real_vocab/<name>.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as `python bench/real_vocab_step.py`, Python puts bench/ first on sys.path; keep the repo's.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VOCABULARY = 151_936


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def scoring_pattern(rows: int, positions: int, way: str) -> dict[str, Any]:
    """Backward of per-row log-softmax scores taken ``way`` (``index`` or ``unbind``)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, positions, VOCABULARY, generator=generator).requires_grad_()
    targets = torch.randint(0, VOCABULARY, (rows, positions), generator=generator)
    Path("/proc/self/clear_refs").write_text("5")
    start_kib = _kib("VmRSS")
    started = time.perf_counter()
    per_row = [logits[i] for i in range(rows)] if way == "index" else list(logits.unbind(0))
    scores = [
        torch.log_softmax(row, -1).gather(-1, wanted.unsqueeze(-1)).sum()
        for row, wanted in zip(per_row, targets, strict=True)
    ]
    torch.stack(scores).sum().backward()
    seconds = time.perf_counter() - started
    digest = hashlib.sha256(logits.grad.numpy().tobytes()).hexdigest()
    return {
        "way": way,
        "seconds": round(seconds, 3),
        "peak_above_start_mib": round((_kib("VmHWM") - start_kib) / 1024, 1),
        "gradient_sha256": digest,
    }


def grpo_steps(tokenizer: str, steps: int, shape: tuple[int, int, int], workdir: Path) -> dict[str, Any]:
    """``steps`` tiny GRPO steps with the vLLM engine on the ``tokenizer`` model (this process), of
    ``shape = (prompts, completions per prompt, new tokens)``."""
    import lightning as L

    sys.path.insert(0, str(REPO / "tests"))
    from helpers.grpo_helpers import fit_tiny_grpo

    from callbacks.rl_rollout import RolloutCallback
    from datatools.shard_writer import write_shards
    from datatools.synthetic import SynthConfig, encoded_samples
    from models.build import build_model_dir
    from models.grpo import GRPOModule
    from rewards.combine import RewardSpec
    from rollout.vllm_engine import VLLMEngine

    synth = workdir / "synth"
    config = SynthConfig(num_frames=20, fps=2.0, size=56, seed=7)
    samples = encoded_samples(config, "train", 24)
    write_shards(samples, synth, "train", max_samples_per_shard=4, progress=False)
    model_dir = build_model_dir("tiny", workdir / f"model-{tokenizer}", tokenizer=tokenizer)

    class Clock(L.Callback):
        def __init__(self, marks: list[list[float]], opens: bool) -> None:
            self.marks, self.opens = marks, opens

        def on_train_batch_start(self, *args: Any) -> None:
            if self.opens:
                self.marks.append([time.perf_counter()])
            else:
                self.marks[-1].append(time.perf_counter())  # the rollout is done

        def on_train_batch_end(self, *args: Any) -> None:
            if not self.opens:
                self.marks[-1].append(time.perf_counter())

    marks: list[list[float]] = []
    L.seed_everything(0)
    prompts, completions, new_tokens = shape
    module = GRPOModule(str(model_dir), learning_rate=1e-3, max_new_tokens=new_tokens, kl_coef=0.1)
    rollout = RolloutCallback(
        engine=VLLMEngine(dtype="float32", max_num_seqs=prompts * completions),
        num_generations=completions,
        max_new_tokens=new_tokens,
        rewards=[RewardSpec("format", 1.0)],
    )
    callbacks = [Clock(marks, opens=True), rollout, Clock(marks, opens=False)]
    fit_tiny_grpo(
        module, model_dir, synth, workdir / "run", steps=steps, callbacks=callbacks, prompts_per_step=prompts
    )
    later = marks[1:]  # the first step also starts the engine
    text = module.model.config.text_config
    kv = text.num_key_value_heads * text.hidden_size // text.num_attention_heads
    h = text.hidden_size
    layer_macs = text.num_hidden_layers * (h * (h + 2 * kv) + h * h + 3 * h * text.intermediate_size)
    return {
        "tokenizer": tokenizer,
        "vocabulary_rows": module.model.config.text_config.vocab_size,
        "prompts_x_completions_x_new_tokens": list(shape),
        "steps": steps,
        "median_step_s": round(statistics.median(m[2] - m[0] for m in later), 3),
        "median_rollout_s": round(statistics.median(m[1] - m[0] for m in later), 3),
        "median_training_s": round(statistics.median(m[2] - m[1] for m in later), 3),
        "peak_resident_mib": round(_kib("VmHWM") / 1024, 1),
        # Multiply-accumulates of one scored position: the decoder layers, then the output head.
        "decoder_macs_per_position": layer_macs,
        "head_macs_per_position": text.vocab_size * h,
    }


def _in_child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, cwd=REPO, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=64, help="rows of the scoring pattern (G x prompts)")
    parser.add_argument("--positions", type=int, default=8, help="scored positions a row")
    parser.add_argument("--prompts", type=int, default=2, help="GRPO prompts a step")
    parser.add_argument("--completions", type=int, default=3, help="completions a prompt")
    parser.add_argument("--new-tokens", type=int, default=8, help="tokens a completion, at most")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "pattern":
            result = scoring_pattern(int(rest[0]), int(rest[1]), rest[2])
        else:
            with tempfile.TemporaryDirectory() as folder:
                shape = (int(rest[2]), int(rest[3]), int(rest[4]))
                result = grpo_steps(rest[0], int(rest[1]), shape, Path(folder))
        print(json.dumps(result))
        return

    from evaluation.provenance import provenance

    pattern = [_in_child("pattern", str(args.rows), str(args.positions), way) for way in ("index", "unbind")]
    shape = [str(args.prompts), str(args.completions), str(args.new_tokens)]
    steps = [_in_child("steps", tokenizer, str(args.steps), *shape) for tokenizer in ("local", "qwen")]
    ratio = steps[1]["median_step_s"] / steps[0]["median_step_s"]
    macs = [r["decoder_macs_per_position"] + r["head_macs_per_position"] for r in steps]
    report = {
        **provenance([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "scoring_pattern": {
            "shape": [args.rows, args.positions, VOCABULARY],
            "runs": pattern,
            "gradients_identical": pattern[0]["gradient_sha256"] == pattern[1]["gradient_sha256"],
        },
        "grpo_steps": steps,
        "real_over_local_step": round(ratio, 2),
        # The arithmetic of a scored position, real over local: a floor for the compute-bound part.
        "real_over_local_macs_per_position": round(macs[1] / macs[0], 1),
        "target": "the real-vocabulary step at most 3x the local one",
        "target_met": ratio <= 3.0,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
