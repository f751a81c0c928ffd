"""Keeping a rollout engine answering: a time limit per rollout, and one restart on failure.

An engine that raises during a rollout (a crashed worker, a lost device) is shut down, started
again on the current policy with the current weights (streamed in buckets like every sync), and
the rollout retried once; a second failure, or a rollout that outlives ``timeout_s`` (an
in-process engine that hangs cannot be recovered in place), raises
:class:`~core.failures.RolloutFailed`, which stops training with a checkpoint. A rollout that
fails after a stop signal has arrived is not retried (a scheduler's SIGTERM reaches the engine's
processes too, and restarting an engine can outlast the grace period before its SIGKILL):
:class:`~core.failures.StoppedBySignal` stops training at once, with a checkpoint of the last
finished step.

Under FSDP2 the sync gathers every parameter with a collective, so a restarted engine gets its
weights only if every rank syncs with it: an engine that fails on some ranks only is not yet
recovered in place (the other ranks are not in the gathers).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

from core.failures import RolloutFailed, StoppedBySignal
from rollout.base import PolicyHandle, RolloutEngine
from rollout.weight_sync import DEFAULT_BUCKET_MB, MIB, SyncReport, sync_weights

log = logging.getLogger(__name__)

T = TypeVar("T")


class EngineSupervisor:
    """Owns a :class:`~rollout.base.RolloutEngine` for a training run.

    Args:
        engine: the engine (not started yet).
        policy: returns the policy to (re)start the engine on.
        weights: returns the named parameters to push after a (re)start and after each update:
            the trainable ones (the engine loaded the frozen ones from ``model_path``), plain
            tensors or DTensor shards, in the same order on every rank.
        timeout_s: longest a rollout may take; None: no limit.
        bucket_bytes: the most bytes of gathered weights handed to the engine at once
            (:func:`rollout.weight_sync.sync_weights`).
        stop_requested: whether a stop signal has arrived (the trainer's ``received_sigterm``);
            a rollout that fails then is not retried.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        policy: Callable[[], PolicyHandle],
        weights: Callable[[], Iterable[tuple[str, torch.Tensor]]],
        timeout_s: float | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_MB * MIB,
        stop_requested: Callable[[], bool] = lambda: False,
    ) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"rollout_timeout_s={timeout_s} must be positive or null")
        if bucket_bytes <= 0:
            raise ValueError(f"the weight-sync bucket must be positive, got {bucket_bytes} bytes")
        self.engine = engine
        self.policy = policy
        self.weights = weights
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        self.stop_requested = stop_requested
        self.restarts = 0
        """Engines restarted after a failed rollout."""
        self.last_sync = SyncReport()
        """What the latest weight sync moved and held."""

    def start(self, *, sync_weights: bool) -> None:
        """Start the engine on the policy (awake), then push the current weights if asked."""
        self.engine.start(self.policy())
        if sync_weights:
            self.sync_weights()

    def sync_weights(self) -> SyncReport:
        """Stream the current weights into the (awake) engine, bucket by bucket."""
        self.last_sync = sync_weights(self.engine, self.weights(), self.bucket_bytes)
        return self.last_sync

    def restart(self) -> None:
        try:
            self.engine.shutdown()
        except Exception as error:  # it has failed already; only its resources matter now
            log.warning("shutting the failed engine down raised %s: %s", type(error).__name__, error)
        gc.collect()
        self.start(sync_weights=True)
        self.restarts += 1

    def run(self, rollout: Callable[[RolloutEngine], T], step: int) -> T:
        """``rollout(engine)`` within the time limit, retried once on a restarted engine."""
        try:
            return self._within_time_limit(rollout)
        except RolloutFailed:
            raise
        except Exception as error:
            if self.stop_requested():
                raise StoppedBySignal(
                    f"the rollout of step {step} failed after a stop signal ({type(error).__name__}: "
                    f"{error}); not retried"
                ) from error
            log.error(
                "step %d: the rollout engine failed (%s: %s); restarting it and retrying the rollout",
                step,
                type(error).__name__,
                error,
            )
            self.restart()
            try:
                return self._within_time_limit(rollout)
            except Exception as again:
                raise RolloutFailed(
                    f"the rollout engine failed again after a restart at step {step}: "
                    f"{type(again).__name__}: {again}"
                ) from again

    def _within_time_limit(self, rollout: Callable[[RolloutEngine], T]) -> T:
        if self.timeout_s is None:
            return rollout(self.engine)
        # A daemon thread, so that a hung engine cannot keep the process from exiting.
        outcome: dict[str, T] = {}
        failure: list[BaseException] = []

        def run() -> None:
            try:
                outcome["result"] = rollout(self.engine)
            except BaseException as error:  # handed to the training thread
                failure.append(error)

        thread = threading.Thread(target=run, name="rollout", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise RolloutFailed(
                f"the rollout engine did not answer within rollout_timeout_s={self.timeout_s} s; "
                "an in-process engine that hangs cannot be recovered in place"
            )
        if failure:
            raise failure[0]
        return outcome["result"]
