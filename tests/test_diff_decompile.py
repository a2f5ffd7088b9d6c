"""depyf's source in `zen diff` and `zen report` follows from the code alone (issue 36).

Whether a function is shown as decompiled source or as a listing used to depend on wall-clock
deadlines (10 s per function, 60 s for all): on a busy machine the same diff showed listings. Now
each function is bounded by the Python calls depyf makes (`decompile_calls`), the whole child only by
a safety net whose expiry is an error, and depyf's `global` statements (written from a set, whose
order follows the isolated child's random hash seed) are sorted.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from zen.diff import decompile as dd
from zen.runtime.errors import TimeLimitExceeded

pytestmark = pytest.mark.skipif(not dd.available(), reason="depyf is not installed (pip install -e .[decompile])")

NAMES = ("zeta", "alpha", "mu", "beta", "omega", "gamma")
SOURCE = "def setup(v):\n" + "".join(f"    global {n}\n    {n} = v + {i}\n" for i, n in enumerate(NAMES))


def _code(src: str, name: str) -> types.CodeType:
    ns: dict = {}
    exec(compile(src, "<test>", "exec"), ns)  # noqa: S102 - the test's own function
    return ns[name].__code__


def _big() -> types.CodeType:
    """A real function depyf needs many calls for: torch's multi-head attention."""
    import torch.nn.functional as F

    return F.multi_head_attention_forward.__code__


def test_global_statements_do_not_follow_the_hash_seed():
    code = _code(SOURCE, "setup")
    got = [dd.decompile_many({"f": code}).sources["f"] for _ in range(3)]  # three children, three random hash seeds
    assert got[0] == got[1] == got[2]
    assert "global " + ", ".join(sorted(NAMES)) in got[0]
    assert dd.normalise("    global b, a\n    x = 1\n") == "    global a, b\n    x = 1\n"


def test_work_limit_decides_source_or_listing_the_same_way_every_time():
    codes = {"small": _code(SOURCE, "setup"), "big": _big()}
    tight = [dd.decompile_many(codes, max_calls=200_000) for _ in range(2)]
    for got in tight:
        assert got.stopped == {"big"} and "small" in got.sources and "big" not in got.sources
    full = dd.decompile_many(codes)
    assert not full.stopped and set(full.sources) == {"small", "big"} and full.limit == dd.DECOMPILE_CALLS
    assert tight[0].sources["small"] == full.sources["small"]


def test_safety_net_is_an_error_not_listings():
    with pytest.raises(TimeLimitExceeded) as exc:
        dd.decompile_many({"f": _code(SOURCE, "setup")}, timeout=0.05)
    assert "--timeout" in exc.value.message + (exc.value.hint or "") and exc.value.exit_code == 7


def test_diff_refuses_an_unknown_limit(tmp_path):
    res = subprocess.run([sys.executable, "-m", "zen", "diff", str(tmp_path), "--base", "x", "--limit", "decompile_steps=5"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 2 and "unknown limit" in res.stderr and "decompile_calls" in res.stderr
