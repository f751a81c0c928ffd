"""Running a command to its end and checking that every process it started has ended too.

A command's processes are found by a marker in their environment (``LVRL_EXIT_PROBE``), which
every descendant inherits: dataloader workers, pool processes, vLLM's engine processes,
multiprocessing's resource tracker and wandb's service, also those that leave the command's
session or are re-parented once their parent ends. Zombies (ended, not yet reaped by whoever
adopted them) hold no environment and count as ended.

A hang fails the test at a stated bound instead of waiting for it: the report names every
process still alive with its state and what it is waiting in, then all of them are killed.
The command's output goes to files, not pipes: a leftover process that inherited a pipe would
keep a reader waiting for its end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

MARKER_VARIABLE = "LVRL_EXIT_PROBE"

# Bounds for a stopped ``lvrl`` command (a hang is infinite, so they only decide how soon it is
# reported).
EXIT_WITHIN = 120.0
"""Seconds from the signal to the command's exit: finishing a step of the tiny model, writing a
checkpoint and closing the wandb run take seconds, even with both cores busy."""
TREE_WITHIN = 15.0
"""Seconds from the command's exit until each of its processes is gone: torch joins a loader's
workers for at most 5 s before it ends them, and multiprocessing's resource tracker ends once its
last user has."""


@dataclass
class EndedCommand:
    """How a command ended: its exit status (negative: killed by that signal), its output, and
    the seconds from the signal (or its start, unsignalled) to its exit."""

    returncode: int
    stdout: str
    stderr: str
    seconds_to_exit: float

    def tail(self, characters: int = 3000) -> str:
        return f"stdout:\n{self.stdout[-characters:]}\nstderr:\n{self.stderr[-characters:]}"


def processes_marked(marker: str) -> list[int]:
    """Live processes whose environment carries ``MARKER_VARIABLE=marker`` (zombies excluded)."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environment = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environment.split(b"\0"):
            found.append(int(entry))
    return found


def describe(pids: Sequence[int]) -> str:
    """One line per process: pid, state, what the kernel says it waits in, its command line."""
    lines = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            state = next(
                line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("State")
            )
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, StopIteration):
            continue
        lines.append(f"  pid {pid} [{state}] waiting in {wchan}: {command[:200]}")
    return "\n".join(lines) or "  (none)"


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_all(marker: str) -> None:
    for pid in processes_marked(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_to_its_end(
    command: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    output_dir: Path,
    exit_within: float,
    tree_within: float,
    send: int | None = None,
    when: Callable[[], bool] | None = None,
    to_group: bool = True,
    start_within: float = 300.0,
) -> EndedCommand:
    """Run ``command`` in a session of its own; once ``when()`` holds, send it ``send`` (to its
    whole process group, as a terminal's Ctrl-C, ``timeout`` or a scheduler does, or with
    ``to_group=False`` to the command's own process alone).

    Fails the test when the command has not exited ``exit_within`` seconds after the signal
    (unsignalled: after ``when()`` held, or after its start), when ``when()`` never held within
    ``start_within`` seconds, or when any process it started is alive ``tree_within`` seconds after
    it exited.
    """
    import pytest

    marker = uuid.uuid4().hex
    output_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = output_dir / "stdout.txt", output_dir / "stderr.txt"
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env={**env, MARKER_VARIABLE: marker},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            # As a terminal's foreground job: Ctrl-C not ignored (a pytest-xdist worker ignores
            # SIGINT, and a child would inherit that, so Python would install no handler).
            preexec_fn=_interruptible,
        )
    started = time.monotonic()

    def output() -> str:
        return f"stdout:\n{out_path.read_text()[-3000:]}\nstderr:\n{err_path.read_text()[-3000:]}"

    def fail(why: str) -> None:
        alive = processes_marked(marker)
        report = f"{why}\nprocesses of the command still alive:\n{describe(alive)}\n{output()}"
        _kill_all(marker)
        process.wait(timeout=30)
        pytest.fail(report)

    try:
        if when is not None:
            while not when():
                if process.poll() is not None:
                    pytest.fail(f"the command ended (status {process.returncode}) before its cue\n{output()}")
                if time.monotonic() - started > start_within:
                    fail(f"no cue within {start_within:.0f} s of the start")
                time.sleep(0.05)
        cue = time.monotonic() if when is not None else started
        if send is not None:
            if to_group:
                os.killpg(process.pid, send)
            else:
                process.send_signal(send)
        try:
            process.wait(timeout=exit_within)
        except subprocess.TimeoutExpired:
            fail(f"the command did not exit within {exit_within:.0f} s")
        exited = time.monotonic()
        while alive := processes_marked(marker):
            if time.monotonic() - exited > tree_within:
                fail(f"{len(alive)} of its processes outlived the command by {tree_within:.0f} s")
            time.sleep(0.1)
    finally:
        _kill_all(marker)
        if process.poll() is None:
            process.kill()
            process.wait()
    return EndedCommand(process.returncode, out_path.read_text(), err_path.read_text(), exited - cue)


STOPPED_BY_SIGNAL = 143  # app.lightning_cli.STOPPED_BY_SIGNAL_EXIT_CODE


def assert_stopped_with_a_checkpoint(ended: EndedCommand, run_dir: Path) -> None:
    """A signalled ``lvrl fit`` stopped as it should: status 143, a line saying how to continue,
    no traceback, and the checkpoint it wrote."""
    assert ended.returncode == STOPPED_BY_SIGNAL, ended.tail()
    assert "continue with --ckpt_path last" in ended.stderr, ended.tail()
    assert "Traceback" not in ended.stderr, ended.tail()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
