"""Where library chatter goes: everything to ``RUN_DIR/lvrl.log``, each distinct warning once on the console.

vLLM logs at INFO on every engine step and, on CPU, warns on every ``torch.set_num_threads`` call
of the process (its CPU worker replaces that function) and on every weight push; Python warnings
repeat from every call site. :func:`install_run_logging` (called once by ``lvrl fit|validate|...``
when the run folder is known) routes the ``vllm`` and ``transformers`` loggers and Python
warnings through the root logger, which writes every record (INFO and up) to the log file and
passes a library's warning to the console only the first time its message template is seen.
lvrl's own warnings (a skipped sample, a restarted engine) always reach the console: each names
a different sample or step. Lightning's own messages keep their console handler and are copied
into the file.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

from lightning.pytorch.utilities import rank_zero_only

LOG_FILE_NAME = "lvrl.log"
OWN_PACKAGES = (
    "app",
    "callbacks",
    "core",
    "datamodules",
    "datatools",
    "evaluation",
    "models",
    "parallel",
    "rewards",
    "rollout",
    "__main__",
)
"""Loggers of lvrl itself: their warnings are about a named sample or step, never deduplicated."""
LIBRARY_LOGGERS = ("vllm", "transformers", "torch")
"""Libraries with their own console handlers (on the logger or, for torch, its children), re-routed
through the root logger."""
LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric")
_ORIGINAL_SHOWWARNING = warnings.showwarning

# Floods seen in `make demo` with what they mean, added to their first (and only) console line.
KNOWN_REPEATS = {
    "CPU backend doesn't allow to use `torch.set_num_threads`": (
        "harmless: vLLM's CPU worker replaces torch.set_num_threads for the whole process and "
        "warns on every later call (data loader workers, torch internals)"
    ),
    "Failed to load weights": (
        "harmless here: vLLM logs it on every weight push for each layer the pushed state dict has "
        "no tensor for (rotary embeddings, FusedMMInputNorm); the trainer/engine agreement is "
        "checked every step as rollout/logprob_diff_max"
    ),
}


def _is_own(record: logging.LogRecord) -> bool:
    return record.name.split(".", 1)[0] in OWN_PACKAGES


def _template(record: logging.LogRecord) -> tuple[Any, ...]:
    """What makes two records "the same message": the unformatted template (a vLLM layer name or
    a count in the arguments does not make a new message), or the text of a Python warning."""
    key = getattr(record, "dedupe_key", None)
    return (record.name, record.levelno, key if key is not None else str(record.msg))


class FirstOccurrenceFilter(logging.Filter):
    """Console filter: a library's record passes the first time its template is seen; repeats
    (and all library records below WARNING) stay in the log file only. lvrl's own records pass."""

    def __init__(self, log_file: Path) -> None:
        super().__init__()
        self.log_file = log_file
        self.seen: set[tuple[Any, ...]] = set()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if _is_own(record):
            return True
        key = _template(record)
        if key in self.seen:
            self.suppressed += 1
            return False
        self.seen.add(key)
        return True


class ConsoleFormatter(logging.Formatter):
    """``WARNING vllm.x: message``; a known flood says what it means and where its repeats go."""

    def __init__(self, log_file: Path) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")
        self.log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        note = (
            None
            if _is_own(record)
            else next((why for message, why in KNOWN_REPEATS.items() if message in str(record.msg)), None)
        )
        return f"{text}\n  ({note}; repeats go to {self.log_file} only)" if note else text


def _shape(text: str) -> str:
    """A warning's text with quoted names and numbers blanked: Lightning warns once per metric
    name (``self.log('val/loss', ...)``, ``self.log('val/accuracy', ...)``), one message in fact."""
    return re.sub(r"'[^']*'|`[^`]*`|\d+(\.\d+)?", "_", text)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` replacement: a Python warning becomes a record of ``py.warnings``
    keyed by its category and text shape (not its call site): a shape seen before stays in the file."""
    logging.getLogger("py.warnings").warning(
        "%s: %s (%s:%d)",
        category.__name__,
        message,
        filename,
        lineno,
        extra={"dedupe_key": (category.__name__, _shape(str(message)))},
    )


def library_loggers() -> list[logging.Logger]:
    """The loggers :func:`install_run_logging` re-routes: vLLM's, transformers', torch's and those
    of torch's children that have a handler of their own (``torch._dynamo``, ...)."""
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    for name, logger in logging.root.manager.loggerDict.items():
        own_output = isinstance(logger, logging.Logger) and (logger.handlers or not logger.propagate)
        if name.startswith("torch.") and own_output:
            loggers.append(logger)
    return loggers


def install_run_logging(run_dir: str | Path, console: TextIO | None = None) -> Path:
    """Route library logging and Python warnings as the module docstring says; returns the log
    file. Idempotent: a second call (another ``lvrl`` command in the same process) moves the file."""
    log_file = Path(run_dir) / LOG_FILE_NAME
    log_file.parent.mkdir(parents=True, exist_ok=True)
    # vLLM configures its own stdout handler when first imported unless told not to; imported
    # later (by the rollout engine), it then logs through the root logger like any library.
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"

    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "lvrl_run_logging", False):
            root.removeHandler(handler)
            handler.close()
    file_handler = logging.FileHandler(log_file, encoding="utf-8")
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(
        logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    )
    console_handler = logging.StreamHandler(console if console is not None else sys.stderr)
    console_handler.setLevel(logging.WARNING)
    console_handler.addFilter(FirstOccurrenceFilter(log_file))
    console_handler.setFormatter(ConsoleFormatter(log_file))
    for handler in (file_handler, console_handler):
        handler.lvrl_run_logging = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.INFO)

    for library in library_loggers():  # each library's own console handler goes
        for handler in list(library.handlers):
            library.removeHandler(handler)
        library.propagate = True
    logging.getLogger("vllm").setLevel(logging.INFO)  # its per-step INFO belongs in the file
    for name in LIGHTNING_LOGGERS:
        lightning = logging.getLogger(name)
        for handler in list(lightning.handlers):
            if getattr(handler, "lvrl_run_logging", False):
                lightning.removeHandler(handler)
        if not lightning.propagate:  # Lightning keeps its console handler; the file gets a copy
            lightning.addHandler(file_handler)
    warnings.showwarning = _show_warning
    if not console_handler.stream.isatty():  # no \r-redrawn "Loading weights" bars in a log file
        import transformers.utils.logging as transformers_logging

        transformers_logging.disable_progress_bar()
    if rank_zero_only.rank == 0:
        console_handler.stream.write(
            f"lvrl: library messages (vLLM, transformers, torch, Python warnings) go to {log_file}; "
            "each distinct warning is shown here once\n"
        )
    return log_file


def uninstall_run_logging() -> None:
    """Remove what :func:`install_run_logging` added to the root and Lightning loggers (tests)."""
    for logger in (logging.getLogger(), *(logging.getLogger(n) for n in LIGHTNING_LOGGERS)):
        for handler in list(logger.handlers):
            if getattr(handler, "lvrl_run_logging", False):
                logger.removeHandler(handler)
                handler.close()
    warnings.showwarning = _ORIGINAL_SHOWWARNING
