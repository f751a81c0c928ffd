"""Write docs/configuration.md: every key a config can set, with its default and meaning, from the code.

For each lvrl class a shipped config names (``class_path``), the keys are the ``__init__``
parameters of the class and of its lvrl base classes, the defaults their signatures' defaults and
the meanings the ``Args:`` sections of their docstrings; nothing is restated by hand, so the
reference cannot drift from the code (``tests/unit/test_docs.py`` fails when the file differs from
what this script writes, and when a shipped config sets a key the reference does not list).
Lightning's own keys that the shipped configs set (``trainer.*``, the loggers', the checkpoint's)
are listed with Lightning's defaults and a pointer to its documentation.

Usage: python tools/render_config_reference.py [--check]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
OUT = REPO / "docs" / "configuration.md"
OUR_PACKAGES = ("app", "callbacks", "datamodules", "models", "parallel", "rollout", "rewards")
SECTION = re.compile(r"^(?:Args|Attributes):\n(.*?)(?=^\S|\Z)", re.S | re.M)
ENTRY = re.compile(r"^    ([A-Za-z_][\w /,]*?):\s*(.*)$")


def shipped_configs(root: Path = REPO) -> list[Path]:
    return sorted((root / "configs").rglob("*.yaml"))


def config_keys(node: Any, owner: str) -> Iterator[tuple[str, str]]:
    """``(owner, key)`` of every key set in a parsed config: an ``init_args`` key belongs to its
    ``class_path``, a top-level or ``trainer`` key to ``config`` / ``trainer``."""
    if isinstance(node, list):
        for item in node:
            yield from config_keys(item, owner)
    elif isinstance(node, dict):
        if "class_path" in node:
            for key, value in (node.get("init_args") or {}).items():
                yield node["class_path"], key
                yield from config_keys(value, node["class_path"])
            return
        for key, value in node.items():
            yield owner, key
            yield from config_keys(value, key if owner == "config" else owner)


def used_keys(root: Path = REPO) -> set[tuple[str, str]]:
    keys: set[tuple[str, str]] = set()
    for path in shipped_configs(root):
        keys |= set(config_keys(yaml.safe_load(path.read_text()), "config"))
    return keys


def _ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] in OUR_PACKAGES


def documented_args(cls: type) -> dict[str, str]:
    """Each parameter's text in the ``Args:`` sections of ``cls``'s and its bases' docstrings."""
    docs: dict[str, list[str]] = {}
    for owner in cls.__mro__:
        for source in (
            owner.__dict__.get("__doc__"),
            getattr(owner.__dict__.get("__init__"), "__doc__", None),
        ):
            match = SECTION.search(inspect.cleandoc(source or ""))
            if match is None:
                continue
            current: list[str] = []
            for line in match.group(1).splitlines():
                entry = ENTRY.match(line)
                if entry:
                    current = [n.strip() for n in re.split(r"[/,]", entry.group(1))]
                    for name in current:
                        docs.setdefault(name, []).append(entry.group(2))
                elif current and line.strip():
                    for name in current:
                        docs[name].append(line.strip())
    return {name: " ".join(parts) for name, parts in docs.items()}


def parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The ``__init__`` parameters of ``cls`` and of its lvrl bases (keyword-settable ones)."""
    found: dict[str, inspect.Parameter] = {}
    for owner in reversed(cls.__mro__):
        if "__init__" in owner.__dict__ and (_ours(owner) or owner is cls):
            for parameter in list(inspect.signature(owner.__init__).parameters.values())[1:]:
                if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                    found[parameter.name] = parameter
    return found


def _default(parameter: inspect.Parameter | None) -> str:
    if parameter is None:
        return "(Lightning's)"
    if parameter.default is inspect.Parameter.empty:
        return "required"
    value = parameter.default
    if isinstance(value, float) and value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        return f"`{value:.0e}`"
    return "`null`" if value is None else f"`{value!r}`".replace("True", "true").replace("False", "false")


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", text).replace("|", "\\|").strip()


def load(path: str) -> type:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def render(root: Path = REPO) -> str:
    keys = used_keys(root)
    classes = sorted({owner for owner, _ in keys if "." in owner})
    ours = [path for path in classes if path.split(".")[0] in OUR_PACKAGES]
    lightning = [path for path in classes if path not in ours]
    lines = [
        "# Configuration reference",
        "",
        "<!-- Written by tools/render_config_reference.py from the code; do not edit by hand. -->",
        "",
        "Configs are LightningCLI YAML (`lvrl fit --config FILE`, any key overridable on the command",
        "line: `--model.init_args.learning_rate 1e-5`). Top level: `seed_everything`, `trainer`",
        "(Lightning's Trainer), `model`, `data` (each a `class_path` with its `init_args`). Below, every",
        "key of each lvrl class a shipped config names, its default and its meaning, taken from the",
        "class's signature and docstring; then Lightning's keys that the shipped configs set.",
        "",
    ]
    for path in ours:
        cls = load(path)
        docs = documented_args(cls)
        lines += [f"## `{path}`", "", _cell((inspect.getdoc(cls) or "").split("\n\n")[0]), ""]
        params = parameters(cls)
        inherited = sorted(key for owner, key in keys if owner == path and key not in params)
        if not params and not inherited:
            lines += ["No keys.", ""]
            continue
        lines += ["| key | default | meaning |", "|---|---|---|"]
        for name, parameter in params.items():
            lines.append(f"| `{name}` | {_default(parameter)} | {_cell(docs.get(name, 'undocumented'))} |")
        for name in inherited:  # passed on to a Lightning base class (ModelCheckpoint's, say)
            base = next(b for b in cls.__mro__[1:] if not _ours(b))
            lines.append(f"| `{name}` | (Lightning's) | {base.__name__}'s `{name}`: see Lightning's docs |")
        lines.append("")
    lines += [
        "## Lightning's keys set by the shipped configs",
        "",
        "| key | Lightning's default |",
        "|---|---|",
    ]
    trainer = inspect.signature(load("lightning.pytorch.Trainer").__init__).parameters
    for key in sorted(key for owner, key in keys if owner == "trainer"):
        lines.append(f"| `trainer.{key}` | {_default(trainer.get(key))} |")
    for path in lightning:
        params = parameters(load(path))
        for key in sorted(key for owner, key in keys if owner == path):
            lines.append(f"| `{path}`: `{key}` | {_default(params.get(key))} |")
    top = sorted(key for owner, key in keys if owner == "config" and key not in ("trainer", "model", "data"))
    lines += ["", "Top-level keys: " + ", ".join(f"`{key}`" for key in top) + "."]
    return "\n".join(lines) + "\n"


def listed(text: str) -> set[tuple[str, str]]:
    """``(owner, key)`` pairs the reference lists, read back from its text."""
    found, owner = set(), ""
    for line in text.splitlines():
        section = re.match(r"^## `([\w.]+)`", line)
        if section:
            owner = section.group(1)
        row = re.match(r"^\| `([\w]+)` \|", line)
        if row and owner:
            found.add((owner, row.group(1)))
        trainer = re.match(r"^\| `trainer\.(\w+)` \|", line)
        if trainer:
            found.add(("trainer", trainer.group(1)))
        external = re.match(r"^\| `([\w.]+)`: `(\w+)` \|", line)
        if external:
            found.add((external.group(1), external.group(2)))
    top = re.search(r"^Top-level keys: (.*)\.$", text, re.M)
    if top:
        found |= {("config", key) for key in re.findall(r"`(\w+)`", top.group(1))}
    found |= {("config", key) for key in ("trainer", "model", "data")}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is not current")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(
                f"{OUT.relative_to(REPO)} is not what the code gives: python tools/render_config_reference.py"
            )
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
