"""Vectorised readers for many objects of one kind at once (system tables, class dictionaries).

The per-object readers (`zen.cpython.readers`) validate one object with a handful of small reads
each: right for the few thousand objects a model's code is made of, far too slow for the
80,000 code objects, 60,000 functions and 10,000 class dictionaries of a process that imported
transformers (each small read is a bisect, a slice and an unpack in Python). These helpers read
the same fields for thousands of addresses with numpy gathers over the image, apply the same
checks as the readers vectorised, and hand anything that is not the common, plainly valid case
back to the per-object reader, so results (and errors) are exactly the reader's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from zen.cpython.interp import Interpreter
from zen.errors import ZenError
from zen.memory.scan import gather_u64

_SIZES = {"ptr": 8, "u64": 8, "i64": 8, "i32": 4, "u32": 4, "u16": 2, "i16": 2, "u8": 1, "i8": 1}


def as_array(addrs: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(addrs, np.ndarray):
        return addrs.astype(np.uint64, copy=False)
    return np.fromiter(addrs, dtype=np.uint64)


def gather_field(ip: Interpreter, addrs: np.ndarray, offset: int, ftype: str) -> tuple[np.ndarray, np.ndarray]:
    """The field of type `ftype` at `addr + offset` for every address, as int64 (and ok flags).

    Fields narrower than a word are taken out of the aligned word that holds them (natural
    alignment keeps a field inside one word); a misaligned address is reported as not ok."""
    size = _SIZES[ftype]
    at = addrs + np.uint64(offset)
    shift = (at & np.uint64(7)).astype(np.int64)
    word, ok = gather_u64(ip.space, at - shift.astype(np.uint64))
    ok &= (shift % size) == 0
    if size == 8:
        return (word.view(np.int64) if ftype == "i64" else word.astype(np.int64)), ok
    bits = 8 * size
    val = ((word >> (shift * 8).astype(np.uint64)) & np.uint64((1 << bits) - 1)).astype(np.int64)
    if ftype.startswith("i"):
        val = np.where(val >= 1 << (bits - 1), val - (1 << bits), val)
    return val, ok


def plain_headers(ip: Interpreter, addrs: np.ndarray, type_addr: int) -> np.ndarray:
    """Mask: `Interpreter.header` accepts the object and its type is exactly `type_addr`."""
    rc, ok = gather_u64(ip.space, addrs)
    tp, ok2 = gather_u64(ip.space, addrs + np.uint64(ip.P.object.ob_type))
    rc &= np.uint64(ip.refcnt_mask)
    return ok & ok2 & (addrs > 0) & ((addrs & np.uint64(7)) == 0) & (rc > 0) & (rc <= np.uint64(ip.limits.max_refcnt)) & (
        tp == np.uint64(type_addr)
    )


def byte_slices(ip: Interpreter, addrs: np.ndarray, sizes: np.ndarray) -> list[bytes | None]:
    """bytes [addr, addr+size) for each pair where they lie inside one chunk with a buffer (the
    fast case of `Interpreter.read_within`); None elsewhere (callers use the reader there)."""
    space = ip.space
    out: list[bytes | None] = [None] * len(addrs)
    if not len(addrs) or not space.chunks:
        return out
    starts, ends, ids, offs, buffers = space.chunk_table()
    which = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
    w = np.maximum(which, 0)
    sz = sizes.astype(np.int64)
    inside = (which >= 0) & (addrs < ends[w]) & (sz >= 0) & (addrs + sz.astype(np.uint64) <= ends[w]) & (ids[w] >= 0)
    pos = offs[w] + (addrs - starts[w]).astype(np.int64)
    for i, b, p, n in zip(np.flatnonzero(inside).tolist(), ids[w][inside].tolist(), pos[inside].tolist(), sz[inside].tolist()):
        out[i] = bytes(buffers[b][p : p + n])
    return out


def strs(ip: Interpreter, addrs: Sequence[int]) -> dict[int, str | None]:
    """`ip.str(a)` for every address (None where it raises), read in bulk and cached in `ip`.

    Compact ASCII str objects of the exact str type (almost every name in a process) are read
    vectorised; any other string, and every string that fails a check, goes through `ip.str`."""
    out: dict[int, str | None] = {}
    cache = ip._str_cache
    todo = [a for a in dict.fromkeys(addrs) if a not in cache]
    for a in addrs:
        if a in cache:
            out[a] = cache[a]
    if todo:
        arr = as_array(todo)
        U, c = ip.P.unicode, ip.P.constants
        fields = U.fields()
        good = plain_headers(ip, arr, ip.wk.types["str"])
        length, ok1 = gather_field(ip, arr, U.length, "i64")
        state, ok2 = gather_field(ip, arr, U.state, fields["state"][1] if "state" in fields else "u32")
        good &= ok1 & ok2 & (length >= 0) & (length <= ip.limits.max_str)
        good &= ((state >> c["UNICODE_KIND_SHIFT"]) & 7) == 1
        good &= ((state >> c["UNICODE_COMPACT_BIT"]) & 1) == 1
        good &= ((state >> c["UNICODE_ASCII_BIT"]) & 1) == 1
        data = byte_slices(ip, arr + np.uint64(U.ascii_data), np.where(good, length, -1))
        for a, raw, g in zip(todo, data, good.tolist()):
            s = None
            if g and raw is not None:
                try:
                    s = raw.decode("ascii")
                except UnicodeDecodeError:
                    s = None
            if s is not None:
                cache[a] = s
                out[a] = s
                continue
            try:
                out[a] = ip.str(a)
            except ZenError:
                out[a] = None
    return out


def kinds(ip: Interpreter, addrs: Sequence[int]) -> list[str | None]:
    """`ip.kind(a)` for every address (None where it raises), with headers read in bulk."""
    obj_kind = ip._obj_kind
    out: list[str | None] = [obj_kind.get(a) for a in addrs]
    todo = [i for i, k in enumerate(out) if k is None]
    if not todo:
        return out
    arr = as_array(addrs[i] for i in todo)
    rc, ok = gather_u64(ip.space, arr)
    tp, ok2 = gather_u64(ip.space, arr + np.uint64(ip.P.object.ob_type))
    rc &= np.uint64(ip.refcnt_mask)
    good = ok & ok2 & (arr > 0) & ((arr & np.uint64(7)) == 0) & (rc > 0) & (rc <= np.uint64(ip.limits.max_refcnt))
    good &= (tp != 0) & ((tp & np.uint64(7)) == 0)
    by_type: dict[int, str | None] = {}
    for i, t, g in zip(todo, tp.tolist(), good.tolist()):
        a = addrs[i]
        if g:
            k = by_type.get(t, "?")
            if k == "?":
                try:
                    ip.check_type(t)
                    k = ip.kind_of_type(t)
                except ZenError:
                    k = None
                by_type[t] = k
            if k is not None:
                ip._obj_type[a] = t
                obj_kind[a] = k
                out[i] = k
                continue
        try:  # the reader decides (and explains) what the vectorised checks did not accept
            out[i] = ip.kind(a)
        except ZenError:
            out[i] = None
    return out
