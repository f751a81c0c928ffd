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

Under FSDP2 the sync gathers every parameter with a collective, and the checkpoint of a stop is
gathered too, so the ranks agree on the outcome (``any_rank``): when a rollout failed on any rank,
the failed ranks restart their engines, every rank syncs, the failed ones retry, and a stop signal
or a second failure stops every rank at once. Sequence-parallel peers that share out their
requests (:func:`parallel.collectives.share_out`) all fail when one's engine does (the others
with :class:`~parallel.collectives.PeerFailed`, their engines kept): they retry together. They
share out over a group of their own (:func:`parallel.mesh.sequence_exchange_group`), so when one's
engine hangs, the peers' exchange is left waiting there, not in the group the ranks decide in:
every rank times out, they agree, and they stop together. An engine that fails while loading the
restart's weights does not leave its peers in the gathers either
(:func:`rollout.weight_sync.sync_weights` gathers on to the end). Left: a rollout that runs the
run's own collectives inside it (tool-use episodes encode the replies' frames with the sequence
group; an engine that samples with the live sharded policy gathers it) can still leave peers
waiting until the process group's time-out when it hangs part way.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar, cast

import torch

from core.failures import RolloutFailed, StoppedBySignal
from parallel.collectives import PeerFailed
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
        any_rank: whether a flag holds on any rank of the run (a collective every rank calls,
            such as the strategy's ``reduce_boolean_decision(flag, all=False)``); the default is
            this process alone.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        policy: Callable[[], PolicyHandle],
        weights: Callable[[], Iterable[tuple[str, torch.Tensor]]],
        timeout_s: float | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_MB * MIB,
        stop_requested: Callable[[], bool] = lambda: False,
        any_rank: Callable[[bool], bool] = lambda flag: flag,
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
        self.any_rank = any_rank
        self.restarts = 0
        """Engines restarted after a failed rollout."""
        self.last_sync = SyncReport()
        """What the latest weight sync moved and held."""
        self.sync_pending = False
        """Whether the next rollout pushes the weights first (:meth:`sync_before_next_rollout`)."""

    def start(self, *, sync_weights: bool) -> None:
        """Start the engine on the policy (awake), then push the current weights if asked."""
        self.engine.start(self.policy())
        if sync_weights:
            self.sync_weights()

    def sync_weights(self) -> SyncReport:
        """Stream the current weights into the (awake) engine, bucket by bucket."""
        self.last_sync = sync_weights(self.engine, self.weights(), self.bucket_bytes)
        self.sync_pending = False
        return self.last_sync

    def sync_before_next_rollout(self) -> None:
        """Push the current weights at the start of the next :meth:`run`, as part of its rollout:
        an engine that fails while loading them (a resumed run's first sync, when a stop signal
        reaches the engine's processes too) is restarted and retried, or stopped by the signal,
        as a failed rollout is, rather than failing the run with a traceback."""
        self.sync_pending = True

    def _restart_engine(self) -> None:
        try:
            self.engine.shutdown()
        except Exception as error:  # it has failed already; only its resources matter now
            log.warning("shutting the failed engine down raised %s: %s", type(error).__name__, error)
        gc.collect()
        self.start(sync_weights=False)  # the weights follow, synced with every rank's
        self.restarts += 1

    def run(self, rollout: Callable[[RolloutEngine], T], step: int) -> T:
        """``rollout(engine)`` within the time limit, retried once on a restarted engine.

        Every rank takes the same path: whether some rank's rollout failed, whether a stop signal
        has reached some rank and whether some engine hung are agreed through ``any_rank``, so the
        ranks retry together, or stop (and save, a collective) together. A rank whose own rollout
        answered keeps it, and pushes the weights again beside the restarted engines: the sync
        gathers sharded weights with collectives that need every rank.
        """
        result, error = self._attempt(rollout)
        if not self.any_rank(error is not None):
            return cast(T, result)
        # The same questions in the same order on every rank: each is a collective.
        stopping = self.any_rank(self.stop_requested())
        hung = self.any_rank(isinstance(error, RolloutFailed))
        cause = "" if error is None else f" ({type(error).__name__}: {error})"
        where = "" if error is not None else " on another rank"
        if hung:
            if isinstance(error, RolloutFailed):
                raise error
            raise RolloutFailed(
                f"the rollout engine of another rank did not answer at step {step}"
            ) from error
        if stopping:
            raise StoppedBySignal(
                f"the rollout of step {step} failed{where} after a stop signal{cause}; not retried"
            ) from error
        own_engine_failed = error is not None and not isinstance(error, PeerFailed)
        if own_engine_failed:
            log.error(
                "step %d: the rollout engine failed%s; restarting it and retrying the rollout", step, cause
            )
        elif error is not None:
            log.warning("step %d: %s; retrying the rollout with the group", step, error)
        else:
            log.warning(
                "step %d: another rank's rollout engine failed; syncing the weights with its restart", step
            )
        again: Exception | None = None
        try:  # the restart, its sync and the retry: a failure in any is a second failure
            if own_engine_failed:
                self._restart_engine()
            self.sync_weights()
            if error is not None:
                result = self._within_time_limit(rollout)
        except Exception as failure:
            again = failure
        if self.any_rank(again is not None):
            detail = " on another rank" if again is None else f": {type(again).__name__}: {again}"
            raise RolloutFailed(
                f"the rollout engine failed again after a restart at step {step}{detail}"
            ) from again
        return cast(T, result)

    def _attempt(self, rollout: Callable[[RolloutEngine], T]) -> tuple[T | None, Exception | None]:
        try:
            if self.sync_pending:  # every rank has it pending: the sync's gathers are collectives
                self.sync_weights()
            return self._within_time_limit(rollout), None
        except Exception as error:  # judged in `run`, together with the other ranks'
            return None, error

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
