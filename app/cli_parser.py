"""The argument parser of ``lvrl fit|validate|test|predict``: short errors that name the close
matches of a mistyped key, and a ``--help`` that shows the arguments of the classes a config selects.

jsonargparse answers a mistyped key with the whole usage (~50 lines) before the error; here the
first line names the key and its close matches (``difflib`` over the keys the parser or the
selected class accepts), the next lines give jsonargparse's own message, and ``--help`` is a hint.

In subclass mode (``model: {class_path: ..., init_args: ...}``) jsonargparse's ``--help`` lists
only ``--model.help CLASS``; with ``--config`` on the command line the help goes on with the init
arguments of the model and data classes that config selects.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import yaml
from jsonargparse import ArgumentParser
from lightning.pytorch.cli import LightningArgumentParser

SELECTABLE = ("model", "data")
"""Config keys whose class a config selects (``class_path``)."""
HELP_FLAGS = ("-h", "--help")
REJECTION = r"unrecognized arguments|does not accept option|Problem with given class_path|is not accepted"
LINKED = {"data": {"processor_path"}}
"""Init arguments set by a link (``model.init_args.model_path``), not by the user."""


def class_arguments(cls: type, key: str | None = None) -> list[str]:
    """The argument names jsonargparse accepts for ``cls`` (its own and those passed on by ``**kwargs``)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, key, fail_untyped=False)
    return [a.dest for a in parser._actions if a.dest not in ("help", argparse.SUPPRESS)]


def import_class(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _known_keys(parser: argparse.ArgumentParser) -> list[str]:
    return [a.dest for a in parser._actions if a.dest not in ("help", argparse.SUPPRESS)]


def _close(key: str, candidates: Iterable[str]) -> list[str]:
    """The known keys closest to ``key``: near-certain ones if any, else plausible ones; compared
    whole, then by the last part among the keys of the same parent (``trainer.max_stepz``)."""
    candidates = list(dict.fromkeys(candidates))
    parent, _, leaf = key.rpartition(".")
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    for cutoff in (0.85, 0.6):
        matches = difflib.get_close_matches(key, candidates, n=3, cutoff=cutoff)
        matches = matches or [siblings[m] for m in difflib.get_close_matches(leaf, list(siblings), 3, cutoff)]
        if matches:
            return matches
    return []


def unknown_keys(message: str, parser: argparse.ArgumentParser) -> list[tuple[str, list[str]]]:
    """``(key, close matches)`` for each key jsonargparse's ``message`` rejects."""
    found: list[tuple[str, list[str]]] = []
    unrecognized = re.match(r"unrecognized arguments: (.*)", message)
    if unrecognized:
        for token in unrecognized.group(1).split():
            if token.startswith("--"):
                key = token[2:].split("=", 1)[0]
                found.append((key, _close(key, _known_keys(parser))))
    for match in re.finditer(r"(?:Subcommand|Group) '([^']+)' does not accept option '([^']+)'", message):
        key = match.group(2)
        found.append((key, _close(key, _known_keys(parser))))
    # An init argument a class does not have: 'Parser key "model": ... Problem with given
    # class_path 'models.sft.SFTModule': ... Option 'learning_rat' is not accepted'.
    parent = re.search(r'Parser key "([^"]+)"', message)
    for match in re.finditer(
        r"Problem with given class_path '([^']+)':\s*(?:Key|Option) '([^']+)' is not accepted", message
    ):
        class_path, option = match.groups()
        prefix = f"{parent.group(1)}.init_args." if parent else ""
        try:
            names = class_arguments(import_class(class_path))
        except (ImportError, AttributeError, ValueError):
            names = []
        found.append((prefix + option, [prefix + m for m in _close(option, names)]))
    return found


def short_error(prog: str, message: str, parser: argparse.ArgumentParser) -> str:
    """The text ``lvrl`` prints for a parse error: the unknown keys and their close matches
    first, then jsonargparse's message without the echo of the whole given value, then a hint."""
    lines = []
    unknown = unknown_keys(message, parser)
    for key, matches in unknown:
        guess = f"; did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""
        lines.append(f"{prog}: unknown key {key!r}{guess}")
    detail = [line for line in message.strip().splitlines() if not line.strip().startswith("Given value")]
    if unknown:  # jsonargparse's lines that name the key; not the union's other alternatives
        detail = [line for line in detail if re.search(REJECTION, line)]
    else:
        lines.append(f"{prog}: {detail[0].strip() if detail else message}")
        detail = detail[1:]
    lines += [f"  {line.rstrip()}" for line in detail if line.strip()][:12]
    lines.append(f"  (`{prog} --help` lists the options; with `--config FILE` also those of its classes)")
    return "\n".join(lines) + "\n"


def selected_classes(argv: Sequence[str]) -> dict[str, str]:
    """``{"model": class_path, "data": class_path}`` as the configs and flags of ``argv`` select them
    (later ones win, as in parsing). Unreadable configs are skipped: parsing reports them."""
    selected: dict[str, str] = {}
    args = list(argv)
    for index, arg in enumerate(args):
        name, _, inline = arg.partition("=")
        value = inline or (args[index + 1] if index + 1 < len(args) else "")
        if name in ("-c", "--config"):
            try:
                config = yaml.safe_load(Path(value).read_text())
            except (OSError, yaml.YAMLError):
                continue
            for key in SELECTABLE:
                spec = config.get(key) if isinstance(config, dict) else None
                class_path = spec.get("class_path") if isinstance(spec, dict) else spec
                if isinstance(class_path, str):
                    selected[key] = class_path
        for key in SELECTABLE:
            if name in (f"--{key}", f"--{key}.class_path") and value and not value.startswith("-"):
                selected[key] = value
    return selected


class LvrlArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with :func:`short_error` and the selected classes in ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.selected: dict[str, str] = {}
        """Set on the subcommand parsers by the CLI from ``argv`` (:func:`selected_classes`)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        sys.stderr.write(short_error(parser.prog.replace(" [options]", ""), message, parser))
        self.exit(2)

    def print_help(self, file: IO[str] | None = None) -> None:
        super().print_help(file)
        for key, class_path in self.selected.items():
            if f"{key}.help" not in {a.dest for a in self._actions}:
                continue
            try:
                cls = import_class(class_path)
            except (ImportError, AttributeError, ValueError):
                continue
            self._print_class_help(key, class_path, cls, file)

    def _print_class_help(self, key: str, class_path: str, cls: type, file: IO[str] | None) -> None:
        sub = ArgumentParser(
            prog=self.prog,
            usage=argparse.SUPPRESS,
            add_help=False,
            description=(
                f"{key}: {class_path}, selected by the config. Set as --{key}.NAME VALUE or "
                f"{key}.init_args.NAME in YAML; the defaults below are the class's (the config's "
                "values: add --print_config)."
            ),
        )
        sub.add_class_arguments(cls, key, fail_untyped=False, skip=LINKED.get(key, set()))
        stream: Any = file if file is not None else sys.stdout
        stream.write("\n")
        sub.print_help(stream)
