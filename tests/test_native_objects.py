"""The compiled reader of small objects (zen.native objects.c, issue 50) answers exactly what its reference reads.

`Interpreter.fast` answers kind/str/read_within and the tuple, bytes and names readers for plain objects in one call,
and None for anything else, which the Python readers then decide. Two interpreters over the same image, one with the
compiled reader and one without, are compared on every code object of real images of CPython 3.8, 3.11, 3.13 and
3.14 (whole records, errors included), and on copies of real objects with bytes overwritten placed in a chunk of
their own (sizes past the chunk, flipped state bits, bad headers, pointers into nowhere): wherever the compiled
reader answers, the reference gives the same value; wherever the reference raises, it answers None. The same holds
for whole code objects and function objects read in one call (`Objects.code`, `Objects.function`).
"""

from __future__ import annotations

import random
from dataclasses import fields

import pytest
from conftest import opened_heap

from zen import native
from zen.cpython.interp import Interpreter
from zen.cpython.readers.code import _native_spec, read_code
from zen.cpython.readers.containers import read_tuple
from zen.cpython.readers.functions import _native_spec as _function_spec
from zen.cpython.readers.functions import read_function
from zen.cpython.readers.text import read_bytes
from zen.cpython.runtime import Runtime
from zen.memory.overlay import overlay
from zen.memory.space import AddressSpace, BytesChunk
from zen.runtime.errors import ZenError

needs_core = pytest.mark.skipif(native.core is None, reason=f"compiled core not loaded: {native.why}")


def _pair(ip: Interpreter, space=None) -> tuple[Interpreter, Interpreter]:
    """(with the compiled reader, without it) over `space` (default: ip's), with fresh caches each."""
    space = space or ip.space
    fast = Interpreter(space, ip.info, ip.P, ip.limits)
    pure = Interpreter(space, ip.info, ip.P, ip.limits)
    pure.fast = None
    assert fast.fast is not None
    return fast, pure


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except ZenError as exc:
        return ("error", type(exc).__name__, str(exc))


def _names(ip, addr):
    return tuple(ip.str(a) for a in read_tuple(ip, addr))


# what each compiled method answers, and the reference for it
METHODS = {
    "kind": (lambda f, a: f.kind(a), lambda ip, a: ip.kind(a)),
    "str": (lambda f, a: f.str(a), lambda ip, a: ip.str(a)),
    "strs": (lambda f, a: f.strs(a), _names),
    "items": (lambda f, a: f.items(a, None), lambda ip, a: read_tuple(ip, a)),
    "items4": (lambda f, a: f.items(a, 4), lambda ip, a: read_tuple(ip, a, 4)),
    "bytes": (lambda f, a: f.bytes(a), read_bytes),
    "read": (lambda f, a: f.read(a, 40), lambda ip, a: ip.read_within(a, 40, a, "test")),
}


def _compare(fast: Interpreter, pure: Interpreter, addrs, counts: dict) -> None:
    """Every method on every address: the compiled answer (where not None) is the reference's value; the readers
    through `fast` (compiled first, Python where it says None) give the reference's value or error."""
    for a in addrs:
        for name, (compiled, reference) in METHODS.items():
            want = _outcome(reference, pure, a)
            got = compiled(fast.fast, a)
            if got is not None:
                assert want == ("ok", got), f"{name}({a:#x}): compiled {got!r}, reference {want!r}"
                counts[name] = counts.get(name, 0) + 1
            assert _outcome(reference, fast, a) == want, f"{name}({a:#x}) through the readers differs"


def _addresses(rt: Runtime, step: int) -> list[int]:
    """Code objects and what they point to (names, constants, strings, line tables), and addresses near them."""
    out: list[int] = []
    for addr in rt.code_addrs[::step]:
        ci = rt.code(addr)
        out += [addr, addr + 8, addr + 1, addr - 16]
        if ci is not None:
            out += list(ci.consts)
            C = rt.ip.P.code
            out += [rt.ip.ptr(addr + getattr(C, f)) for f in ("co_names", "co_consts", "co_filename", "co_linetable")
                    if C.has(f)]  # fmt: skip
    return out + [0, 8, (1 << 64) - 8, (1 << 64) - 1]


def _code_records_equal(fast: Interpreter, pure: Interpreter, addrs, compiled: dict | None = None) -> int:
    """read_code through both interpreters gives the same record or error; where the compiled code reader
    (Objects.code, code_object.c) answers by itself, its fields are the reference record's (counted in `compiled`)."""
    n = 0
    spec = _native_spec(fast)
    for a in addrs:
        got, want = _outcome(read_code, fast, a), _outcome(read_code, pure, a)
        assert got == want, f"code object {a:#x} reads differently"
        n += got[0] == "ok"
        raw = fast.fast.code(a, spec) if spec is not None else None
        if raw is not None and compiled is not None:
            ci = want[1]
            assert want[0] == "ok" and raw[:18] == tuple(getattr(ci, f.name) for f in fields(ci)[1:19]), f"{a:#x}"
            assert raw[19:] == (ci.varnames, ci.cellvars, ci.freevars), f"{a:#x}"
            compiled["code"] = compiled.get("code", 0) + 1
    return n


def _functions_equal(fast: Interpreter, pure: Interpreter, addrs, compiled: dict) -> None:
    """read_function through both interpreters gives the same record or error; where the compiled function reader
    (Objects.function, functions.c) answers by itself, its fields are the reference record's."""
    spec = _function_spec(fast)
    for a in addrs:
        got, want = _outcome(read_function, fast, a), _outcome(read_function, pure, a)
        assert got == want, f"function {a:#x} reads differently"
        raw = fast.fast.function(a, spec)
        if raw is not None:
            assert want[0] == "ok" and raw == tuple(getattr(want[1], f.name) for f in fields(want[1])[1:]), f"{a:#x}"
            compiled["function"] = compiled.get("function", 0) + 1


@needs_core
def test_objects_equal_reference_on_a_transformers_image(hf_image):
    with opened_heap(hf_image[0]) as (ip, _heap):
        rt = Runtime(ip)
        fast, pure = _pair(ip)
        counts: dict = {}
        assert _code_records_equal(fast, pure, rt.code_addrs[::2], counts) > 10_000
        _functions_equal(fast, pure, rt.function_addrs[::3] + [a + 16 for a in rt.function_addrs[::50]], counts)
        _compare(*_pair(ip), _addresses(rt, 7), counts)
    assert all(counts.get(m, 0) > 500 for m in ("kind", "str", "strs", "items", "bytes", "read", "code")), counts
    assert counts["function"] > 10_000, counts


@needs_core
@pytest.mark.parametrize("minor", ["3.8", "3.13", "3.14"])
def test_objects_equal_reference_on_other_pythons(foreign_images, minor):
    got = foreign_images(minor)
    if got is None:
        pytest.skip(f"no CPython {minor} here")
    with opened_heap(got[1]) as (ip, _heap):
        rt = Runtime(ip)
        counts: dict = {}
        assert _code_records_equal(*_pair(ip), rt.code_addrs, counts) > 1_000
        _functions_equal(*_pair(ip), rt.function_addrs, counts)
        _compare(*_pair(ip), _addresses(rt, 5), counts)
    assert counts.get("str", 0) > 100 and counts.get("items", 0) > 100, counts
    # 3.11+ code objects are read by the compiled code reader; 3.8's (co_code a bytes object) by the reference
    assert (counts.get("code", 0) > 1_000) == (minor != "3.8") and counts["function"] > 1_000, counts


def _mutated_space(ip: Interpreter, rt: Runtime, rng: random.Random) -> tuple[AddressSpace, list[int]]:
    """The image plus one chunk of copies of real objects (code objects whole, others 96-byte windows) with bytes
    overwritten: headers, sizes, lengths, state bits, item pointers. Where each copy starts is returned."""
    base = (max(c.end for c in ip.space.chunks) + (1 << 20)) & ~0xFFF
    sources: list[tuple[int, int]] = []
    C = ip.P.code
    sources += [(a, ip.P.function.size) for a in rt.function_addrs[::80]]
    for addr in rt.code_addrs[::60]:
        ci = rt.code(addr)
        if ci is None:
            continue
        sources += [(addr, C.co_code_adaptive + len(ci.adaptive) if C.has("co_code_adaptive") else 96)]
        sources += [(a, 96) for a in list(ci.consts)[:3]]
        sources += [(ip.ptr(addr + getattr(C, f)), 96) for f in ("co_names", "co_filename", "co_linetable") if C.has(f)]
    data, starts = bytearray(), []
    for src, size in sources:
        try:
            window = bytearray(ip.space.read(src, size))
        except ZenError:
            continue
        for _ in range(3):
            copy = bytearray(window)
            for _ in range(rng.choice([0, 1, 2, 4])):
                where = rng.choice([rng.randrange(size), rng.randrange(48)])  # the header more often
                copy[where] = rng.choice([0, 0xFF, 0x80, rng.randrange(256)])
            starts.append(base + len(data))
            data += copy
    cut = len(data) - 40  # the last copy runs off the end of the chunk
    space = AddressSpace(ip.space.regions, list(ip.space.chunks) + [BytesChunk(base, bytes(data[:cut]))])
    return space, [s for s in starts if s < base + cut] + [base + cut - 8]


@needs_core
def test_objects_equal_reference_on_mutated_copies_of_real_objects(hf_image):
    rng = random.Random(50)
    with opened_heap(hf_image[0]) as (ip, _heap):
        rt = Runtime(ip)
        space, starts = _mutated_space(ip, rt, rng)
        fast, pure = _pair(ip, space)
        for a in rt.code_addrs[:200]:  # the types of code, tuple, str and bytes objects in the kind caches of both
            for reader in (fast, pure):
                _outcome(read_code, reader, a)
        counts: dict = {}
        _compare(fast, pure, starts, counts)
        assert _code_records_equal(fast, pure, starts, counts) > 50
        _functions_equal(fast, pure, starts, counts)
    assert len(starts) > 1_000 and counts.get("str", 0) > 100 and counts.get("items", 0) > 100, counts
    assert counts.get("code", 0) > 20 and counts.get("function", 0) > 20, counts  # some mutated objects still read


@needs_core
def test_objects_answer_none_once_the_image_is_closed(hf_image):
    with opened_heap(hf_image[0]) as (ip, _heap):
        rt = Runtime(ip)
        ci = rt.code(rt.code_addrs[0])
        filename = ip.ptr(ci.addr + ip.P.code.co_filename)
        assert ip.fast.read(filename, 16) is not None
        ip._str_cache.clear()
        ip.space.close()
        assert ip.fast.read(filename, 16) is None and ip.fast.str(filename) is None


@needs_core
def test_overwritten_bytes_are_what_every_reader_reads(hf_image):
    """zen.memory.overlay writes bytes into a real image for every reader: the reads, the chunk table the bulk and
    compiled readers use; a space class that rewrites `read` itself gets no compiled reader (it would bypass it)."""
    from zen.memory.scan import gather_u64

    with opened_heap(hf_image[0]) as (ip, _heap):
        rt = Runtime(ip)
        ci = next(c for a in rt.code_addrs if (c := rt.code(a)) is not None and c.filename.isascii() and len(c.filename) > 4)
        name = ip.ptr(ci.addr + ip.P.code.co_filename)
        data = name + ip.P.unicode.ascii_data
        space = overlay(ip.space, {data: b"ZQ", data + 1: b"Y"})  # overlapping: the later one wins
        assert [c.start for c in space.chunks] == sorted(c.start for c in space.chunks) and space.read(data, 2) == b"ZY"
        assert int(gather_u64(space, [data & ~7])[0][0]) == int.from_bytes(space.read(data & ~7, 8), "little")
        fast, pure = _pair(ip, space)
        assert fast.str(name) == pure.str(name) == "ZY" + ci.filename[2:]
        assert fast.fast.str(name) == "ZY" + ci.filename[2:]

        class Rewriting(AddressSpace):
            def read(self, addr: int, size: int) -> bytes:
                return super().read(addr, size)

        assert Interpreter(Rewriting(ip.space.regions, ip.space.chunks), ip.info, ip.P).fast is None
