"""The pytest worker's long-lived heap, kept out of the cyclic collector's walks.

A worker holds a few million objects that live as long as it does: torch, transformers, vLLM,
Lightning and every test module, imported at collection. A full collection walks all of them
(about a quarter of a second on these cores), and the suite asks for one after each in-process
``lvrl`` run (tests/helpers/cli.py: the run's model and engine go at once), besides those Python
starts itself as the tests allocate. Frozen (:func:`gc.freeze`), they are left out of every walk,
as ``lvrl`` does for its own imports (app/cli.py) and vLLM for its engine's heap.

vLLM thaws the whole heap when an engine shuts down (its ``EngineCore.shutdown``), so it is frozen
again when the next test file starts, if nothing is frozen then. At that point the previous file's
module-scoped fixtures have been torn down and only what the session keeps is alive: no test's
objects are frozen with it. (A frozen object is still freed when its last reference goes; it is
only never collected as part of a cycle.)
"""

from __future__ import annotations

import gc


def freeze_the_long_lived_heap() -> None:
    """Collect, then freeze what is left, unless a frozen heap is in place already."""
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()
