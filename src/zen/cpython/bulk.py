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
from zen.memory.scan import Located, gather_u64, u64_array
from zen.runtime.errors import ZenError

_SIZES = {"ptr": 8, "u64": 8, "i64": 8, "i32": 4, "u32": 4, "u16": 2, "i16": 2, "u8": 1, "i8": 1}


def as_array(addrs: Iterable[int] | np.ndarray) -> np.ndarray:
    return u64_array(addrs)


def gather_field(ip: Interpreter, addrs: np.ndarray, offset: int, ftype: str,
                 located: Located | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The field of type `ftype` at `addr + offset` for every address, as int64 (and ok flags).

    Fields narrower than a word are taken out of the aligned word that holds them (natural
    alignment keeps a field inside one word); a misaligned address is reported as not ok.
    `located`: the addresses located already (`Located`), for reading several fields of them."""
    size = _SIZES[ftype]
    at = addrs + np.uint64(offset)
    shift = (at & np.uint64(7)).astype(np.int64)
    if located is not None and not (addrs & np.uint64(7)).any():  # aligned objects: the same aligned word
        word, ok = located.u64(offset - offset % 8)
    else:
        word, ok = gather_u64(ip.space, at - shift.astype(np.uint64))
    ok &= (shift % size) == 0
    if size == 8:
        return (word.view(np.int64) if ftype == "i64" else word.astype(np.int64)), ok
    bits = 8 * size
    val = ((word >> (shift * 8).astype(np.uint64)) & np.uint64((1 << bits) - 1)).astype(np.int64)
    if ftype.startswith("i"):
        val = np.where(val >= 1 << (bits - 1), val - (1 << bits), val)
    return val, ok


def plain_headers(ip: Interpreter, addrs: np.ndarray, type_addr: int, at: Located | None = None) -> np.ndarray:
    """Mask: `Interpreter.header` accepts the object and its type is exactly `type_addr`. `at`:
    the addresses located already (`Located`, spanning the header)."""
    at = at or Located(ip.space, addrs, ip.P.object.ob_type + 8)
    rc, ok = at.u64(0)
    tp, ok2 = at.u64(ip.P.object.ob_type)
    rc &= np.uint64(ip.refcnt_mask)
    return (
        ok
        & ok2
        & (addrs > 0)
        & ((addrs & np.uint64(7)) == 0)
        & (rc > 0)
        & (rc <= np.uint64(ip.limits.max_refcnt))
        & (tp == np.uint64(type_addr))
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
        at = Located(ip.space, arr, max(U.length, U.state, ip.P.object.ob_type) + 8)  # each header found once
        good = plain_headers(ip, arr, ip.wk.types["str"], at)
        length, ok1 = gather_field(ip, arr, U.length, "i64", at)
        state, ok2 = gather_field(ip, arr, U.state, fields["state"][1] if "state" in fields else "u32", at)
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
    at = Located(ip.space, arr, ip.P.object.ob_type + 8)
    rc, ok = at.u64(0)
    tp, ok2 = at.u64(ip.P.object.ob_type)
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


class DictEntries:
    """The items of many dicts as arrays: `ok[i]`: dict i was read (else the reader decides);
    `owner`, `keys`, `values`: one row per item of the dicts read, dict by dict, each in
    iteration order (what `read_dict` returns for it)."""

    __slots__ = ("ok", "owner", "keys", "values")

    def __init__(self, n: int) -> None:
        self.ok = np.zeros(n, dtype=bool)
        self.owner = np.empty(0, dtype=np.int64)
        self.keys = np.empty(0, dtype=np.uint64)
        self.values = np.empty(0, dtype=np.uint64)


def dict_entries(ip: Interpreter, addrs: Sequence[int]) -> DictEntries:
    """`read_dict(ip, a)` for many exact dicts with combined tables (class and module namespaces),
    as arrays; dicts of any other kind, and wherever a check fails, are left to the reader.

    The headers and keys objects of all dicts are gathered at once, then every entry of every
    dict in one more gather."""
    out = DictEntries(len(addrs))
    D, K, c = ip.P.dict, ip.P.dictkeys, ip.P.constants
    if not len(addrs) or K.has("dk_size"):  # before 3.11 (slot counts, no kinds): left to the reader
        return out
    da = as_array(addrs)
    at = Located(ip.space, da, max(D.ma_values, D.ma_keys, D.ma_used, ip.P.object.ob_type) + 8)
    good = plain_headers(ip, da, ip.wk.types["dict"], at) & within_chunk(ip, da, D.ma_values + 8)
    used, ok1 = gather_field(ip, da, D.ma_used, "i64", at)
    keys, ok2 = gather_field(ip, da, D.ma_keys, "ptr", at)
    values, ok3 = gather_field(ip, da, D.ma_values, "ptr", at)
    good &= ok1 & ok2 & ok3 & (used >= 0) & (used <= ip.limits.max_items) & (values == 0)
    ka = keys.astype(np.uint64)
    good &= within_chunk(ip, ka, K.dk_indices)
    kat = Located(ip.space, ka, max(K.dk_log2_size, K.dk_log2_index_bytes, K.dk_kind, K.dk_nentries) + 8)
    log2 = gather_field(ip, ka, K.dk_log2_size, "u8", kat)[0]
    log2_ix = gather_field(ip, ka, K.dk_log2_index_bytes, "u8", kat)[0]
    kind = gather_field(ip, ka, K.dk_kind, "u8", kat)[0]
    nent = gather_field(ip, ka, K.dk_nentries, "i64", kat)[0]
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
    first, j = _ragged(counts)
    base = np.repeat(at[sel], counts) + (j * np.repeat(esize[sel], counts)).astype(np.uint64)
    k, ok_k = gather_u64(ip.space, base + np.repeat(np.where(general[sel], Eg.me_key, Eu.me_key), counts).astype(np.uint64))
    v, ok_v = gather_u64(ip.space, base + np.repeat(np.where(general[sel], Eg.me_value, Eu.me_value), counts).astype(np.uint64))
    if not (ok_k.all() and ok_v.all()):  # (not inside one chunk after all): the reader decides
        return out
    live = (k != 0) & (v != 0)
    cum = np.concatenate(([0], np.cumsum(live, dtype=np.int64)))
    nlive = cum[first[1:]] - cum[first[:-1]]
    whole = nlive == used[sel]  # else the reader refuses the dict (and says why)
    out.ok[sel[whole]] = True
    keep = live & np.repeat(whole, counts)
    out.owner = np.repeat(sel, counts)[keep]
    out.keys, out.values = k[keep], v[keep]
    return out


def dict_items(ip: Interpreter, addrs: Sequence[int]) -> list[list[tuple[int, int]] | None]:
    """`read_dict(ip, a)` for each address of an exact dict with a combined table (`dict_entries`);
    None for any other dict and wherever a check fails (callers use the reader there)."""
    got = dict_entries(ip, addrs)
    out: list[list[tuple[int, int]] | None] = [None] * len(addrs)
    if not got.ok.any():
        return out
    pairs = list(zip(got.keys.tolist(), got.values.tolist()))
    starts = np.concatenate(([0], np.cumsum(np.bincount(got.owner, minlength=len(addrs))))).tolist()
    for i in np.flatnonzero(got.ok).tolist():
        out[i] = pairs[starts[i] : starts[i + 1]]
    return out


def _ragged(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For items laid out as runs of `counts`: where each run starts in the flat order (and the
    total at the end), and each item's index within its run."""
    starts = np.concatenate(([0], np.cumsum(counts)))
    return starts, np.arange(starts[-1], dtype=np.int64) - np.repeat(starts[:-1], counts)


def within_chunk(ip: Interpreter, addrs: np.ndarray, size: int | np.ndarray) -> np.ndarray:
    """Mask: [addr, addr+size) lies inside one captured chunk (so `space.read` of it succeeds)."""
    space = ip.space
    if not len(addrs) or not space.chunks:
        return np.zeros(len(addrs), dtype=bool)
    starts, ends, _ids, _offs, _bufs = space.chunk_table()
    which = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
    w = np.maximum(which, 0)
    return (which >= 0) & (addrs < ends[w]) & (ends[w] - addrs >= np.asarray(size).astype(np.uint64))


def tuples(ip: Interpreter, addrs: Sequence[int], limit: int | None = None) -> list[list[int] | None]:
    """`read_tuple(ip, a, limit)` for each address of an exact tuple whose items lie in one chunk;
    None wherever a check fails or the tuple is of a subclass (callers use the reader there)."""
    out: list[list[int] | None] = [None] * len(addrs)
    if not len(addrs):
        return out
    ta = as_array(addrs)
    at = Located(ip.space, ta, max(ip.P.varobject.ob_size, ip.P.object.ob_type) + 8)
    good = plain_headers(ip, ta, ip.wk.types["tuple"], at)
    n, ok = gather_field(ip, ta, ip.P.varobject.ob_size, "i64", at)
    good &= ok & (n >= 0) & (n <= (limit or ip.limits.max_items))
    first = ta + np.uint64(ip.P.tuple.ob_item)
    good &= within_chunk(ip, first, np.where(good, n * 8, 0))
    sel = np.flatnonzero(good)
    if not sel.size:
        return out
    counts = n[sel]
    starts, j = _ragged(counts)
    items, ok = gather_u64(ip.space, np.repeat(first[sel], counts) + (j * 8).astype(np.uint64))
    if not ok.all():
        return out
    flat = items.tolist()
    for i, lo, hi in zip(sel.tolist(), starts[:-1].tolist(), starts[1:].tolist()):
        out[i] = flat[lo:hi]
    return out


def types(ip: Interpreter, addrs: Sequence[int]) -> None:
    """Read many type objects at once into the interpreter's type cache, exactly as `read_type`
    would (a census reads every one of a process's ~10,000 types).

    Types whose metatype is `type` or a metaclass of `type` (one level, as every class statement
    and pybind11 makes them), whose fields, name strings, bases/MRO tuples and, for heap types,
    `__module__` (the first entry of the class dict, where Python puts it) pass the vectorised
    checks are cached here; every other address (`__slots__`, deeper metaclass chains, anything
    unusual or invalid) is left for `read_type` to read, or to refuse with its reason."""
    from zen.cpython.readers.types import TypeInfo

    cache = ip._type_cache
    todo = [a for a in dict.fromkeys(addrs) if a not in cache]
    if not todo:
        return
    P, T, H, space = ip.P, ip.P.type, ip.P.heaptype, ip.space
    ta = as_array(todo)
    tt = np.uint64(ip.wk.types["type"])
    subclass = np.uint64(ip.tflags_type_subclass)
    # `check_type`: the metatype is `type`, or a type whose own metatype is `type` and that
    # subclasses `type`
    meta, ok = gather_u64(space, ta + np.uint64(P.object.ob_type))
    good = ok & (ta > 0) & ((ta & np.uint64(7)) == 0) & within_chunk(ip, ta, T.size)
    meta_meta, ok1 = gather_u64(space, meta + np.uint64(P.object.ob_type))
    meta_flags, ok2 = gather_u64(space, meta + np.uint64(T.tp_flags))
    good &= (meta == tt) | (ok1 & ok2 & (meta_meta == tt) & ((meta_flags & subclass) != 0))
    flags, ok = gather_u64(space, ta + np.uint64(T.tp_flags))
    heap = (flags & np.uint64(P.c("TPFLAGS_HEAPTYPE"))) != 0
    basic, ok1 = gather_field(ip, ta, T.tp_basicsize, "i64")
    item, ok2 = gather_field(ip, ta, T.tp_itemsize, "i64")
    good &= ok & ok1 & ok2 & (basic > 0) & (basic < 1 << 24) & (item >= 0) & (item < 1 << 16)
    # every field lies inside the object (checked above): words gathered unsigned, offsets signed
    f = {name: gather_u64(space, ta + np.uint64(off))[0] for name, off in (
        ("base", T.tp_base), ("dict", T.tp_dict), ("bases", T.tp_bases), ("mro", T.tp_mro), ("tp_name", T.tp_name),
        ("name", H.ht_name), ("qualname", H.ht_qualname), ("cached_keys", H.ht_cached_keys), ("slots", H.ht_slots))}  # fmt: skip
    f["dictoffset"] = gather_field(ip, ta, T.tp_dictoffset, "i64")[0]
    f["weaklistoffset"] = gather_field(ip, ta, T.tp_weaklistoffset, "i64")[0]
    none = np.uint64(ip.wk.singletons.get("None") or 0)
    good &= ~heap | (f["dict"] != 0)
    good &= (f["bases"] != 0) & (f["mro"] != 0)
    sel = np.flatnonzero(good).tolist()
    if not sel:
        return
    col = {k: v.tolist() for k, v in f.items()}
    flags_l, basic_l, item_l, meta_l, heap_l = flags.tolist(), basic.tolist(), item.tolist(), meta.tolist(), heap.tolist()
    hsel = [i for i in sel if heap_l[i]]
    names = strs(ip, [col["name"][i] for i in hsel] + [col["qualname"][i] for i in hsel])
    with_slots = [i for i in hsel if col["slots"][i] and col["slots"][i] != none]
    slot_tuples = dict(zip(with_slots, tuples(ip, [col["slots"][i] for i in with_slots])))
    slot_strs = strs(ip, [a for t in slot_tuples.values() if t for a in t])
    limit = ip.limits.max_mro
    bases = tuples(ip, [col["bases"][i] for i in sel], limit)
    mros = tuples(ip, [col["mro"][i] for i in sel], limit)
    module_of = _class_modules(ip, [col["dict"][i] for i in hsel])
    hpos = {i: j for j, i in enumerate(hsel)}
    for j, i in enumerate(sel):
        b, m = bases[j], mros[j]
        if b is None or m is None:
            continue
        if heap_l[i]:
            name, qualname = names.get(col["name"][i]), names.get(col["qualname"][i])
            module = module_of[hpos[i]]
            if name is None or qualname is None or module is False:
                continue
            module = module or "builtins"
            slots: list[str] = []
            if i in slot_tuples:
                items = slot_tuples[i]
                slots = [slot_strs.get(x) for x in items] if items is not None else [None]  # type: ignore[misc]
                if None in slots:
                    continue
        else:  # a static type: "module.Name" in tp_name, as `read_type` splits it
            try:
                cname = space.cstring(col["tp_name"][i], 1024).decode("utf-8", "replace")
            except ZenError:
                continue
            mod, _, name = cname.rpartition(".")
            qualname, module = name, mod or "builtins"
        a = todo[i]
        cache[a] = TypeInfo(addr=a, name=name, qualname=qualname, module=module, flags=flags_l[i], basicsize=basic_l[i],
                            itemsize=item_l[i], dictoffset=col["dictoffset"][i], weaklistoffset=col["weaklistoffset"][i],
                            base=col["base"][i], bases=b, mro_addrs=m, dict_addr=col["dict"][i], is_heap=heap_l[i],
                            metatype=meta_l[i], cached_keys=col["cached_keys"][i] if heap_l[i] else 0,
                            slot_names=slots if heap_l[i] else [])  # fmt: skip


def _class_modules(ip: Interpreter, dict_addrs: list[int]) -> list[str | None | bool]:
    """`__module__` of each class dict as `read_type` finds it (None: not a str), or False where
    the vectorised reading cannot tell (the reader decides): the dict must read in bulk, and the
    first key that is the str `__module__` names the value (`dict_get`: keys whose kind cannot
    be read are passed over, a str key that cannot be read ends the search undecided)."""
    out: list[str | None | bool] = [False] * len(dict_addrs)
    items = dict_items(ip, dict_addrs)
    # a class statement puts `__module__` first: every key is read only where it is not
    firsts = list({got[0][0] for got in items if got})
    first_kind = dict(zip(firsts, kinds(ip, firsts)))
    first_name = strs(ip, [k for k in firsts if first_kind[k] == "str"])
    keys = list({k for got in items if got and first_name.get(got[0][0]) != "__module__" for k, _ in got} | set(firsts))
    key_kind = dict(zip(keys, kinds(ip, keys)))
    key_name = strs(ip, [k for k in keys if key_kind[k] == "str"])
    found: list[int | None] = [None] * len(items)
    for j, got in enumerate(items):
        if got and first_name.get(got[0][0]) == "__module__":
            found[j] = got[0][1]
            continue
        for k, v in got or ():
            if key_kind[k] != "str":
                continue
            name = key_name[k]
            if name is None:  # `ip.str` raises here, `dict_get` does not catch it
                break
            if name == "__module__":
                found[j] = v
                break
    values = [v for v in found if v is not None]
    value_kind = dict(zip(values, kinds(ip, values)))
    value_name = strs(ip, [v for v in values if value_kind[v] == "str"])
    for j, (got, v) in enumerate(zip(items, found)):
        if got is None:
            continue
        if v is None:
            if got and all(key_kind[k] != "str" or key_name[k] not in (None, "__module__") for k, _ in got):
                out[j] = None  # no `__module__` key at all
            continue
        if value_kind[v] is None:
            continue  # the reader raises on an unreadable `__module__` value
        if value_kind[v] != "str":
            out[j] = None
        elif value_name.get(v) is not None:
            out[j] = value_name[v]
    return out
