"""The README's result blocks are what their results files give (tools/render_results.py)."""

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def renderer():
    spec = importlib.util.spec_from_file_location("render_results", REPO / "tools" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_blocks_match_their_results_files() -> None:
    text = (REPO / "README.md").read_text()
    assert renderer().render(text, REPO) == text, "run: python tools/render_results.py"


def test_a_stale_figure_or_a_missing_block_is_caught() -> None:
    module, text = renderer(), (REPO / "README.md").read_text()
    stale = text.replace("| **overall** |", "| **overall (stale)** |", 1)
    assert module.render(stale, REPO) != stale
    with pytest.raises(ValueError, match="no results:demo block"):
        module.render(text.replace("<!-- results:demo -->", ""), REPO)
