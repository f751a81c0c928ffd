"""A dataloader ``worker_init_fn`` that leaves a native exit handler which aborts the process.

It stands for a native library whose clean-up at exit aborts (a C++ static destructor finding a
thread still joinable calls ``std::terminate``), which a worker meets only after Python's own
exit handlers have run.
"""

from __future__ import annotations

import ctypes


def register_native_abort_at_exit(worker_id: int) -> None:
    libc = ctypes.CDLL(None)
    abort = ctypes.cast(libc.abort, ctypes.c_void_p)
    # __cxa_atexit is how C++ registers static destructors; they run inside exit(), after Python.
    if libc.__cxa_atexit(abort, None, None) != 0:
        raise OSError("__cxa_atexit refused the handler")
