"""``release_process_group``: the default group and its subgroups end; a second call, or a
process with no group, is a no-op; a later run can start a group again.

In a process of its own: the test process may hold another test's group (a kept vLLM engine's),
which this must neither find nor end.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks

from parallel.process_group import release_process_group


def _start(store: Path) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(str(store), 1), rank=0, world_size=1)


def _release_twice_and_start_again(rank: int, tmp: str) -> None:
    assert not release_process_group()  # nothing open
    _start(Path(tmp, "first"))
    subgroup = dist.new_group([0])
    summed = torch.ones(3)
    dist.all_reduce(summed, group=subgroup)  # a collective done, as a run's last one
    assert release_process_group()
    assert not dist.is_initialized()
    assert not release_process_group()
    _start(Path(tmp, "second"))  # the next run in this process starts its own
    assert dist.get_world_size() == 1
    assert release_process_group()


def test_release_ends_the_group_and_its_subgroups(tmp_path: Path) -> None:
    spawn_ranks(_release_twice_and_start_again, args=(str(tmp_path),), nprocs=1)
