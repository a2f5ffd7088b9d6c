"""The compiled loop of the system-wide code table (zen.native code_rows.c, issue 50) makes its reference's rows.

`system_table._code_rows` gathers each code object's fields in bulk and then made one row per code object in a
Python loop; `native.core.code_rows` makes the same rows in one call and leaves to the reference (`_row`) every row
it cannot make from the gathered fields alone. Compared here: whole tables of real images (CPython 3.11 with
transformers; 3.13 and 3.14, whose bytecode may be instrumented, the latter also against what the live processes
wrote of their own code objects), and hand-built inputs for each way a row can go.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import opened_heap

from zen import native
from zen.cpython.code.bytecode import _lookup, deoptimize_pure
from zen.cpython.layout.profile import load_profile
from zen.cpython.program import system_table as st
from zen.cpython.runtime import Runtime
from zen.evidence import hashing

needs_core = pytest.mark.skipif(native.core is None, reason=f"compiled core not loaded: {native.why}")


def _tables_equal(ip) -> tuple[int, int]:
    """The table with the compiled loop and with the reference only: equal; returns (rows, rows left to `_row`)."""
    rt = Runtime(ip)
    calls: list = []
    real = native.core.code_rows

    def spy(*args):
        out = real(*args)
        calls.append(len(out[1]))
        return out

    original = st._compiled_rows
    try:
        native.core.code_rows = spy  # type: ignore[attr-defined]
    except AttributeError:  # an extension module's attributes can be set; if not, count nothing
        pass
    try:
        compiled = st.system_table(rt)
        st._compiled_rows = lambda *a: None  # type: ignore[assignment]
        reference = st.system_table(rt)
    finally:
        st._compiled_rows = original
        native.core.code_rows = real  # type: ignore[attr-defined]
    assert compiled == reference
    assert calls, "the compiled loop was not used"
    return len(compiled), calls[0]


@needs_core
def test_rows_equal_reference_on_a_transformers_image(hf_image):
    with opened_heap(hf_image[0]) as (ip, _heap):
        rows, left = _tables_equal(ip)
    assert rows > 50_000 and left < rows // 100, (rows, left)


@needs_core
@pytest.mark.parametrize("minor", ["3.13", "3.14"])
def test_rows_equal_reference_on_other_pythons(foreign_images, minor):
    got = foreign_images(minor)
    if got is None:
        pytest.skip(f"no CPython {minor} here")
    with opened_heap(got[1]) as (ip, _heap):
        rows, left = _tables_equal(ip)
        table = {r[0]: r for r in st.system_table(Runtime(ip))}
    assert rows > 1_000 and left < rows // 10, (rows, left)
    # ground truth: what the live process said of its own code objects (`co_code` is the bytecode without
    # specialisation or instrumentation: some of these functions ran hot, three under sys.monitoring)
    target = got[0]
    fields = json.loads((target.outdir / "code_fields.json").read_text())
    checked = 0
    for entry, f in zip(target.truth["all_functions"], fields):
        row = table.get(hex(entry["code"]))
        assert row is not None, entry
        assert row[2:] == [f["co_qualname"], f["co_firstlineno"], hashlib.sha256(bytes.fromhex(f["co_code"])).hexdigest()[:32]]
        checked += 1
    assert checked > 500 and set(target.truth["instrumented"]) <= {int(a, 16) for a in table}, checked


@needs_core
@pytest.mark.parametrize("hasher", [hashlib.sha256, hashing.sha256], ids=["hashlib", "chosen"])
def test_each_way_a_row_can_go(hasher):
    """Made, skipped (no qualname or file name), or left to the reference (no bytes, refused by the vectorised
    checks, an instrumented opcode in quickened bytecode); rows made exactly as the reference makes them."""
    ops = load_profile("3.12").opcodes
    deopt, _caches, cache_op, small = _lookup(ops)
    line_op = 253  # INSTRUMENTED_LINE's number in this test's tables
    specialised = next(op for op in ops.deopt if 0 <= op < 256 and ops.deopt[op] != op)
    plain = bytes([ops.opmap["NOP"], 0, ops.opmap["RETURN_CONST"], 0])
    quickened = bytes([specialised, 1]) + b"\xff\xff" * ops.cache_entries.get(ops.deopt[specialised], 0) + plain
    cases = [  # (code, good, qualname address, quick) -> expected
        (plain, True, 1, False),  # a row of the bytes as they are
        (quickened, True, 1, True),  # a row of the de-specialised bytes
        (None, True, 1, False),  # no bytes gathered: the reference reads the object
        (plain, False, 1, False),  # refused by the vectorised checks: the same
        (bytes([line_op, 0]) + plain, True, 1, True),  # instrumented: the reference undoes it
        (bytes([line_op, 0]) + plain, True, 1, False),  # not quickened: hashed as it is
        (plain, True, 2, False),  # no qualname: no row
        (plain + bytes([line_op]), True, 1, True),  # odd length: its last byte is an opcode to uninstrumented() too
    ]
    n = len(cases)
    addrs = [0x7F0000001000 + 64 * i for i in range(n)]
    args = (addrs, [c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases], {1: "f", 2: None},
            [9] * n, {9: "m.py"}, list(range(10, 10 + n)), [c[3] for c in cases], {addrs[0]: "pkg.mod"},
            (deopt, small, cache_op, line_op, -1, -1), hasher)  # fmt: skip
    rows, fallback = native.core.code_rows(*args)
    assert fallback == [2, 3, 4, 7]
    assert rows[2] is rows[3] is rows[4] is rows[6] is None

    def want(i, code):
        return [hex(addrs[i]), "pkg.mod" if i == 0 else "?", "f", 10 + i, hashlib.sha256(code).hexdigest()[:32]]

    assert rows[0] == want(0, plain)
    assert rows[1] == want(1, deoptimize_pure(quickened, ops)) and rows[1] != want(1, quickened)
    assert rows[5] == want(5, bytes([line_op, 0]) + plain)


@needs_core
def test_bad_arguments_are_refused():
    deopt, _caches, cache_op, small = _lookup(load_profile("3.12").opcodes)
    good = ([1], [b""], [True], [1], {}, [1], {}, [1], [False], {})
    with pytest.raises(ValueError, match="different lengths"):
        native.core.code_rows([1, 2], *good[1:], (deopt, small, cache_op, -1, -1, -1), hashlib.sha256)
    with pytest.raises(ValueError, match="256-byte tables"):
        native.core.code_rows(*good, (deopt[:10], small, cache_op, -1, -1, -1), hashlib.sha256)
    with pytest.raises(TypeError):
        native.core.code_rows(*good[:-1], None, (deopt, small, cache_op, -1, -1, -1), hashlib.sha256)
