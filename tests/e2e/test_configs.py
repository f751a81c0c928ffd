"""Every YAML under configs/ parses with the real CLI (`--print_config` exits 0)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import REPO_ROOT

CONFIGS = sorted((REPO_ROOT / "configs").rglob("*.yaml"))


def test_there_are_configs() -> None:
    assert CONFIGS


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(REPO_ROOT / "configs")))
def test_config_parses(config) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "fit", "--config", str(config), "--print_config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = yaml.safe_load(result.stdout)
    assert printed["model"]["init_args"]["model_path"]
    assert printed["data"]["class_path"]
    # processor_path is linked to model_path, so it is derived, not a setting of its own.
    assert "processor_path" not in printed["data"]["init_args"]
    # Progress shows in a terminal (a step-counting bar) and in a log file (lines).
    callbacks = [c["class_path"] for c in printed["trainer"]["callbacks"]]
    assert {"callbacks.progress.StepProgressBar", "callbacks.progress.ProgressLines"} <= set(callbacks)
    # No warning before the output, on any command (LightningCLI's "args parameter" one was).
    assert "Warning" not in result.stderr and "args parameter" not in result.stderr, result.stderr[-2000:]
