"""Library chatter goes to RUN_DIR/lvrl.log; the console shows each distinct library warning once
(real vLLM loggers, vLLM's own logging set-up as an engine start runs it, real Python warnings)."""

from __future__ import annotations

import io
import logging
import warnings

from helpers.log_state import restored_loggers  # noqa: F401  (fixture)

from app.logs import LOG_FILE_NAME, install_run_logging

THREADS = "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it."


def _flush() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()


def test_repeated_library_messages_reach_the_console_once(tmp_path, restored_loggers) -> None:  # noqa: F811
    import vllm.envs as vllm_envs
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging, init_logger

    console = io.StringIO()
    log_file = install_run_logging(tmp_path / "run", console=console)
    assert log_file == tmp_path / "run" / LOG_FILE_NAME
    if hasattr(vllm_envs.__getattr__, "cache_clear"):
        # An engine started earlier in this test process froze vLLM's environment variables; an
        # `lvrl` process installs its logging before its first engine, which then reads them.
        vllm_envs.__getattr__.cache_clear()
    configure_logging(LoggingConfig())  # what `LLM(...)` runs when the rollout engine starts
    assert not logging.getLogger("vllm").handlers  # vLLM left its stdout handler out

    worker = init_logger("vllm.v1.worker.cpu_worker")
    reload = init_logger("vllm.model_executor.model_loader.reload.layerwise")
    engine = init_logger("vllm.v1.engine.llm_engine")
    for step in range(100):
        worker.warning(THREADS)
        reload.warning("%s: Failed to load weights", f"Layer{step % 3}")
        engine.info("step %d: 64 prompts, 512 tokens", step)
    stream = logging.getLogger("datamodules.stream")  # lvrl's own: each names another sample
    for key in ("a", "b", "c"):
        stream.warning("skipping sample %r in shard %s: %s", key, "s.tar", "bad video")
    for _ in range(3):
        warnings.warn("a library deprecation", UserWarning, stacklevel=1)
        warnings.warn("a library deprecation", UserWarning, stacklevel=1)  # another call site
    for metric in ("val/loss", "val/accuracy"):  # one message, two metric names (Lightning's)
        warnings.warn(f"It is recommended to use `self.log({metric!r}, ..., sync_dist=True)`", stacklevel=1)
    torch_logger = logging.getLogger("torch._dynamo")  # torch's own handler is re-routed too
    torch_logger.warning("recompiling %s", "f")
    torch_logger.warning("recompiling %s", "g")
    _flush()

    shown = console.getvalue()
    assert shown.count("doesn't allow to use `torch.set_num_threads`") == 1, shown
    assert shown.count("Failed to load weights") == 1
    assert "harmless" in shown and f"repeats go to {log_file} only" in shown
    assert shown.startswith(
        f"lvrl: library messages (vLLM, transformers, torch, Python warnings) go to {log_file}"
    )
    assert "prompts, 512 tokens" not in shown  # INFO stays in the file
    assert [f"'{k}'" in shown for k in "abc"] == [True] * 3
    assert shown.count("a library deprecation") == 1
    assert shown.count("It is recommended to use") == 1 and "'val/loss'" in shown
    assert shown.count("recompiling") == 1

    written = log_file.read_text()
    assert written.count("doesn't allow to use `torch.set_num_threads`") == 100
    assert written.count("Failed to load weights") == 100
    assert written.count(": 64 prompts, 512 tokens") == 100
    assert written.count("skipping sample") == 3
    assert written.count("a library deprecation") >= 1
    assert "'val/accuracy'" in written and written.count("recompiling") == 2


def test_install_twice_moves_the_file(tmp_path, restored_loggers) -> None:  # noqa: F811
    console = io.StringIO()
    install_run_logging(tmp_path / "first", console=console)
    second = install_run_logging(tmp_path / "second", console=console)
    logging.getLogger("vllm.x").warning("a message")
    _flush()
    assert console.getvalue().count("a message") == 1  # one console handler, not two
    assert "a message" in second.read_text()
    assert "a message" not in (tmp_path / "first" / LOG_FILE_NAME).read_text()
