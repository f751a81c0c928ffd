"""``lvrl`` entry point.

``lvrl fit|validate|test|predict`` go to LightningCLI (every argument documented by
``--help``, configs as YAML with ``class_path``/``init_args``); ``lvrl data ...`` and
``lvrl model ...``, ``lvrl plan`` and ``lvrl report ...`` are plain tools (data synthesis, shard
building, model building, export, a run's memory plan, plots and tables of finished runs).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Sequence

# Tool groups and the modules that implement them, imported only when used (start-up stays fast).
TOOL_GROUPS = {
    "data": "app.commands.data",
    "model": "app.commands.model",
    "plan": "app.commands.plan",
    "report": "app.commands.report",
}

# Every subcommand with one line, for `lvrl --help` (LightningCLI's own help lists only its four).
COMMANDS = {
    "fit": "train: CoT-SFT or GRPO (lvrl fit --config configs/demo/sft.yaml)",
    "validate": "evaluate a model on the validation shards (accuracy table, predictions)",
    "test": "Lightning's test loop (lvrl's modules evaluate with validate: --data.val_shards)",
    "predict": "Lightning's predict loop (likewise: use validate, which writes every prediction)",
    "data": "data synth, data zoom: the synthetic tasks; data build: shards from released/benchmark files",
    "model": "model build: a Qwen2.5-VL model from a preset; model export: a checkpoint as an HF directory",
    "plan": "per-GPU memory of a config before launching it: fits or not, what to change",
    "report": "report compare: evaluations side by side; report curve, report frames: plots",
}


def overview() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: lvrl COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in COMMANDS.items()]
    lines += [
        "",
        "`lvrl COMMAND --help` describes a command; `lvrl fit --config FILE --help` also lists the",
        "arguments of the model and data classes that FILE selects. Runs write progress lines to",
        'stdout and library messages to RUN_DIR/lvrl.log (README, "The command line").',
    ]
    return "\n".join(lines)


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
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in TOOL_GROUPS:
        run_tool(given)
        return
    if not given or given[0] in ("-h", "--help"):
        print(overview())
        sys.exit(0 if given else 2)
    if given[0] not in COMMANDS:
        close = difflib.get_close_matches(given[0], list(COMMANDS), n=1)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        print(f"lvrl: unknown command {given[0]!r}{guess}", file=sys.stderr)
        print("  (`lvrl --help` lists the commands)", file=sys.stderr)
        sys.exit(2)
    from app.lightning_cli import run_lightning_cli  # imported late: Lightning is slow to import

    run_lightning_cli(None if argv is None else given)
