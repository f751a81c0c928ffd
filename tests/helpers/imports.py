"""Which packages a set of modules pulls in, measured in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence


def assert_imports_none_of(modules: Sequence[str], forbidden: Sequence[str]) -> None:
    """Import ``modules`` in a fresh interpreter (this test process may have anything loaded
    already) and fail if any top-level package in ``forbidden`` was loaded with them."""
    code = (
        f"import sys, {', '.join(modules)}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {tuple(forbidden)!r})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
