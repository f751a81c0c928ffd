"""LightningCLI for lvrl: ``lvrl fit|validate|test --config configs/....yaml``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.cli import STOPPED_BY_SIGNAL_EXIT_CODE
from app.cli_parser import HELP_FLAGS, LvrlArgumentParser, selected_classes
from app.logs import install_run_logging
from app.validation import ConfigError, validate_config
from callbacks.checkpoint import RunCheckpoint, with_atomic_checkpoint_io
from core.failures import SafeStop, StoppedBySignal
from datamodules.longvideo_reason import LongVideoReasonDataModule
from models.vlm_module import VLMModule
from parallel.process_group import release_process_group
from rollout.engine_limits import EngineLimitError

RUN_DIR_TOKEN = "${trainer.default_root_dir}"


def _substitute(value: Any, token: str, replacement: str) -> Any:
    if isinstance(value, str):
        return value.replace(token, replacement)
    if isinstance(value, Namespace):
        for key, item in vars(value).items():  # direct children only; recursion handles nesting
            setattr(value, key, _substitute(item, token, replacement))
        return value
    if isinstance(value, dict):
        return {k: _substitute(v, token, replacement) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, token, replacement) for v in value]
    return value


class LvrlCLI(LightningCLI):
    """LightningCLI with lvrl's conventions.

    - ``model.init_args.model_path`` is linked to ``data.init_args.processor_path``: the data
      is prepared by the processor of the model being trained.
    - ``${trainer.default_root_dir}`` inside any string of the config (logger ``save_dir``,
      callback ``dirpath``) is replaced by the run folder, so one ``--trainer.default_root_dir``
      moves a whole run (checkpoints, CSV metrics, wandb files, HF export).
    - Once the config is checked, library logging goes to ``RUN_DIR/lvrl.log`` (:mod:`app.logs`).
    - Checkpoints are written atomically (:class:`callbacks.checkpoint.AtomicCheckpointIO` joins the
      trainer's ``plugins``) unless the config names its own checkpoint writer.
    - The parser (:class:`app.cli_parser.LvrlArgumentParser`) answers a mistyped key with its close
      matches, and ``--help`` with ``--config`` lists the selected classes' arguments.
    """

    def __init__(self, *args: Any, help_classes: dict[str, str] | None = None, **kwargs: Any) -> None:
        self.help_classes = help_classes or {}
        super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs: Any) -> LvrlArgumentParser:
        parser = super().init_parser(**kwargs)
        parser.selected = self.help_classes  # `--help` goes on with these classes' arguments
        return parser

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("model.init_args.model_path", "data.init_args.processor_path")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        run_dir = config.trainer.default_root_dir or os.getcwd()
        config.trainer = _substitute(config.trainer, RUN_DIR_TOKEN, str(run_dir))
        # Before any logger, model or engine exists: an impossible config fails in seconds.
        try:
            validate_config(self.subcommand or "", config.as_dict())
        except ConfigError as error:
            print(f"lvrl {self.subcommand}: {error}", file=sys.stderr)
            sys.exit(2)
        # From here on library chatter goes to RUN_DIR/lvrl.log, each distinct warning once on screen.
        install_run_logging(run_dir)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        plugins = kwargs.pop("plugins", config.trainer.plugins)
        strategy = kwargs.get("strategy", config.trainer.strategy)
        return super().instantiate_trainer(plugins=with_atomic_checkpoint_io(plugins, strategy), **kwargs)

    def after_fit(self) -> None:
        # A Ctrl-C stops training cleanly with a checkpoint (RunCheckpoint); say so in the exit
        # status, as after SIGTERM, so that the run is not taken for a finished one.
        if any(isinstance(c, RunCheckpoint) and c.interrupted for c in self.trainer.callbacks):
            print("stopped by a signal; continue with --ckpt_path last", file=sys.stderr)
            sys.exit(STOPPED_BY_SIGNAL_EXIT_CODE)

    def before_fit(self) -> None:
        # Lightning's own error for this names neither the module nor the replacement setting.
        if not self.model.automatic_optimization and self.trainer.gradient_clip_val:
            raise ValueError(
                f"{type(self.model).__name__} runs its own optimizer updates: remove "
                f"trainer.gradient_clip_val={self.trainer.gradient_clip_val} and set "
                "model.init_args.max_grad_norm instead"
            )


class _ParsedConfig(Exception):
    """Carries a parsed config out of :class:`_ConfigReader`."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__("parsed")
        self.config = config


class _ConfigReader(LvrlCLI):
    """``lvrl fit``'s own parse, stopped before any class is instantiated."""

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        raise _ParsedConfig(config.as_dict())


def parsed_fit_config(config: str | os.PathLike[str], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The ``lvrl fit`` config file ``config``, with command-line ``overrides``
    (``--trainer.devices 8``), as LightningCLI parses it for ``lvrl fit``: every class's init
    arguments, those the file leaves out with the class's own defaults, links applied. Nothing
    is instantiated (no model is loaded); a config ``lvrl fit`` would refuse exits the same way.
    What ``lvrl plan`` plans (:mod:`planner.run_config`)."""
    try:
        _ConfigReader(
            VLMModule,
            LongVideoReasonDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=["fit", "--config", str(config), *overrides],
            parser_class=LvrlArgumentParser,
            parser_kwargs={"prog": "lvrl"},
            save_config_callback=None,
            auto_configure_optimizers=False,
            seed_everything_default=False,
        )
    except _ParsedConfig as parsed:
        return parsed.config
    raise AssertionError("LightningCLI went past before_instantiate_classes")


def run_lightning_cli(argv: Sequence[str] | None = None) -> LvrlCLI:
    """``lvrl fit|validate|test|predict``; ``argv`` None reads ``sys.argv`` (the command line)."""
    given = sys.argv[1:] if argv is None else list(argv)
    wants_help = any(flag in given for flag in HELP_FLAGS)
    try:
        cli = LvrlCLI(
            VLMModule,
            LongVideoReasonDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            # None: LightningCLI reads sys.argv itself (and warns when given both).
            args=None if argv is None else list(argv),
            parser_class=LvrlArgumentParser,
            parser_kwargs={"prog": "lvrl"},
            help_classes=selected_classes(given) if wants_help else None,
            auto_configure_optimizers=False,
        )
    # Each way out below is one every rank takes together, past its last collective (a safe stop
    # is agreed between ranks and saved by all): the process group can end here. An error
    # leaves it open (parallel.process_group says why).
    except StoppedBySignal as stop:
        release_process_group()
        print(f"stopped by a signal: {stop}\ncontinue with --ckpt_path last", file=sys.stderr)
        sys.exit(STOPPED_BY_SIGNAL_EXIT_CODE)
    except EngineLimitError as refused:  # found in the rollout callback's setup, before any weight loads
        print(f"lvrl {_subcommand(given)}: {refused}", file=sys.stderr)
        sys.exit(2)
    except SafeStop as stop:
        release_process_group()
        print(f"training stopped: {stop}\ncontinue with --ckpt_path last once fixed", file=sys.stderr)
        sys.exit(1)
    except SIGTERMException:
        # Lightning stops at the end of the step (or evaluation batch) on SIGTERM and raises a
        # SystemExit with status 0, which would look like a finished run.
        release_process_group()
        print(f"stopped by a signal; {_how_to_continue(given)}", file=sys.stderr)
        sys.exit(STOPPED_BY_SIGNAL_EXIT_CODE)
    except SystemExit as stop:
        # Lightning answers a KeyboardInterrupt (an evaluation's Ctrl-C, a training's second one)
        # with `sys.exit(1)`, which would look like a failed run. The ranks need not agree here,
        # so the process group stays open (an error's way out, parallel.process_group).
        if not isinstance(stop.__context__, KeyboardInterrupt):
            raise
        print(f"interrupted; {_how_to_continue(given)}", file=sys.stderr)
        sys.exit(STOPPED_BY_SIGNAL_EXIT_CODE)
    except KeyboardInterrupt:  # before or after Lightning's own loops (loading, building)
        print(f"interrupted; {_how_to_continue(given)}", file=sys.stderr)
        sys.exit(STOPPED_BY_SIGNAL_EXIT_CODE)
    release_process_group()
    return cli


def _subcommand(argv: Sequence[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _how_to_continue(argv: Sequence[str]) -> str:
    """What a run stopped by a signal leaves to do: training continues from ``last.ckpt``
    (RunCheckpoint saved it); an evaluation saves no state to continue from, so it starts again."""
    subcommand = _subcommand(argv)
    if subcommand == "fit":
        return "continue with --ckpt_path last"
    command = f"lvrl {subcommand}" if subcommand else "the run"
    return f"{command} did not finish and saved nothing to continue from: run it again"
