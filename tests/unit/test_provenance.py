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
