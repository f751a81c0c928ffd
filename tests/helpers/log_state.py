"""A fixture that puts the logging set-up back after a test that installs lvrl's run logging."""

from __future__ import annotations

import logging

import pytest
import transformers.utils.logging as transformers_logging

from app.logs import LIGHTNING_LOGGERS, library_loggers, uninstall_run_logging


@pytest.fixture
def restored_loggers(monkeypatch):
    """Put the library loggers back as they were: other tests in this process start vLLM engines."""
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)  # restored by monkeypatch
    loggers = [logging.getLogger(), *library_loggers(), *map(logging.getLogger, LIGHTNING_LOGGERS)]
    saved = [(lg, list(lg.handlers), lg.propagate, lg.level) for lg in loggers]
    progress_bars = transformers_logging.is_progress_bar_enabled()
    yield
    uninstall_run_logging()
    for logger, handlers, propagate, level in saved:
        logger.handlers[:] = handlers
        logger.propagate, logger.level = propagate, level
    if progress_bars:
        transformers_logging.enable_progress_bar()
