"""``lvrl`` entry point.

``lvrl fit|validate|test|predict`` go to LightningCLI (every argument documented by
``--help``, configs as YAML with ``class_path``/``init_args``); ``lvrl data ...`` and
``lvrl model ...`` are plain tools (data synthesis, shard building, model building, export).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app.commands import data as data_commands
from app.commands import model as model_commands

TOOL_GROUPS = {"data": data_commands, "model": model_commands}


def run_tool(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="lvrl", description="lvrl data and model tools")
    groups = parser.add_subparsers(dest="group", required=True)
    for name, module in TOOL_GROUPS.items():
        module.register(groups.add_parser(name, help=module.__doc__.splitlines()[0] if module.__doc__ else None))
    args = parser.parse_args(list(argv))
    args.run(args)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TOOL_GROUPS:
        run_tool(argv)
        return
    from app.lightning_cli import run_lightning_cli  # imported late: Lightning is slow to import

    run_lightning_cli(argv)
