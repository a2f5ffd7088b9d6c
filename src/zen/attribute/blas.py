"""Run a dense LAPACK call on one OpenBLAS thread.

`numpy.linalg.eigvalsh` of a module graph's Laplacian (up to ~1,400 nodes for real models) took
0.13 s on one thread and 2-10 s with OpenBLAS's default thread pool on this 2-core machine while
another process kept the cores busy (its threads spin-wait for each other). The threaded result
also differs from the one-thread result in the last bits, so spectra (and graph scores) depended
on the thread count. One thread makes them fast and reproducible on a given OpenBLAS build.

numpy exposes no thread control, and threadpoolctl is not a dependency: the few lines here find
the OpenBLAS libraries already loaded into this process (numpy's and scipy's bundled copies) and
call their `openblas_set_num_threads` (the symbol names carry the bundles' prefix/suffix). Where
none is found (another BLAS, another OS) it does nothing.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_APIS: list[tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]] | None = None


def _openblas_apis() -> list[tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]]:
    """(get, set) thread-count functions of every OpenBLAS mapped into this process."""
    global _APIS
    if _APIS is not None:
        return _APIS
    apis = []
    try:
        with open("/proc/self/maps") as fh:
            paths = sorted({line.split()[-1] for line in fh if "openblas" in line.lower() and "/" in line})
    except OSError:
        paths = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("", "scipy_"):
            for suffix in ("", "64_"):
                get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
                set_ = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
                if get is not None and set_ is not None:
                    get.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
                    apis.append((get, set_))
                    break
            else:
                continue
            break
    _APIS = apis
    return apis


@contextmanager
def one_thread() -> Iterator[None]:
    """OpenBLAS on one thread inside the block (restored after)."""
    import numpy  # noqa: F401  (loads numpy's OpenBLAS so that it is found)

    with _LOCK:
        apis = _openblas_apis()
        before = [get() for get, _ in apis]
        for _, set_ in apis:
            set_(1)
        try:
            yield
        finally:
            for (_, set_), n in zip(apis, before):
                set_(n)
