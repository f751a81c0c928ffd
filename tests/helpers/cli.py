"""Running ``lvrl`` from a test: in this process (the default, seconds) or as a subprocess.

In-process runs (:func:`run_lvrl`) go through ``app.cli.main`` with a real ``sys.argv``, exactly
as the ``lvrl`` script does, and put back what a run changes in the process (logging handlers,
environment variables, working directory, the wandb run). A run that raises is reported like a
process that crashed: exit status 1 and the traceback on stderr. Subprocess runs
(:func:`run_cli`) are for what only a process can show: signals, kills, a launcher (torchrun),
the installed entry point itself.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import socket
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = REPO_ROOT / "tests"

# Subprocesses that load the test probes (``helpers.resume_probe...``) by class path.
PROBES_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}


def free_port() -> int:
    """A TCP port free on the loopback now, for a process group's rendezvous (torchrun, gloo)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(
    args: tuple[str, ...], timeout: int, extra_env: dict[str, str] | None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def run_cli(
    *args: str, timeout: int = 600, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``lvrl ARGS`` in a subprocess (offline wandb); fails the test with the output if it fails."""
    result = _run(args, timeout, extra_env)
    assert result.returncode == 0, (
        f"lvrl {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    )
    return result


def run_cli_expecting_failure(
    *args: str, timeout: int = 300, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``lvrl ARGS`` in a subprocess that must exit non-zero; returns the result for its message."""
    result = _run(args, timeout, extra_env)
    assert result.returncode != 0, f"lvrl {' '.join(args)} succeeded unexpectedly:\n{result.stderr[-2000:]}"
    return result


@contextlib.contextmanager
def _process_state_restored():
    """Put back what an ``lvrl`` command changes in its process: the logging set-up
    (:func:`app.logs.install_run_logging`), Python's warning hook, environment variables
    (``PL_GLOBAL_SEED``, ``VLLM_CONFIGURE_LOGGING``), the working directory and ``sys.argv``."""
    from helpers.log_state import logging_restored

    environ, cwd, argv, showwarning = dict(os.environ), os.getcwd(), sys.argv, warnings.showwarning
    frozen_before = gc.get_freeze_count()
    with logging_restored():
        try:
            yield
        finally:
            _drop_run_state(frozen_before)
            os.environ.clear()
            os.environ.update(environ)
            os.chdir(cwd)
            sys.argv, warnings.showwarning = argv, showwarning


def _drop_run_state(frozen_before: int) -> None:
    """What a finished in-process run leaves behind that the next one must not find
    (``frozen_before``: the size of the collector's frozen generation when the run started)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()  # else the next run's WandbLogger would log into this run
    # A vLLM engine that goes away takes vLLM's process-wide parallel state with it, so an
    # engine kept by a test helper from before the run cannot generate any more: drop it
    # too (the next test starts a fresh one).
    engine_helpers = sys.modules.get("helpers.engine_helpers")
    if engine_helpers is not None:
        engine_helpers.drop_vllm_engine()
    if gc.get_freeze_count() > frozen_before:
        # The run froze objects and did not thaw them (an engine that failed before its
        # shutdown, which unfreezes): they could never be collected.
        gc.unfreeze()
    # The run's model and rollout engine (its KV cache) go now, not at random later. A walk of
    # what is not frozen (helpers.frozen_heap): cheap while the worker's long-lived heap is.
    gc.collect()


@contextlib.contextmanager
def _console_handlers_write_to(stream: io.StringIO):
    """Give Lightning's loggers the console handler a fresh process gives them, writing to
    ``stream``: imported with no root handler (a shell), they print INFO lines (the accuracy
    tables) through their own handler; imported under pytest, they would only propagate.
    Handlers they already have are pointed at ``stream`` for the run."""
    from app.logs import LIGHTNING_LOGGERS

    redirected: list[tuple[logging.StreamHandler, object]] = []
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)  # put back by _process_state_restored
        consoles = [h for h in logger.handlers if type(h) is logging.StreamHandler]
        if not consoles:
            logger.addHandler(logging.StreamHandler(stream))
            logger.propagate = False
        redirected += [(handler, handler.setStream(stream)) for handler in consoles]
    try:
        yield
    finally:
        for handler, old in redirected:
            if old is not None:
                handler.setStream(old)


def lvrl(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``lvrl ARGS`` in this process, from the repository root; returns what a subprocess would
    (exit status, stdout, stderr as text), whatever the status."""
    from app.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with _process_state_restored():
        os.environ.update({"WANDB_MODE": "offline", **(extra_env or {})})
        os.chdir(REPO_ROOT)
        sys.argv = ["lvrl", *args]
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            _console_handlers_write_to(stderr),
        ):
            try:
                main()
                code = 0
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
                if isinstance(done.code, str):
                    print(done.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()  # as an uncaught exception ends a process: status 1
                code = 1
    return subprocess.CompletedProcess(["lvrl", *args], code, stdout.getvalue(), stderr.getvalue())


def run_lvrl(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """:func:`lvrl` that must succeed; fails the test with the output if it does not."""
    result = lvrl(*args, extra_env=extra_env)
    assert result.returncode == 0, (
        f"lvrl {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    )
    return result


def run_lvrl_expecting_failure(
    *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """:func:`lvrl` that must end with a non-zero status; returns the result for its message."""
    result = lvrl(*args, extra_env=extra_env)
    assert result.returncode != 0, f"lvrl {' '.join(args)} succeeded unexpectedly:\n{result.stderr[-2000:]}"
    return result
