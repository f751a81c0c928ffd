"""Where a result came from: the command that made it, the commit, the machine and the date.

Every results file a bench script writes carries :func:`provenance` at its top, so a figure in
the docs can be traced to the run that made it (and a stale one told from a current one).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


SOURCE_COMMIT_VARIABLE = "LVRL_SOURCE_COMMIT"
"""Names the commit of a copied tree whose git metadata is not its own (a remote GPU machine that
receives the working tree beside an older ``.git``): stated by whoever made the copy."""


def commit(root: Path = REPO_ROOT) -> str:
    """The checked-out commit, ``+changes`` when tracked files differ from it; ``unknown``
    outside a git checkout. (Untracked files, such as a run's own results, do not count.)
    :data:`SOURCE_COMMIT_VARIABLE`, when set, is taken instead, marked as stated."""
    return _stated_commit() or _checkout_commit(root)


def _stated_commit() -> str | None:
    stated = os.environ.get(SOURCE_COMMIT_VARIABLE)
    return f"{stated} (stated by {SOURCE_COMMIT_VARIABLE})" if stated else None


def _checkout_commit(root: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


# Read once, when a script imports this module (at its start): the code a long run executes is
# the checkout's at that moment, and a commit made while it works must not be recorded as its.
_CHECKOUT_AT_START = _checkout_commit(REPO_ROOT)


def running_commit() -> str:
    """The commit of the code this process runs: the checkout when the process imported this
    module (its start, for the bench scripts that record results), or the stated one."""
    return _stated_commit() or _CHECKOUT_AT_START


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def provenance(command: Sequence[str], gpu: str | None = None) -> dict[str, Any]:
    """``{command, commit, machine, date}`` of a run of ``command`` (its argv) on this machine;
    the commit is :func:`running_commit`, the checkout the process started from."""
    return {
        "command": " ".join(command),
        "commit": running_commit(),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu},
        "date": time.strftime("%Y-%m-%d"),
    }
