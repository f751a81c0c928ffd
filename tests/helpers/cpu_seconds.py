"""A pytest plugin that records the CPU seconds each test costs, its own and its commands'.

Wall durations (``--durations``, ``--junitxml``) of a suite run on two busy cores say as much
about the other worker as about the test. CPU seconds do not: a test's CPU time is the work the
machine must do for it, whatever ran beside it. Each test's line holds the CPU time of the pytest
worker over the test (setup, call, teardown) and of the processes it waited for (``os.times()``'s
children fields: a command and, through it, the processes that command waited for). A process
that outlives the command that started it is not counted: each ``lvrl`` subprocess's fork server
with its dataloader workers (it exits just after the trainer), and what a kill orphans. So tests
that run ``lvrl`` as a subprocess read low; ``bench/suite_run.py`` also counts the whole suite.

Enabled by ``-p helpers.cpu_seconds`` with ``LVRL_TEST_CPU_LOG`` naming a file: one JSON line per
test is appended to it (``bench/suite_run.py`` does both and totals the lines).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

LOG_VARIABLE = "LVRL_TEST_CPU_LOG"


def cpu_now() -> tuple[float, float]:
    """(this process's CPU seconds, its reaped children's), user and system time together."""
    times = os.times()
    return times.user + times.system, times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = os.environ.get(LOG_VARIABLE)
    own, children = cpu_now()
    yield
    if path:
        own_after, children_after = cpu_now()
        line = {
            "test": item.nodeid,
            "own": round(own_after - own, 2),
            "children": round(children_after - children, 2),
        }
        # One short append per test: the workers' lines do not interleave (O_APPEND).
        with open(path, "a") as log:
            log.write(json.dumps(line) + "\n")
