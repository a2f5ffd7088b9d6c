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


def dict_items(ip: Interpreter, addrs: Sequence[int]) -> list[list[tuple[int, int]] | None]:
    """`read_dict(ip, a)` for each address of an exact dict with a combined table (class and module
    namespaces); None for any other dict and wherever a check fails (callers use the reader there).

    The headers and keys objects of all dicts are gathered at once, then every entry of every
    dict in one more gather: what is left per dict is slicing its list of pairs."""
    out: list[list[tuple[int, int]] | None] = [None] * len(addrs)
    D, K, c = ip.P.dict, ip.P.dictkeys, ip.P.constants
    if not len(addrs) or K.has("dk_size"):  # before 3.11 (slot counts, no kinds): left to the reader
        return out
    da = as_array(addrs)
    good = plain_headers(ip, da, ip.wk.types["dict"]) & within_chunk(ip, da, D.ma_values + 8)
    used, ok1 = gather_field(ip, da, D.ma_used, "i64")
    keys, ok2 = gather_field(ip, da, D.ma_keys, "ptr")
    values, ok3 = gather_field(ip, da, D.ma_values, "ptr")
    good &= ok1 & ok2 & ok3 & (used >= 0) & (used <= ip.limits.max_items) & (values == 0)
    ka = keys.astype(np.uint64)
    good &= within_chunk(ip, ka, K.dk_indices)
    log2 = gather_field(ip, ka, K.dk_log2_size, "u8")[0]
    log2_ix = gather_field(ip, ka, K.dk_log2_index_bytes, "u8")[0]
    kind = gather_field(ip, ka, K.dk_kind, "u8")[0]
    nent = gather_field(ip, ka, K.dk_nentries, "i64")[0]
    good &= (log2 >= 3) & (log2 <= 40) & (log2_ix <= 60)  # (the shared empty keys: left to the reader)
    size = np.left_shift(np.int64(1), np.clip(log2, 0, 40))
    index_bytes = np.left_shift(np.int64(1), np.clip(log2_ix, 0, 60))
    width = np.where(size <= 0xFF, 1, np.where(size <= 0xFFFF, 2, np.where(size <= 0xFFFFFFFF, 4, 8)))
    good &= (index_bytes == size * width) & (nent >= 0) & (nent <= np.minimum((size << 1) // 3 + 1, ip.limits.max_items))
    general = kind == c["DICT_KEYS_GENERAL"]
    good &= general | (kind == c["DICT_KEYS_UNICODE"])
    Eg, Eu = ip.P.dictentry_general, ip.P.dictentry_unicode
    esize = np.where(general, Eg.size, Eu.size)
    at = ka + np.uint64(K.dk_indices) + index_bytes.astype(np.uint64)
    good &= within_chunk(ip, at, np.where(good, nent * esize, 0))  # `read_within` of the entries
    # every entry of every dict in one gather: the (key, value) words of entry j of dict i
    sel = np.flatnonzero(good)
    if not sel.size:
        return out
    counts = nent[sel]
    first = np.concatenate(([0], np.cumsum(counts)))
    j = np.arange(first[-1], dtype=np.int64) - np.repeat(first[:-1], counts)
    base = np.repeat(at[sel], counts) + (j * np.repeat(esize[sel], counts)).astype(np.uint64)
    k, ok_k = gather_u64(ip.space, base + np.repeat(np.where(general[sel], Eg.me_key, Eu.me_key), counts).astype(np.uint64))
    v, ok_v = gather_u64(ip.space, base + np.repeat(np.where(general[sel], Eg.me_value, Eu.me_value), counts).astype(np.uint64))
    if not (ok_k.all() and ok_v.all()):  # (not inside one chunk after all): the reader decides
        return out
    live = (k != 0) & (v != 0)
    cum = np.concatenate(([0], np.cumsum(live, dtype=np.int64)))
    nlive = cum[first[1:]] - cum[first[:-1]]
    pairs = list(zip(k[live].tolist(), v[live].tolist()))
    ends = cum[first[1:]].tolist()
    for i, hi, n, u in zip(sel.tolist(), ends, nlive.tolist(), used[sel].tolist()):
        if n == u:  # else the reader refuses the dict (and says why)
            out[i] = pairs[hi - n : hi]
    return out


def within_chunk(ip: Interpreter, addrs: np.ndarray, size: int | np.ndarray) -> np.ndarray:
    """Mask: [addr, addr+size) lies inside one captured chunk (so `space.read` of it succeeds)."""
    space = ip.space
    if not len(addrs) or not space.chunks:
        return np.zeros(len(addrs), dtype=bool)
    starts, ends, _ids, _offs, _bufs = space.chunk_table()
    which = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
    w = np.maximum(which, 0)
    return (which >= 0) & (addrs < ends[w]) & (ends[w] - addrs >= np.asarray(size).astype(np.uint64))
