"""The command line as a newcomer meets it, run in-process through ``app.cli.main`` with a real
``sys.argv``: the overview, help that shows the selected classes, short answers to typos, no
warning on every command, and a short fit whose progress reads in a file; and, as a process
(what a closed pipe does to it), output piped into a reader that leaves early."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import yaml
from helpers.cli import REPO_ROOT
from helpers.log_state import restored_loggers  # noqa: F401  (fixture)
from helpers.runs import fit_args

from app.cli import COMMANDS, main


def run_main(monkeypatch, *argv: str) -> int:
    """``lvrl ARGV`` as from a shell: sys.argv set, the repository as working directory."""
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(sys, "argv", ["lvrl", *argv])
    try:
        main()
    except SystemExit as done:
        return int(done.code or 0)
    return 0


def test_output_piped_into_a_reader_that_left_ends_quietly() -> None:
    """``lvrl --help | head -0``: the pipe's reader is gone before the first write."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        ended = subprocess.run(
            [sys.executable, "-m", "app", "--help"],
            cwd=REPO_ROOT, stdout=writer, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(writer)
    assert ended.returncode == 1, ended.stderr
    assert ended.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit


def test_overview_lists_every_command(monkeypatch, capsys) -> None:
    assert run_main(monkeypatch, "--help") == 0
    out = capsys.readouterr().out
    for name in ("fit", "validate", "test", "predict", "data", "model", "report", "plan"):
        assert any(line.split()[:1] == [name] and len(line.split()) > 1 for line in out.splitlines()), name
    assert set(COMMANDS) == {"fit", "validate", "test", "predict", "data", "model", "report", "plan"}


def test_unknown_command_names_the_close_one(monkeypatch, capsys) -> None:
    assert run_main(monkeypatch, "fitt", "--config", "configs/demo/sft.yaml") == 2
    assert capsys.readouterr().err.splitlines()[0] == "lvrl: unknown command 'fitt'; did you mean 'fit'?"


def test_help_with_a_config_shows_the_selected_classes(monkeypatch, capsys) -> None:
    assert run_main(monkeypatch, "fit", "--config", "configs/demo/grpo.yaml", "--help") == 0
    out = capsys.readouterr().out
    assert "model: models.grpo.GRPOModule, selected by the config" in out
    assert "datamodules.longvideo_reason.LongVideoReasonDataModule, selected by the" in out
    for option in ("--model.kl_coef", "--model.num_iterations", "--data.num_frames", "--data.batch_size"):
        assert option in out, option
    assert "--data.processor_path" not in out  # linked to model_path, not set by hand


def test_help_without_a_config_is_lightnings(monkeypatch, capsys) -> None:
    assert run_main(monkeypatch, "validate", "--help") == 0
    out = capsys.readouterr().out
    assert "--model.help" in out and "selected by the config" not in out


@pytest.mark.parametrize(
    ("where", "first_line"),
    [
        ("flag", "lvrl fit: unknown key 'trainer.max_stepz'; did you mean 'trainer.max_steps'?"),
        ("yaml", "lvrl fit: unknown key 'trainer.max_stepz'; did you mean 'trainer.max_steps'?"),
        (
            "init_args",
            "lvrl fit: unknown key 'model.init_args.learning_rat'; "
            "did you mean 'model.init_args.learning_rate'?",
        ),
    ],
)
def test_a_mistyped_key_is_answered_with_its_close_match(monkeypatch, capsys, tmp_path, where, first_line):
    config = yaml.safe_load((REPO_ROOT / "configs/demo/sft.yaml").read_text())
    extra: list[str] = []
    if where == "flag":
        extra = ["--trainer.max_stepz", "3"]
    elif where == "yaml":
        config["trainer"]["max_stepz"] = config["trainer"].pop("max_steps")
    else:
        config["model"]["init_args"]["learning_rat"] = config["model"]["init_args"].pop("learning_rate")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert run_main(monkeypatch, "fit", "--config", str(path), *extra) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == first_line, err
    assert len(err) <= 5 and not any(line.startswith("usage:") for line in err), err
    assert "--help" in err[-1]


def test_a_short_fit_reads_well_in_a_file(
    monkeypatch,
    capsys,
    tmp_path,
    tiny_model_dir,
    synth_dir,
    restored_loggers,  # noqa: F811
) -> None:
    """Progress lines on stdout (a captured stream, as in `make demo > demo.log`), the run's log
    file, and no LightningCLI "args parameter" warning."""
    run_dir = tmp_path / "run"
    args = fit_args(run_dir, tiny_model_dir, str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar"), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_main(monkeypatch, *args, "--trainer.logger", "false") == 0
    assert not [w for w in caught if "args parameter" in str(w.message)]
    out = capsys.readouterr().out
    assert "train step 2/2 (100%)  loss " in out and "ETA 0s" in out, out[-2000:]
    assert "validate done: 1 batch in" in out
    assert (run_dir / "lvrl.log").is_file()
