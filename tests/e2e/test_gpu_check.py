"""The prepared GPU check (``bench/gpu_check.py``) runs its own code on the CPU at toy sizes, so that
it works the day a GPU is lent: ring attention of one rank, a GRPO step of the sharded model,
each measured beside the planner, written with the command, commit, machine and date."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.cli import REPO_ROOT


def test_the_gpu_check_runs_on_the_cpu_at_toy_sizes(tmp_path: Path) -> None:
    command = [sys.executable, "bench/gpu_check.py", "--cpu-dry-run", "--out", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {"command", "commit", "machine", "date"} <= summary.keys()
    for part in ("ring", "grpo_step"):
        assert summary[part]["measured"] > 0 and summary[part]["predicted"] > 0
    assert "ring attention, one rank" in result.stdout and "GRPO step" in result.stdout
