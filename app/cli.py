"""``lvrl`` entry point.

``lvrl fit|validate|test|predict`` go to LightningCLI (every argument documented by
``--help``, configs as YAML with ``class_path``/``init_args``); ``lvrl data ...`` and
``lvrl model ...`` and ``lvrl report ...`` are plain tools (data synthesis, shard building, model
building, export, plots and tables of finished runs).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Tool groups and the modules that implement them, imported only when used (start-up stays fast).
TOOL_GROUPS = {"data": "app.commands.data", "model": "app.commands.model", "report": "app.commands.report"}


def run_tool(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="lvrl", description="lvrl data and model tools")
    groups = parser.add_subparsers(dest="group", required=True)
    for name, module_name in TOOL_GROUPS.items():
        if name != argv[0]:
            groups.add_parser(name)
            continue
        module = importlib.import_module(module_name)
        summary = module.__doc__.splitlines()[0] if module.__doc__ else None
        module.register(groups.add_parser(name, help=summary, description=summary))
    args = parser.parse_args(list(argv))
    args.run(args)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOL_GROUPS:
        run_tool(argv)
        return
    from app.lightning_cli import run_lightning_cli  # imported late: Lightning is slow to import

    run_lightning_cli(argv)
