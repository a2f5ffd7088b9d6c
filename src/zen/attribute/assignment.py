"""The optimal assignment (scipy's `linear_sum_assignment`) without importing all of `scipy.optimize`.

Why: attribution needs one function of scipy.optimize, and importing the package runs its `__init__`, which imports
the minimisers, linear programming and scipy.linalg: 0.1-0.25 s on the path of every `zen attribute` of a
transformers query (before the fork of the parallel comparisons, so both processes have it). The function itself
lives in a C extension of its own, `scipy/optimize/_lsap` (scipy's `__init__` re-exports it unchanged), which loads
in about 0.01 s. That file is loaded directly and checked on a small problem with a known answer; if it is missing,
fails to load or answers otherwise (another scipy layout), the public `scipy.optimize.linear_sum_assignment` is
used. Either way the same C code computes every assignment.
"""

from __future__ import annotations

import functools
from collections.abc import Callable


@functools.cache
def linear_sum_assignment() -> Callable:
    """scipy's `linear_sum_assignment` (call it as scipy's: `(cost, maximize=...) -> (rows, cols)`)."""
    try:
        fn = _direct()
    except Exception:  # noqa: BLE001 - any surprise in scipy's private layout: the public import below
        fn = None
    if fn is None:
        from scipy.optimize import linear_sum_assignment as fn
    return fn


def _direct() -> Callable | None:
    import importlib.machinery
    import importlib.util
    import os

    import numpy as np
    import scipy

    where = os.path.join(os.path.dirname(scipy.__file__), "optimize")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(where, "_lsap" + suffix)
        if os.path.isfile(path):
            break
    else:
        return None
    spec = importlib.util.spec_from_file_location("_lsap", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, "linear_sum_assignment", None)
    if fn is None:
        return None
    # a problem whose greedy and optimal answers differ, maximised and not
    cost = np.array([[4.0, 3.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    high, low = fn(cost, maximize=True), fn(cost)
    if [a.tolist() for a in high] != [[0, 1, 2], [1, 0, 2]] or [a.tolist() for a in low] != [[0, 1, 2], [2, 1, 0]]:
        return None
    return fn
