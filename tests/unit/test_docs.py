"""The docs hold together: every relative link and anchor resolves, and every results block is
what its results files give (tools/render_results.py)."""

import importlib.util
import json
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
    results += (
        "bench/results/plan_check",
        "bench/results/rollout",
        "bench/results/mr_sp",
        "bench/results/zoom_cost",
        "bench/results/gpu_check",
        "bench/results/mismatch_weights",
        "bench/results/demo-qwen3_vl",
        "bench/results/zoom_cuda/given50",
        "bench/results/process_costs",
        "bench/results/zoom_protocol/given-share-0.5-seed0-budget3000/grpo-lr1e-4-kl0.2-requests-metrics.csv.gz",
        *(str(p.relative_to(REPO)) for p in (REPO / ZOOM_BENCH).glob("report-seeds-*.md")),
    )
    for part in ("README.md", "docs", *results):
        source, target = REPO / part, tmp_path / part
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("| **overall** |", "| **overall (stale)** |", 1))
    assert module.stale_pages(tmp_path, write=False) == [readme]
    readme.write_text(readme.read_text().replace("<!-- results:demo -->", ""))
    with pytest.raises(ValueError, match=r"no page holds the results block\(s\) \['demo'\]"):
        module.stale_pages(tmp_path, write=False)


ZOOM_BENCH = "bench/results/zoom_protocol/bench-given-share-0.5"


def zoom_report(seeds: list[int], date: str, lines: str) -> str:
    header = (
        f"# bench/zoom.py report, seeds {seeds}\n\n- command: zoom.py --seeds {' '.join(map(str, seeds))}\n"
    )
    header += f"- commit: {'a' * 40}\n- machine: " + '{"cpu": "AMD EPYC", "cores": 2, "gpu": null}'
    return f"{header}\n- date: {date}\n\n```\n{lines}\n```\n"


def test_the_zoom_bench_block_is_the_report_over_the_most_seeds(tmp_path: Path) -> None:
    folder = tmp_path / ZOOM_BENCH
    folder.mkdir(parents=True)
    (folder / "report-seeds-0-1.md").write_text(zoom_report([0, 1], "2026-12-01", "two seeds"))
    (folder / "report-seeds-2.md").write_text(zoom_report([2], "2026-12-03", "seed 2 alone, later"))
    block = renderer().zoom_bench_block(tmp_path)
    assert (
        "report-seeds-0-1.md`, printed by `python bench/zoom.py --seeds 0 1` at commit aaaaaaa on 2026-12-01"
        in block
    )
    assert block.endswith("```\ntwo seeds\n```")
    # Over as many seeds, the later report wins: a rerun with more stages replaces the earlier one.
    (folder / "report-seeds-0-2.md").write_text(zoom_report([0, 2], "2026-12-02", "a later pair"))
    assert renderer().zoom_bench_block(tmp_path).endswith("```\na later pair\n```")
    (folder / "report-seeds-0-1-2.md").write_text(zoom_report([0, 1, 2], "2026-12-01", "three seeds"))
    assert renderer().zoom_bench_block(tmp_path).endswith("```\nthree seeds\n```")


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


# A figure is a number with a unit of measure, a ratio or a p-value.
FIGURE = re.compile(
    r"\d(?:[\d,]*\d)?(?:\.\d+)?\s?(?:%|GiB|MiB|KiB|GB|MB|ms\b|s\b|min\b|h\b|tok/s|tokens/s|frames/s)"
    r"|\bx\d+(?:\.\d+)?\b|\b\d+(?:\.\d+)?x\b|\bp\s?[=<]\s?0?\.\d"
)
# Where a figure may come from: a results file, a test that asserts it on every CI run, or a
# statement that it is not a measurement.
SOURCE = re.compile(
    r"bench/results/|tests/\w+/test_\w+\.py|not measured|arithmetic|FLOP count|by construction"
)
RESULTS_PATH = re.compile(r"bench/results/[\w./*+-]*\w")


def paragraphs_with_unsourced_figures(text: str) -> list[str]:
    """The paragraphs of a page that quote a figure (outside rendered blocks, code and inline
    code, where settings and outputs are written) without naming where it comes from, in the
    paragraph itself or, for a table, in the paragraph that introduces it."""
    text = re.sub(r"<!-- results:(\w+) -->.*?<!-- /results:\1 -->", "", text, flags=re.DOTALL)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(
        r"`[^`\n]*`", lambda span: span.group(0) if SOURCE.search(span.group(0)) else "`code`", text
    )
    unsourced, previous = [], ""
    for paragraph in re.split(r"\n\s*\n|\n(?=#)", text):
        table = paragraph.lstrip().startswith("|")
        if FIGURE.search(paragraph) and not (SOURCE.search(paragraph) or (table and SOURCE.search(previous))):
            unsourced.append(paragraph.strip())
        previous = paragraph
    return unsourced


def test_every_figure_names_its_source() -> None:
    # docs/configuration.md is rendered from the code's docstrings; dated pages under docs/results/
    # are records of older runs, each marked so at its top.
    unsourced = []
    for page in renderer().pages(REPO):
        if page.name == "configuration.md" or page.parent.name == "results":
            continue
        unsourced += [
            f"{page.relative_to(REPO)}: {p[:120]!r}"
            for p in paragraphs_with_unsourced_figures(page.read_text())
        ]
    assert not unsourced, "\n".join(unsourced)


def test_the_figure_check_catches_an_unsourced_figure() -> None:
    assert paragraphs_with_unsourced_figures("A step takes 1.2 s.\n\nIt is fast.") == ["A step takes 1.2 s."]
    assert paragraphs_with_unsourced_figures("Measured (`bench/results/x/run.json`): 1.2 s.") == []
    assert paragraphs_with_unsourced_figures("From `bench/results/x.json`:\n\n| a |\n|---|\n| 3 s |") == []
    assert (
        paragraphs_with_unsourced_figures(
            "Set `--budget 3GB`.\n\n<!-- results:x -->\n4 s\n<!-- /results:x -->"
        )
        == []
    )


def test_every_dated_results_page_says_what_it_is_and_every_results_path_exists() -> None:
    for page in sorted((REPO / "docs" / "results").glob("*.md")):
        assert re.match(r"# .+\n\n> \*\*Superseded", page.read_text()), (
            f"{page.name}: no superseded note at its top"
        )
    missing = []
    for page in renderer().pages(REPO):
        for path in set(RESULTS_PATH.findall(page.read_text())):
            if not any(REPO.glob(path)):
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert not missing, "\n".join(missing)


def test_a_suite_record_s_pace_is_rendered_beside_the_process_costs_record() -> None:
    """The suite block says how fast the machine was around the run, when the record has it."""
    render = renderer()
    assert render.pace_sentence(REPO, {"commit": "abc"}) == ""  # records before the probe
    summary = {"median": 7.61, "min": 7.2, "max": 7.64, "runs": 3}
    pace = {"trainer_imports_cpu_seconds": {"before": summary, "after": {**summary, "median": 6.04}}}
    sentence = render.pace_sentence(REPO, {"pace": pace})
    assert "took 7.6 CPU-seconds before the run and 6.0 after (medians of 3)" in sentence
    assert "`bench/results/process_costs/`" in sentence


def test_a_later_record_on_a_faster_machine_says_how_much_less_cpu(tmp_path: Path) -> None:
    """The aim's block compares the latest suite record's CPU seconds with the earlier one's: a
    smaller figure reads "N% less", never a negative "more" or "-N% less"."""
    suite = tmp_path / "bench" / "results" / "suite"
    (suite / "before").mkdir(parents=True)

    def record(commit: str, cpu: int) -> str:
        run = {"commit": commit, "date": "2026-11-30", "passed": 10, "pytest_seconds": 400}
        return json.dumps({**run, "total_seconds": 450, "cpu_seconds": {"total": cpu}})

    (suite / "before" / "ci.json").write_text(record("aaa", 650))
    (suite / "ci.json").write_text(record("bbb", 598))
    (suite / "comparison.json").write_text(json.dumps({"after": "before"}))
    block = renderer().suite_aim_block(tmp_path)
    assert block.endswith("the same work took 8% less CPU time on the machine of the later record.")
