"""A rollout engine that fails on one rank only, across two real gloo processes.

The weight sync of a sharded policy and the checkpoint of a stop are collectives, so every rank
must take the same path after a failed rollout: restart-and-retry together, or stop together.
Here the weights are summed over the ranks as they are handed out (five parts, each a collective
as FSDP's gathers are, handed to the engine one at a time), a rollout may be shared out between
the ranks (a collective inside it, over a group of their own as between sequence-parallel
peers), and the process group's timeout turns a rank left waiting into a failure (a minute:
a passing run takes seconds).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from helpers.recording_engines import FlakyEngine

from core.failures import RolloutFailed, StoppedBySignal
from parallel.collectives import share_out
from parallel.mesh import MeshShape, sequence_exchange_group
from rollout.base import PolicyHandle, RolloutEngine, SamplingConfig
from rollout.supervision import EngineSupervisor

WORLD_SIZE = 2
FAILING_RANK = 1
WEIGHT_PARTS = 5


def _any_rank(flag: bool) -> bool:
    decision = torch.tensor([int(flag)])
    dist.all_reduce(decision, op=dist.ReduceOp.MAX)
    return bool(decision.item())


def _summed_weights(parts: int) -> Iterator[tuple[str, torch.Tensor]]:
    for index in range(parts):
        weight = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(weight)  # every rank must be here, as in a sharded policy's gathers
        yield f"w{index}", weight


def _rollout(engine: RolloutEngine) -> list[Any]:
    return engine.generate([], SamplingConfig(n=2))


def _shared_rollout(engine: RolloutEngine, peers: dist.ProcessGroup) -> list[Any]:
    """Sequence-parallel peers' way: the same four requests, each rank sampling its share."""
    requests: list[Any] = [None] * 4
    return share_out(requests, lambda mine: engine.generate(mine, SamplingConfig(n=2)), peers)


def _scenario(
    rank: int,
    fail: int,
    hang_s: float = 0.0,
    stop_on_rank0: bool = False,
    shared: dist.ProcessGroup | None = None,
    fail_sync: int = 0,
) -> dict[str, Any]:
    mine = rank == FAILING_RANK
    engine = FlakyEngine(
        fail=fail if mine else 0, hang_s=hang_s if mine else 0.0, fail_sync=fail_sync if mine else 0
    )
    pushed: list[float] = []

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for name, weight in _summed_weights(WEIGHT_PARTS):
            pushed.append(float(weight.item()))  # 1 + 2: only if both ranks were in this gather
            yield name, weight

    supervisor = EngineSupervisor(
        engine,
        policy=lambda: PolicyHandle("policy-dir", torch.nn.Linear(1, 1), None),
        weights=weights,
        timeout_s=0.5 if hang_s else None,
        bucket_bytes=4,  # a float32 each: every part handed over before the next is gathered
        stop_requested=lambda: stop_on_rank0 and rank == 0,
        any_rank=_any_rank,
    )
    supervisor.start(sync_weights=False)
    outcome: dict[str, Any] = {"raised": None, "message": ""}
    rollout = _rollout if shared is None else functools.partial(_shared_rollout, peers=shared)
    try:
        outcome["result"] = len(supervisor.run(rollout, step=3))
    except (RolloutFailed, StoppedBySignal) as error:
        outcome.update(raised=type(error).__name__, message=str(error))
    # Whatever happened, the ranks are still in step: one more collective answers on both.
    outcome["in_step"] = _any_rank(False) is False
    outcome.update(restarts=supervisor.restarts, starts=len(engine.starts), pushed=pushed)
    return outcome


def _run(rank: int, store_path: str, out_dir: str) -> None:
    store = dist.FileStore(store_path, WORLD_SIZE)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=60)
    )
    # Sequence-parallel peers share out over a group of their own, as the strategy makes it.
    peers = sequence_exchange_group(MeshShape(data=1, sequence=WORLD_SIZE))
    assert peers is not dist.group.WORLD and dist.get_process_group_ranks(peers) == [0, 1]
    outcomes = {
        "fails once": _scenario(rank, fail=1),
        "fails twice": _scenario(rank, fail=2),
        "fails once, stop on rank 0": _scenario(rank, fail=1, stop_on_rank0=True),
        "hangs": _scenario(rank, fail=0, hang_s=2.0),
        "answers, stop on rank 0": _scenario(rank, fail=0, stop_on_rank0=True),
        "shared, fails once": _scenario(rank, fail=1, shared=peers),
        "shared, fails twice": _scenario(rank, fail=2, shared=peers),
        "fails once, then loading weights": _scenario(rank, fail=1, fail_sync=1),
        # Last: rank 0's exchange is left waiting for rank 1's until rank 1's engine wakes.
        "shared, hangs": _scenario(rank, fail=0, hang_s=2.0, shared=peers),
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(outcomes))
    # The hung rollouts' threads (2 s asleep, past the 0.5 s limit) must end before the process
    # does: a daemon thread waking while the process exits aborted it ("terminate called without
    # an active exception", SIGABRT) in 13 of 60 runs of this file; in none of 40 with this join.
    for thread in threading.enumerate():
        if thread.name == "rollout":
            thread.join()
    dist.destroy_process_group()


def test_a_failure_on_one_rank_is_met_by_every_rank_together(tmp_path: Path) -> None:
    spawn_ranks(_run, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD_SIZE)
    healthy, failing = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for outcomes in (healthy, failing):
        assert all(outcome["in_step"] for outcome in outcomes.values())

    # Restarted where it failed, synced on both (the sum of both ranks' weights: 1 + 2), retried;
    # shared out, the failure reaches rank 0 in the exchange (PeerFailed): both retry, and the
    # retry returns all four requests' results on both ranks.
    for scenario, results in (("fails once", 0), ("shared, fails once", 4)):
        ok, bad = healthy[scenario], failing[scenario]
        assert ok["raised"] is None and bad["raised"] is None
        assert ok["result"] == bad["result"] == results
        assert (ok["restarts"], ok["starts"]) == (0, 1) and (bad["restarts"], bad["starts"]) == (1, 2)
        assert ok["pushed"] == bad["pushed"] == [3.0] * WEIGHT_PARTS

    twice_ok, twice_bad = healthy["fails twice"], failing["fails twice"]
    assert twice_ok["raised"] == twice_bad["raised"] == "RolloutFailed"
    assert twice_ok["message"] == "the rollout engine failed again after a restart at step 3 on another rank"
    assert "ConnectionError: engine core died" in twice_bad["message"]

    # The signal reached rank 0, the failure happened on rank 1: both stop, neither restarts.
    stop_ok, stop_bad = healthy["fails once, stop on rank 0"], failing["fails once, stop on rank 0"]
    assert stop_ok["raised"] == stop_bad["raised"] == "StoppedBySignal"
    assert "failed on another rank after a stop signal" in stop_ok["message"]
    assert "after a stop signal (ConnectionError: engine core died)" in stop_bad["message"]
    assert stop_ok["restarts"] == stop_bad["restarts"] == 0 and stop_ok["pushed"] == stop_bad["pushed"] == []

    # The restarted engine fails loading the first of five parts: rank 1 still takes part in
    # the gathers after it (else rank 0 would wait in them), and both stop together.
    load_ok, load_bad = (
        healthy["fails once, then loading weights"],
        failing["fails once, then loading weights"],
    )
    assert load_ok["raised"] == load_bad["raised"] == "RolloutFailed"
    assert load_ok["message"] == "the rollout engine failed again after a restart at step 3 on another rank"
    assert load_bad["message"].endswith("ConnectionError: engine core died loading weights")
    assert load_ok["pushed"] == load_bad["pushed"] == [3.0] * WEIGHT_PARTS

    # Shared out, rank 1's engine sleeps past the limit while rank 0 waits for it in the exchange:
    # both time out, agree on the outer group and stop together (no process-group time-out).
    for outcome in (healthy["shared, hangs"], failing["shared, hangs"]):
        assert outcome["raised"] == "RolloutFailed"
        assert "did not answer within rollout_timeout_s=0.5 s" in outcome["message"]

    hung_ok, hung_bad = healthy["hangs"], failing["hangs"]
    assert hung_ok["raised"] == hung_bad["raised"] == "RolloutFailed"
    assert hung_ok["message"] == "the rollout engine of another rank did not answer at step 3"
    assert "did not answer within rollout_timeout_s=0.5 s" in hung_bad["message"]

    # A stop signal with engines that answer changes nothing.
    for outcomes in (healthy, failing):
        assert outcomes["answers, stop on rank 0"]["raised"] is None
        assert outcomes["answers, stop on rank 0"]["restarts"] == 0

    again_ok, again_bad = healthy["shared, fails twice"], failing["shared, fails twice"]
    assert again_ok["raised"] == again_bad["raised"] == "RolloutFailed"
    assert again_ok["message"] == (
        "the rollout engine failed again after a restart at step 3: PeerFailed: the shared work failed "
        "on group rank(s) [1] (rank 1: ConnectionError: engine core died)"
    )
    assert again_bad["message"].endswith("ConnectionError: engine core died")
