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


class RolloutFailed(SafeStop):
    """The rollout engine failed again after a restart, or stopped answering."""
