"""A callback that holds one step (or evaluation batch) open until a stop signal arrives, so that a
test's SIGTERM or Ctrl-C lands mid-step, deterministically, with the data loader's workers busy.

At the start of training step ``at_step`` (in ``lvrl validate``: evaluation batch ``at_step``) it
writes ``cue_file`` and waits, for at most ``patience`` seconds, until SIGTERM or SIGINT arrives;
the handlers already in place (Lightning's, lvrl's Ctrl-C handling) still get the signal first.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L


class HoldStepUntilSignalled(L.Callback):
    def __init__(self, cue_file: str, at_step: int = 1, patience: float = 60.0) -> None:
        self.cue_file = Path(cue_file)
        self.at_step = at_step
        self.patience = patience

    def _hold(self) -> None:
        arrived = threading.Event()
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def note(signum: int, frame: Any) -> None:
            handler = previous[signal.Signals(signum)]
            arrived.set()
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:  # what the signal would have done without this probe
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        for sig in previous:
            signal.signal(sig, note)
        try:
            self.cue_file.parent.mkdir(parents=True, exist_ok=True)
            self.cue_file.write_text("in step\n")
            arrived.wait(self.patience)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step + 1 == self.at_step:
            self._hold()

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: Any, *args: Any, **kwargs: Any
    ) -> None:
        batch_idx = args[1] if len(args) > 1 else kwargs.get("batch_idx", 0)
        if trainer.state.fn == "validate" and batch_idx + 1 == self.at_step:
            self._hold()
