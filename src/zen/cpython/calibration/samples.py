"""Sample objects whose contents are known, for the calibrator to find in memory.

Module level, so that their code is compiled but never executed before it is measured.
"""

from __future__ import annotations

_CODE_SAMPLES = """
def c1(a1, a2, a3, /, b1, b2, b3, b4, *args, k1, k2, k3, k4, k5, k6, **kw):
    l1 = l2 = l3 = 0
    cellA = 1
    cellB = 2
    def g():
        return cellA + cellB
    return g

def outer():
    fa = fb = fc = 1
    def c2(p1, /, q1, q2, q3, *, r1, r2, r3, r4, r5):
        m1 = 1
        def h():
            return q1
        return fa + fb + fc
    return c2
"""


def _sample_code():
    """Two code objects whose counts differ field by field (compiled, never run).

    c1: argcount 7, posonly 3, kwonly 6, nlocals 19, 2 plain cells, no free vars.
    c2: argcount 4, posonly 1, kwonly 5, nlocals 11, 1 argument cell, 3 free vars.
    """
    mod = compile(_CODE_SAMPLES, "<zen-calibration>", "exec")
    codes = {c.co_name: c for c in mod.co_consts if hasattr(c, "co_code")}
    outer = codes["outer"]
    inner = next(c for c in outer.co_consts if hasattr(c, "co_code") and c.co_name == "c2")
    has_qualname = hasattr(inner, "co_qualname")  # 3.11+
    c1 = codes["c1"].replace(co_firstlineno=4321, co_stacksize=77, **({"co_qualname": "calib.q1"} if has_qualname else {}))
    c2 = inner.replace(co_firstlineno=8765, co_stacksize=55, **({"co_qualname": "calib.q2"} if has_qualname else {}))
    return c1, c2


class _Plain:
    pass


class _Plain2(_Plain):
    pass


class _Slotted:
    __slots__ = ("alpha", "beta")


class _Props:
    def _get(self):
        return 1

    prop_attr = property(_get, None, None, "prop doc")
    st = staticmethod(len)
    cl = classmethod(len)
