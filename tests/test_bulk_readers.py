"""The vectorised paths of the census and the code stage give exactly what the per-object readers give.

`zen recover` reads the ~80,000 code objects, ~60,000 functions and ~10,000 class dictionaries of a
transformers process in bulk (`zen.cpython.bulk`), and searches memory once for every user-space
pointer (the pointer map) before later type searches read only those ranges. These tests run both
ways over a real transformers process image and compare the results item by item.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from zen.cpython import bulk
from zen.cpython.code.instructions import decode, with_consts
from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.program.programmatic import const_display
from zen.cpython.program.system_table import system_table
from zen.cpython.readers.code import read_code_brief
from zen.cpython.readers.dicts import read_dict
from zen.cpython.runtime import Runtime
from zen.memory import open_space
from zen.memory.scan import find_u64_in
from zen.runtime.errors import ZenError


@pytest.fixture(scope="module")
def opened(hf_image):
    img, _target = hf_image
    space = open_space(img, None)
    yield space
    space.close()


def fresh(space) -> Interpreter:
    """An interpreter with empty caches (each way of reading starts from nothing)."""
    return Interpreter.open(space)


def test_pointer_map_scans_equal_full_scans(opened):
    ip = fresh(opened)
    heap = Heap(ip)
    types = heap.all_types()  # the first search makes the pointer map
    assert ip.census_memo.get("pointer_map"), "no pointer map was made"
    wanted = [ip.wk.types["type"], ip.wk.types["function"], ip.wk.types["code"], *types[:: max(1, len(types) // 200)]]
    hits, vals = heap._find(wanted)
    full_hits, full_vals = find_u64_in(ip.space, wanted, heap._chunks)
    assert np.array_equal(hits, full_hits) and np.array_equal(vals, full_vals)
    # the map leaves out memory: it is not the whole writable image
    mapped = sum(b - a for a, b in ip.census_memo["pointer_map"])
    assert 0 < mapped <= sum(c.end - c.start for c in heap._chunks)


def _addresses(ip: Interpreter, rt: Runtime) -> list[int]:
    """Object pointers of every sort: names, modules, functions, code, garbage (misaligned, unmapped)."""
    F, C = ip.P.function, ip.P.code
    out = []
    for fa in rt.function_addrs[:3000]:
        out += [fa, ip.space.u64(fa + F.func_module), ip.space.u64(fa + F.func_qualname), ip.space.u64(fa + F.func_code)]
    for ca in rt.code_addrs[:3000]:
        out += [ca, ip.space.u64(ca + C.co_qualname), ip.space.u64(ca + C.co_filename), ip.space.u64(ca + C.co_names)]
    some = rt.function_addrs[:50]
    out += [a + 1 for a in some] + [a + 8 for a in some] + [0, 8, 1 << 46, (1 << 64) - 8]
    return out


def test_bulk_kinds_and_strs_equal_readers(opened):
    ip = fresh(opened)
    rt = Runtime(ip)
    addrs = _addresses(ip, rt)
    ref = fresh(opened)

    def one(fn, a):
        try:
            return fn(a)
        except ZenError:
            return None

    assert bulk.kinds(ip, addrs) == [one(ref.kind, a) for a in addrs]
    ip2 = fresh(opened)
    got = bulk.strs(ip2, addrs)
    assert got == {a: one(ref.str, a) for a in addrs}
    assert sum(v is not None for v in got.values()) > 1000  # the fast path was exercised


def test_system_table_equals_per_object_reads(opened):
    ip = fresh(opened)
    rt = Runtime(ip)
    rows = system_table(rt)
    ref = fresh(opened)
    rrt = Runtime(ref)
    fields = ref.P.function.reader("func_code", "func_module")
    module_of_code: dict[int, str] = {}
    names: dict[int, str] = {}
    for fa in rrt.function_addrs:  # the per-object algorithm system_table replaced
        try:
            f = fields.unpack(ref.space.read(fa, fields.size))
            if f.func_code in module_of_code:
                continue
            m = names.get(f.func_module)
            if m is None:
                m = names[f.func_module] = ref.str(f.func_module) if f.func_module and rrt.kind(f.func_module) == "str" else "?"
            module_of_code[f.func_code] = m
        except ZenError:
            continue
    expected = []
    for ca in rrt.code_addrs:
        try:
            qualname, _filename, first, code = read_code_brief(ref, ca)
        except ZenError:
            continue
        expected.append([f"{ca:#x}", module_of_code.get(ca, "?"), qualname, first, hashlib.sha256(code).hexdigest()[:32]])
    assert len(rows) > 1000
    assert rows == expected


def test_class_holders_equal_per_class_reads(opened):
    ip = fresh(opened)
    rt = Runtime(ip)
    fns = rt.function_addrs
    got = {f: rt.holders(f) for f in fns}
    ref = Runtime(fresh(opened))
    expected: dict[int, list] = {}
    for taddr in ref.type_addrs:  # the per-class algorithm holders replaced
        t = ref.type(taddr)
        if t is None or not t.is_heap or not t.dict_addr:
            continue
        for name, f, b in ref.bindings(t):
            expected.setdefault(f, []).append((taddr, name, b))
    assert got == {f: expected.get(f, []) for f in fns}
    assert sum(1 for v in got.values() if v) > 1000


def test_namespace_table_equals_dict_str_items(opened):
    """Class and module namespaces sliced from the bulk table (`cpython.namespaces`) are exactly
    `dict_str_items`'s; a dict the table does not accept is read by it (None here)."""
    from zen.cpython.namespaces import NamespaceTable
    from zen.cpython.readers.dicts import dict_str_items

    ip = fresh(opened)
    rt = Runtime(ip)
    table = rt.namespace_table()
    dicts = table.dicts + [d + 8 for d in table.dicts[:50]] + rt.code_addrs[:50] + [0, 8]
    ref = fresh(opened)
    fast = 0
    for d in dicts:
        got = table.items(d)
        try:
            expected = dict_str_items(ref, d)
        except ZenError:
            expected = None
        if got is not None:
            fast += 1
            assert got == expected, hex(d)
    assert fast > 0.9 * len(table.dicts)  # the fast path was exercised
    # a table over other dicts (function globals, keyword defaults) gives the same where it answers
    F = ip.P.function
    other = [ip.space.u64(f + F.func_kwdefaults) for f in rt.function_addrs[:3000]]
    small = NamespaceTable(fresh(opened), [d for d in other if d])
    for d in small.dicts:
        got = small.items(d)
        if got is not None:
            assert got == dict_str_items(ref, d)


def test_bulk_dict_items_equal_read_dict(opened):
    """Class, module and function namespaces read in bulk are exactly what `read_dict` reads; what
    the vectorised checks refuse (split tables, non-dicts, garbage) is left to the reader."""
    ip = fresh(opened)
    rt = Runtime(ip)
    F = ip.P.function
    addrs = [t.dict_addr for t in map(rt.type, rt.type_addrs) if t is not None and t.dict_addr]
    addrs += [ip.space.u64(m + ip.P.module.md_dict) for m in rt.modules.values()]
    for fa in rt.function_addrs[:3000]:
        addrs += [ip.space.u64(fa + F.func_globals), ip.space.u64(fa + F.func_kwdefaults), ip.space.u64(fa + F.func_dict)]
    addrs += [a + 8 for a in addrs[:50]] + [a + 1 for a in addrs[:50]] + rt.code_addrs[:50] + [0, 8, 1 << 46, (1 << 64) - 8]
    ref = fresh(opened)

    def one(a):
        try:
            return read_dict(ref, a)
        except ZenError:
            return None

    got = bulk.dict_items(ip, addrs)
    assert len(got) == len(addrs)
    assert all(g is None or g == one(a) for a, g in zip(addrs, got))
    assert all(g is None for g in got[-4:])
    assert sum(g is not None for g in got) > 0.9 * len(set(rt.type_addrs))  # the fast path was exercised


def test_bulk_types_equal_read_type(opened):
    """Every type of the process read in bulk (`bulk.types`, the census's MRO names) is the
    record `read_type` makes; what the vectorised checks do not accept is left to the reader."""
    from zen.cpython.readers.types import read_type

    ip = fresh(opened)
    types = Heap(ip).all_types()
    rt = Runtime(ip)
    garbage = [a + 8 for a in types[:50]] + rt.function_addrs[:50] + [0, 8, 1 << 46, (1 << 64) - 8]
    fast = fresh(opened)
    fast.census_memo.update(ip.census_memo)  # the same census, an empty type cache
    bulk.types(fast, types + garbage)
    cached = sum(1 for a in types if a in fast._type_cache)
    assert cached > 0.95 * len(types)  # the fast path was exercised (static, heap, metaclasses, slots)
    assert any(fast._type_cache[a].slot_names for a in types if a in fast._type_cache)
    assert any(not fast._type_cache[a].is_heap for a in types if a in fast._type_cache)
    ref = fresh(opened)

    def one(i, a):
        try:
            return read_type(i, a)
        except ZenError as exc:
            return str(exc)

    for a in types + garbage:
        assert one(fast, a) == one(ref, a), hex(a)


def test_bulk_tuples_equal_read_tuple(opened):
    from zen.cpython.readers.containers import read_tuple

    ip = fresh(opened)
    rt = Runtime(ip)
    C = ip.P.code
    addrs = [ip.space.u64(a + C.co_names) for a in rt.code_addrs[:3000]]
    addrs += [ip.space.u64(a + C.co_consts) for a in rt.code_addrs[:3000]]
    addrs += [a + 8 for a in addrs[:50]] + rt.function_addrs[:50] + [0, 8, 1 << 46, (1 << 64) - 8]
    ref = fresh(opened)

    def one(a, limit):
        try:
            return read_tuple(ref, a, limit)
        except ZenError:
            return None

    for limit in (None, 3):
        got = bulk.tuples(ip, addrs, limit)
        assert all(g is None or g == one(a, limit) for a, g in zip(addrs, got))
        read = sum(g is not None for g in got)
        assert read > 5000 if limit is None else 0 < read < 5000  # the fast path ran; the limit refused some


def test_shared_decoding_equals_decoding_with_constants(opened):
    """The closure's decoding (no constants) plus the constants' displays is the listing's decoding."""
    ip = fresh(opened)
    rt = Runtime(ip)
    checked = 0
    for ca in rt.code_addrs[:: max(1, len(rt.code_addrs) // 1500)]:
        ci = rt.code(ca)
        if ci is None:
            continue
        consts = [const_display(rt, a) for a in ci.consts]
        assert with_consts(rt.instructions(ci), consts) == decode(
            ci.code, ci.names, ci.localsplusnames, consts, ip.P.opcodes, ci.free_base
        )
        assert rt.instructions(ci) is rt.instructions(ci)  # decoded once
        checked += any(i.kind == "const" for i in rt.instructions(ci))
    assert checked > 500


def test_gc_paused_restores_the_collector():
    """The code stage pauses cyclic GC; it is back on afterwards, also after an error, and a caller
    that had it off keeps it off."""
    import gc

    from zen.cpython.program.programmatic import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ZenError), gc_paused():
        raise ZenError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_recover_pauses_the_collector_and_restores_it(tmp_path, monkeypatch):
    """A recovery runs with cyclic GC off from the census on (`zen.runtime.collector`): on inside
    `_recover` never, and back on when it returns or fails (here: an image no reader accepts)."""
    import gc

    from zen.recover import run

    seen = []
    real = run._recover

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "_recover", spy)
    image = tmp_path / "noise.img"
    image.write_bytes(bytes(range(256)) * 4096)
    assert gc.isenabled()
    with pytest.raises(ZenError):
        run.recover(image, None, tmp_path / "case")
    assert seen == [False] and gc.isenabled()
