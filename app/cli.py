"""``lvrl`` entry point.

``lvrl fit|validate|test|predict`` go to LightningCLI (every argument documented by
``--help``, configs as YAML with ``class_path``/``init_args``); ``lvrl data ...`` and
``lvrl model ...``, ``lvrl plan`` and ``lvrl report ...`` are plain tools (data synthesis, shard
building, model building, export, a run's memory plan, plots and tables of finished runs).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import gc
import importlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence

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
        'stdout and library messages to RUN_DIR/lvrl.log (docs/getting-started.md, "The command line").',
    ]
    return "\n".join(lines)


STOPPED_BY_SIGNAL_EXIT_CODE = 143
"""Exit status of any ``lvrl`` command stopped by SIGTERM or Ctrl-C (128 + SIGTERM), so that a job
scheduler can tell a stopped command, to be run again (a fit continues from its checkpoint, a
shard build after its last complete shard), from a finished or a failed one."""


class StopSignal(BaseException):
    """SIGTERM or Ctrl-C reached a tool command (not an ``Exception``: nothing may swallow it)."""


def _raise_stop(signum: int, frame: object) -> None:
    raise StopSignal(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """While a tool runs, SIGTERM and SIGINT raise :class:`StopSignal` in it: its ``with`` blocks
    close (a worker pool is ended, a file being written is closed) and it exits with one line
    instead of a traceback (Ctrl-C) or no word at all (SIGTERM)."""
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    subcommand = getattr(args, f"{argv[0]}_command", None)  # each group's subparsers' dest
    command = " ".join(["lvrl", argv[0], *([subcommand] if subcommand else [])])
    with stop_signals_raise():
        try:
            args.run(args)
        except StopSignal as stop:
            print(f"{command}: stopped by {stop} before it finished; run it again", file=sys.stderr)
            sys.exit(STOPPED_BY_SIGNAL_EXIT_CODE)


READER_GONE_EXIT_CODE = 1
"""Exit status of a command whose output's reader left (``lvrl --help | head``)."""


@contextlib.contextmanager
def quiet_if_the_reader_leaves() -> Iterator[None]:
    """Run a command whose output may be cut short (``| head``) without a traceback."""
    try:
        yield
    except BrokenPipeError:
        # The reader of the output has gone: stop quietly, as other command-line tools do, and
        # point stdout at /dev/null so that Python's own flush at exit does not raise again
        # (the recipe of Python's documentation for SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(READER_GONE_EXIT_CODE)


def main(argv: Sequence[str] | None = None) -> None:
    with quiet_if_the_reader_leaves():
        _main(argv)


def _main(argv: Sequence[str] | None) -> None:
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
    # What these imports build (torch, transformers, Lightning: a few hundred thousand objects)
    # lives as long as the process. The collector would walk it again and again while it grows
    # (each full collection walks everything); instead it is not collected while it is built, and
    # frozen after: left out of every later collection of the run. Only when this call builds it:
    # in a process that imported it before (a test calling `main`), the heap holds the caller's
    # objects too, which are not this command's to freeze.
    if "app.lightning_cli" in sys.modules:
        from app.lightning_cli import run_lightning_cli
    else:
        gc.disable()
        try:
            from app.lightning_cli import run_lightning_cli  # imported late: Lightning is slow to import
        finally:
            gc.freeze()
            gc.enable()
    run_lightning_cli(None if argv is None else given)
