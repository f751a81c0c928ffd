"""A callback that holds one step (or evaluation batch) open until a stop signal arrives, so that a
test's SIGTERM or Ctrl-C lands mid-step, deterministically, with the data loader's workers busy.

From the start of training (in ``lvrl validate``: of evaluation) it notes every SIGTERM and SIGINT,
passing each on to the handlers already in place (Lightning's, lvrl's Ctrl-C handling). At the
start of training step ``at_step`` (evaluation batch ``at_step``) it writes ``cue_file`` and waits,
for at most ``patience`` seconds, until such a signal has arrived. Under torchrun the test signals
once the first rank writes the cue: a rank that comes to the step later finds the signal noted
already and goes on at once (were it to wait, the other rank would sit in the step's all-reduce).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L

NOTED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class HoldStepUntilSignalled(L.Callback):
    def __init__(self, cue_file: str, at_step: int = 1, patience: float = 60.0) -> None:
        self.cue_file = Path(cue_file)
        self.at_step = at_step
        self.patience = patience
        self.arrived = threading.Event()
        self._previous: dict[signal.Signals, Any] = {}

    def _note(self, signum: int, frame: Any) -> None:
        self.arrived.set()
        handler = self._previous[signal.Signals(signum)]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:  # what the signal would have done without this probe
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _listen(self) -> None:
        # Called once the trainer's own handlers are in place (after Lightning registered its own).
        if not self._previous:
            self._previous = {sig: signal.signal(sig, self._note) for sig in NOTED_SIGNALS}

    def _hold(self) -> None:
        self.cue_file.parent.mkdir(parents=True, exist_ok=True)
        self.cue_file.write_text("in step\n")
        self.arrived.wait(self.patience)

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._listen()

    def on_validation_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.state.fn == "validate":
            self._listen()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step + 1 == self.at_step:
            self._hold()

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: Any, *args: Any, **kwargs: Any
    ) -> None:
        batch_idx = args[1] if len(args) > 1 else kwargs.get("batch_idx", 0)
        if trainer.state.fn == "validate" and batch_idx + 1 == self.at_step:
            self._hold()

    def teardown(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        for sig, handler in self._previous.items():
            if signal.getsignal(sig) == self._note:  # nobody replaced it since
                signal.signal(sig, handler)
        self._previous = {}
