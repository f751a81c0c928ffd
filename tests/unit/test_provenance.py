"""Where a result came from (``evaluation/provenance.py``): the commit read from git, or stated
for a copied tree whose git metadata is not its own, and ``unknown`` outside a checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evaluation import provenance


def test_the_commit_is_read_from_the_checkout() -> None:
    assert re.fullmatch(r"[0-9a-f]{40}(\+changes)?", provenance.commit())


def test_a_stated_commit_is_taken_and_marked_as_stated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(provenance.SOURCE_COMMIT_VARIABLE, "7771c67")
    assert provenance.commit() == "7771c67 (stated by LVRL_SOURCE_COMMIT)"
    assert provenance.provenance(["python", "x.py"])["commit"].startswith("7771c67 ")


def test_outside_a_checkout_the_commit_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(provenance.SOURCE_COMMIT_VARIABLE, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert provenance.commit(tmp_path) == "unknown"


def test_the_recorded_commit_is_the_checkout_the_process_started_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long run records the code it ran: a commit made while it works is not its. The module
    is loaded from a checkout of its own, which then moves on by one commit."""
    import importlib.util
    import shutil
    import subprocess

    monkeypatch.delenv(provenance.SOURCE_COMMIT_VARIABLE, raising=False)
    repo = tmp_path / "repo"
    (repo / "evaluation").mkdir(parents=True)
    shutil.copy(provenance.__file__, repo / "evaluation" / "provenance.py")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]

    def commit_all(message: str) -> str:
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", message], check=True)
        return subprocess.run(
            [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()

    subprocess.run([*git, "init", "-q"], check=True)
    first = commit_all("the code the run imports")
    spec = importlib.util.spec_from_file_location("provenance_copy", repo / "evaluation" / "provenance.py")
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)  # the run starts
    (repo / "notes.md").write_text("committed while the run works")
    second = commit_all("later")
    assert copy.commit() == second  # the checkout now
    assert copy.provenance(["python", "x.py"])["commit"] == first  # what the run executes
