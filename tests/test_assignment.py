"""`zen.attribute.assignment`: scipy's optimal assignment loaded from its own C extension gives exactly what
`scipy.optimize.linear_sum_assignment` gives, without importing scipy.optimize; any surprise falls back to it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from zen.attribute import assignment


def test_direct_load_answers_as_scipy_optimize():
    from scipy.optimize import linear_sum_assignment as public

    direct = assignment._direct()
    assert direct is not None, "scipy's _lsap extension was not found: the fallback is in use"
    rng = np.random.default_rng(7)
    for shape in [(1, 1), (5, 5), (7, 3), (3, 7), (60, 45)]:
        m = rng.random(shape)
        m[m < 0.3] = 0.0  # ties, as attribution's score matrices have
        for maximize in (True, False):
            got, want = direct(m, maximize=maximize), public(m, maximize=maximize)
            assert all(np.array_equal(a, b) for a, b in zip(got, want)), (shape, maximize)


def test_loading_it_does_not_import_scipy_optimize():
    code = ("import sys; from zen.attribute.assignment import linear_sum_assignment as f; "
            "r = f()([[1.0, 0.0], [0.0, 1.0]], maximize=True); "
            "print('scipy.optimize' in sys.modules, r[1].tolist())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "[0,", "1]"]


@pytest.mark.parametrize("how", ["missing", "raises"])
def test_any_surprise_falls_back_to_the_public_function(how, monkeypatch):
    from scipy.optimize import linear_sum_assignment as public

    def broken():
        if how == "raises":
            raise ImportError("a scipy without _lsap")
        return None

    monkeypatch.setattr(assignment, "_direct", broken)
    assignment.linear_sum_assignment.cache_clear()
    try:
        assert assignment.linear_sum_assignment() is public
    finally:
        assignment.linear_sum_assignment.cache_clear()
