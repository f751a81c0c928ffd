"""Putting the logging set-up back after a test (or an in-process run) that installs lvrl's run logging."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
import transformers.utils.logging as transformers_logging

from app.logs import LIGHTNING_LOGGERS, library_loggers, uninstall_run_logging


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """Undo :func:`app.logs.install_run_logging` and put the root, library and Lightning loggers
    (handlers, propagation, level) and transformers' progress bars back as they were."""
    loggers = [logging.getLogger(), *library_loggers(), *map(logging.getLogger, LIGHTNING_LOGGERS)]
    saved = [(lg, list(lg.handlers), lg.propagate, lg.level) for lg in loggers]
    progress_bars = transformers_logging.is_progress_bar_enabled()
    try:
        yield
    finally:
        uninstall_run_logging()
        for logger, handlers, propagate, level in saved:
            logger.handlers[:] = handlers
            logger.propagate, logger.level = propagate, level
        if progress_bars:
            transformers_logging.enable_progress_bar()


@pytest.fixture
def restored_loggers(monkeypatch):
    """Put the library loggers back as they were: other tests in this process start vLLM engines."""
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)  # restored by monkeypatch
    with logging_restored():
        yield
