"""Errors that stop training between two steps, in a state worth saving.

``callbacks.checkpoint.RunCheckpoint`` writes ``last.ckpt`` when training ends with a
:class:`SafeStop`, so ``--ckpt_path last`` continues from the last good state once the cause is
fixed; the CLI prints the message instead of a traceback.
"""

from __future__ import annotations


class SafeStop(RuntimeError):
    """Training stopped between two steps (no half-applied update): a checkpoint now is consistent."""


class NonFiniteUpdates(SafeStop):
    """Too many consecutive updates had a non-finite loss or gradient norm (each one was skipped)."""


class StepNotTaken(SafeStop):
    """Training stopped inside a step, before it trained on its batch (its rollout failed): the
    checkpoint counts that batch as not read, so that a resumed run trains on it."""


class RolloutFailed(StepNotTaken):
    """The rollout engine failed again after a restart, or stopped answering."""


class StoppedBySignal(StepNotTaken):
    """A stop signal (SIGTERM) arrived and the step under way could not finish: its rollout
    failed as the job's processes were being stopped. Saved like any safe stop; ``lvrl fit``
    exits as a pre-empted run does."""
