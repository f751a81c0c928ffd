"""The package import graph: layered, no cycles, the leaf imports nothing of ours.

Read from the source (every ``import`` statement, including those inside functions), so an
import added anywhere counts. The table is the architecture: a package may import only the
packages listed for it; ``app`` (the command line) may import everything. The model-family
adapters (``families``) are a layer of their own, below the generic machinery that asks
them (sequence-parallel prefill, engines, collator): they count as the node ``families``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.cli import REPO_ROOT

FAMILIES = "families"
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    FAMILIES: {"core"},
    "rewards": {"core"},
    "parallel": {"core", FAMILIES},
    "rollout": {"core", "rewards", "parallel", FAMILIES},
    "datamodules": {"core", "parallel", FAMILIES},
    "datatools": {"core", "datamodules", FAMILIES},
    "evaluation": {"core", "rewards", "rollout", FAMILIES},
    "models": {"core", "parallel", "rewards", "evaluation", FAMILIES},
    "planner": {"core", "rollout", "models", FAMILIES},
    "callbacks": {
        "core",
        "parallel",
        "rollout",
        "rewards",
        "evaluation",
        "models",
        "datamodules",
        "planner",
        FAMILIES,
    },
}
PACKAGES = {*ALLOWED, "app"}


def node_of(dotted: str) -> str:
    """The graph node of a module name or path: its top-level package, or ``families``.

    >>> node_of("families.qwen3_vl"), node_of("models.grpo")
    ('families', 'models')
    """
    return FAMILIES if dotted == FAMILIES or dotted.startswith(FAMILIES + ".") else dotted.split(".")[0]


def package_imports(root: Path = REPO_ROOT) -> dict[str, dict[str, set[str]]]:
    """``{package: {imported package: {files that import it}}}`` over our packages under ``root``."""
    graph: dict[str, dict[str, set[str]]] = {}
    for package in sorted(PACKAGES):
        folder = root / package
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.py")):
            edges = graph.setdefault(package, {})
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = node_of(name)
                    if top in PACKAGES and top != package:
                        edges.setdefault(top, set()).add(str(path.relative_to(root)))
    return graph


def test_every_package_imports_only_what_its_layer_allows() -> None:
    graph = package_imports()
    assert set(graph) == PACKAGES  # every package of the table exists
    wrong = [
        f"{package} -> {imported} ({', '.join(sorted(files))})"
        for package, edges in graph.items()
        if package != "app"
        for imported, files in sorted(edges.items())
        if imported not in ALLOWED[package]
    ]
    assert not wrong, "imports outside the allowed layers:\n" + "\n".join(wrong)


def test_the_allowed_table_itself_has_no_cycle() -> None:
    # Depth-first search over the table (so the checked graph, a subgraph of it, has none either).
    done: set[str] = set()

    def visit(package: str, path: tuple[str, ...]) -> None:
        assert package not in path, f"cycle: {' -> '.join((*path, package))}"
        if package in done:
            return
        for dependency in ALLOWED.get(package, set()):
            visit(dependency, (*path, package))
        done.add(package)

    for package in ALLOWED:
        visit(package, ())


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "engine.py").write_text(
        "import core.layout\nfrom rewards import combine\nfrom . import base\n"
        "def f():\n    from models.grpo import GRPOModule\n"
    )
    graph = package_imports(tmp_path)
    assert {name: sorted(files) for name, files in graph["rollout"].items()} == {
        "core": ["rollout/engine.py"],
        "rewards": ["rollout/engine.py"],
        "models": ["rollout/engine.py"],  # inside a function: still an import
    }
