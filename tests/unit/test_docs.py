"""The docs hold together: every relative link and anchor resolves, and every results block is
what its results files give (tools/render_results.py)."""

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def renderer():
    spec = importlib.util.spec_from_file_location("render_results", REPO / "tools" / "render_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    found, fence = set(), False
    for line in page.read_text().splitlines():
        fence ^= line.startswith("```")
        if not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for page in renderer().pages(REPO):
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_results_blocks_match_their_results_files() -> None:
    assert renderer().stale_pages(REPO, write=False) == [], "run: python tools/render_results.py"


def test_a_stale_figure_or_a_missing_block_is_caught(tmp_path: Path) -> None:
    module = renderer()
    results = ("bench/results/demo", "bench/results/real_vocab", "bench/results/suite", "bench/results/plan")
    results += ("bench/results/input_pipeline", "bench/results/lora")
    results += ("bench/results/plan_check",)
    for part in ("README.md", "docs", *results):
        source, target = REPO / part, tmp_path / part
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            target.write_text(source.read_text())
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("| **overall** |", "| **overall (stale)** |", 1))
    assert module.stale_pages(tmp_path, write=False) == [readme]
    readme.write_text(readme.read_text().replace("<!-- results:demo -->", ""))
    with pytest.raises(ValueError, match=r"no page holds the results block\(s\) \['demo'\]"):
        module.stale_pages(tmp_path, write=False)


def config_reference():
    path = REPO / "tools" / "render_config_reference.py"
    spec = importlib.util.spec_from_file_location("render_config_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_what_the_code_gives() -> None:
    module = config_reference()
    written = (REPO / "docs" / "configuration.md").read_text()
    assert module.render(REPO) == written, "run: python tools/render_config_reference.py"
    assert "undocumented" not in written  # every lvrl key has a meaning in its class's docstring


def test_every_key_of_the_shipped_configs_is_in_the_reference() -> None:
    module = config_reference()
    used = module.used_keys(REPO)
    assert len(used) > 100  # the configs were read
    missing = used - module.listed((REPO / "docs" / "configuration.md").read_text())
    assert not missing, sorted(missing)
