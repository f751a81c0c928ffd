"""A fixture that puts the logging set-up back after a test that installs lvrl's run logging."""

from __future__ import annotations

import logging

import pytest

from app.logs import uninstall_run_logging


@pytest.fixture
def restored_loggers(monkeypatch):
    """Put the library loggers back as they were: other tests in this process start vLLM engines."""
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)  # restored by monkeypatch
    names = ("", "vllm", "transformers", "lightning.pytorch", "lightning.fabric")
    loggers = {name: logging.getLogger(name) for name in names}
    saved = {name: (list(lg.handlers), lg.propagate, lg.level) for name, lg in loggers.items()}
    yield
    uninstall_run_logging()
    for name, (handlers, propagate, level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.propagate, logger.level = propagate, level
