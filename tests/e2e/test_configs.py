"""Every YAML under configs/ parses with the real CLI (`--print_config` exits 0).

Each config is parsed in this process through ``app.cli.main`` (:func:`helpers.cli.lvrl`); one
`lvrl fit --print_config` runs as a subprocess, to see that a fresh process prints no warning;
and a command called in a process that has imported lvrl already leaves the caller's heap unfrozen."""

from __future__ import annotations

import resource
import warnings

import pytest
import yaml
from helpers.cli import REPO_ROOT, lvrl, run_cli

CONFIGS = sorted((REPO_ROOT / "configs").rglob("*.yaml"))


def test_there_are_configs() -> None:
    assert CONFIGS


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(REPO_ROOT / "configs")))
def test_config_parses(config) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = lvrl("fit", "--config", str(config), "--print_config")
    assert result.returncode == 0, result.stderr[-3000:]
    printed = yaml.safe_load(result.stdout)
    assert printed["model"]["init_args"]["model_path"]
    assert printed["data"]["class_path"]
    # processor_path is linked to model_path, so it is derived, not a setting of its own.
    assert "processor_path" not in printed["data"]["init_args"]
    # Progress shows in a terminal (a step-counting bar) and in a log file (lines).
    callbacks = [c["class_path"] for c in printed["trainer"]["callbacks"]]
    assert {"callbacks.progress.StepProgressBar", "callbacks.progress.ProgressLines"} <= set(callbacks)
    # No warning before the output (LightningCLI's "args parameter" one was).
    assert not [w for w in caught if "args parameter" in str(w.message)]
    assert "Warning" not in result.stderr, result.stderr[-2000:]


def test_print_config_in_a_fresh_process_warns_nothing() -> None:
    """No warning before the output on a command from a shell (nothing imported yet, default
    filters), and start-up in seconds: imports and parsing, what an impossible config costs
    before it fails (test_config_validation)."""
    # CPU seconds of the child, not wall time: the verdict must not depend on how busy the
    # machine is (2 shared cores: the same start-up takes 10 s idle and 25 s wall under load).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_cli("fit", "--config", "configs/demo/grpo.yaml", "--print_config", timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert yaml.safe_load(result.stdout)["model"]["class_path"] == "models.grpo.GRPOModule"
    assert "Warning" not in result.stderr and "args parameter" not in result.stderr, result.stderr[-2000:]
    # Imports and parsing take ~10 CPU s.
    assert cpu_seconds < 30, f"{cpu_seconds:.1f} CPU s"


def test_a_command_in_a_process_that_imported_lvrl_before_freezes_none_of_the_callers_objects(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lvrl` freezes the heap its imports build, out of the collector's walks; called in a
    process that has imported them already (a test, a notebook), it must not freeze the caller's
    objects with them: those would never be collected as part of a cycle."""
    import gc

    import app.lightning_cli  # noqa: F401  # what `main` would otherwise import (and freeze)
    from app.cli import main

    frozen = gc.get_freeze_count()
    monkeypatch.setattr("sys.argv", ["lvrl", "fit", "--config", "configs/demo/sft.yaml", "--print_config"])
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SystemExit):
        main()
    assert "SFTModule" in capsys.readouterr().out
    assert gc.get_freeze_count() <= frozen  # nothing added to the frozen generation
