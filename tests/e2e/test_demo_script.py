"""`make demo`'s own script, end to end, at a reduced size: `tools/demo.sh` with fewer steps,
questions and samples (set through its environment, nothing else different).

It builds the synthetic data and the small model, trains CoT-SFT, evaluates, trains GRPO with
the vLLM engine from the SFT export, evaluates again, and prints the before/after table and
the reward plot, as a user's `make demo` does; every command must end (the script is bounded
and every process it started is gone when it has finished). Each training stage and each
evaluation stops inside its pass over the data (the dataloader's worker still running), the case
where a command used to hang at exit; this test is the natural end of `lvrl fit` and
`lvrl validate` for tests/e2e/test_exit_hygiene.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from helpers.cli import REPO_ROOT
from helpers.process_tree import run_to_its_end

REDUCED = {
    "DEMO_SFT_STEPS": "4",
    "DEMO_GRPO_STEPS": "2",
    "DEMO_EVAL_BATCHES": "1",
    "DEMO_EVAL_SAMPLES": "2",
    "DEMO_DATA_SAMPLES": "64",
}
"""4 SFT steps and 2 GRPO steps of 8 questions (an epoch of the 64 training questions is 8 steps),
8 held-out questions (1 batch of the 128), 2 sampled answers each, from 64 questions per split built by
the script (the demo's own 2,400 took most of the test's time)."""

DEMO_WITHIN = 900.0
"""Seconds the reduced script may take: ~130 s measured beside another test run on 2 cores; a
hung command (the hang this guards against) never ends."""


def test_the_demo_script_runs_to_its_table(tmp_path: Path) -> None:
    run_dir, data_dir = tmp_path / "demo", tmp_path / "synth"
    env = {
        **os.environ,
        **REDUCED,
        "DATA_DIR": str(data_dir),
        "LVRL": str(Path(sys.executable).parent / "lvrl"),
        "PYTHONUNBUFFERED": "1",
    }
    ended = run_to_its_end(
        ["bash", "tools/demo.sh", str(run_dir)],
        cwd=REPO_ROOT,
        env=env,
        output_dir=tmp_path / "output",
        exit_within=DEMO_WITHIN,
        tree_within=15.0,
    )
    assert ended.returncode == 0, ended.tail()
    table = (run_dir / "accuracy.md").read_text()
    assert "| | after SFT | after GRPO |" in table and "constant-letter baseline" in table
    assert table.splitlines()[0] in ended.stdout  # printed, as `make demo` shows it
    assert "same 8 questions" in table  # DEMO_EVAL_BATCHES reached both evaluations
    output = ended.stdout + ended.stderr
    assert f"{run_dir / 'sft' / 'hf'} (step 4)" in output and f"{run_dir / 'grpo' / 'hf'} (step 2)" in output
    assert (run_dir / "grpo_reward.png").stat().st_size > 0
    assert "demo finished in" in ended.stdout
