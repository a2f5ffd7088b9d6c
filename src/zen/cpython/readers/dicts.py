"""Reader for dict (PyDictObject + PyDictKeysObject), combined and split tables, any index width.

A dict's keys object holds a hash index (1, 2, 4 or 8 bytes per slot) followed by the entries in
insertion order: (hash, key, value) for general tables, (key, value) for str-keyed and split
ones (before 3.11: (hash, key, value) everywhere, and a slot count instead of its log2). Split
tables (instance dicts sharing their class's keys) keep the values in a separate array whose
prefix records insertion order (before 3.11: the keys' entry order is the order); that same
values array is what a never-materialised instance `__dict__` is made of (3.11+), so
`read_split_values` serves both.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from zen.runtime.errors import MemoryReadError, ObjectError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


class DictKeys:
    """A validated PyDictKeysObject: its kind and entry arrays."""

    __slots__ = ("addr", "kind", "log2_size", "nentries", "keys", "values", "hashes")

    def __init__(self, ip: ImageReader, addr: int, owner: int) -> None:
        K = ip.P.dictkeys
        c = ip.P.constants
        try:
            head = ip.space.read(addr, K.dk_indices)
        except MemoryReadError:
            raise ObjectError(owner, "dict keys object not in the image") from None
        self.addr = addr
        if K.has("dk_size"):
            self._legacy(ip, head, owner)
            return
        self.log2_size = head[K.dk_log2_size]
        log2_index_bytes = head[K.dk_log2_index_bytes]
        self.kind = head[K.dk_kind]
        self.nentries = struct.unpack_from("<q", head, K.dk_nentries)[0]
        # Empty dicts share a static keys object of size 1 (log2 0); real tables have >= 8 slots.
        if not (3 <= self.log2_size <= 40 or (self.log2_size == 0 and self.nentries == 0)):
            raise ObjectError(owner, f"implausible dict size 2**{self.log2_size}")
        size = 1 << self.log2_size
        width = 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4 if size <= 0xFFFFFFFF else 8
        empty = self.log2_size == 0 and self.nentries == 0  # the shared empty keys (3.13: 8 index bytes)
        if (1 << log2_index_bytes) != size * width and not (empty and log2_index_bytes <= 3):
            raise ObjectError(owner, "dict index size inconsistent with table size")
        if not 0 <= self.nentries <= min((size << 1) // 3 + 1, ip.limits.max_items):
            raise ObjectError(owner, f"implausible dict entry count {self.nentries}")
        if self.kind not in (c["DICT_KEYS_GENERAL"], c["DICT_KEYS_UNICODE"], c["DICT_KEYS_SPLIT"]):
            raise ObjectError(owner, f"invalid dict keys kind {self.kind}")
        general = self.kind == c["DICT_KEYS_GENERAL"]
        E = ip.P.dictentry_general if general else ip.P.dictentry_unicode
        esize = E.size
        at = addr + K.dk_indices + (1 << log2_index_bytes)
        raw = ip.read_within(at, self.nentries * esize, owner, "dict entries")
        words = np.frombuffer(raw, dtype="<u8").reshape(self.nentries, esize // 8)
        self.keys = words[:, E.me_key // 8].tolist()
        self.values = words[:, E.me_value // 8].tolist()
        self.hashes = words[:, E.me_hash // 8].tolist() if general else None

    def _legacy(self, ip: ImageReader, head: bytes, owner: int) -> None:
        """Before 3.11: a slot count (`dk_size`), and (hash, key, value) entries in every table."""
        K = ip.P.dictkeys
        size = struct.unpack_from("<q", head, K.dk_size)[0]
        self.nentries = struct.unpack_from("<q", head, K.dk_nentries)[0]
        # Empty dicts share a static keys object of size 1; real tables have >= 8 slots.
        if not ((8 <= size <= 1 << 40 and not size & (size - 1)) or (size == 1 and self.nentries == 0)):
            raise ObjectError(owner, f"implausible dict size {size}")
        if not 0 <= self.nentries <= min((size << 1) // 3 + 1, ip.limits.max_items):
            raise ObjectError(owner, f"implausible dict entry count {self.nentries}")
        self.log2_size = size.bit_length() - 1
        self.kind = -1  # no kind byte: split tables are told by their values array
        width = 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4 if size <= 0xFFFFFFFF else 8
        E = ip.P.dictentry_general
        at = self.addr + K.dk_indices + size * width
        raw = ip.read_within(at, self.nentries * E.size, owner, "dict entries")
        words = np.frombuffer(raw, dtype="<u8").reshape(self.nentries, E.size // 8)
        self.keys = words[:, E.me_key // 8].tolist()
        self.values = words[:, E.me_value // 8].tolist()
        self.hashes = words[:, E.me_hash // 8].tolist()


def read_split_values(ip: ImageReader, values: int, keys: DictKeys, owner: int) -> list[tuple[int, int]]:
    """(key, value) pairs of a split table, in insertion order, from its values array.

    `values` is what a split dict's `ma_values` holds: in 3.11/3.12 the values array itself, with
    the insertion order in a prefix before it; from 3.13 a header (capacity, size, embedded,
    valid) followed by the values, with the insertion order after `values[capacity]`.
    """
    layout = ip.P.constants.get("DICT_VALUES_ORDER")
    n = keys.nentries
    if layout == 0:  # before 3.11: the values follow the shared keys' entry order
        order: bytes | range = range(n)
        array = values
    elif layout == 1:
        try:
            prefix_size = ip.space.read(values - 1, 1)[0]
            count = ip.space.read(values - 2, 1)[0]
        except MemoryReadError:
            raise ObjectError(owner, "split dict values not in the image") from None
        if prefix_size % 8 or count + 2 > prefix_size or count > n:
            raise ObjectError(owner, f"implausible split values prefix (size {prefix_size}, count {count})")
        order = ip.space.read(values - 2 - count, count)[::-1] if count else b""
        array = values
    elif layout == 2:
        V = ip.P.dictvalues
        try:
            head = ip.space.read(values, V.values)
        except MemoryReadError:
            raise ObjectError(owner, "split dict values not in the image") from None
        capacity, count = head[V.capacity], head[V.size]
        if count > capacity or n > capacity or count > n:
            raise ObjectError(owner, f"implausible split values header (capacity {capacity}, size {count}, keys {n})")
        array = values + V.values
        order = ip.read_within(array + 8 * capacity, count, owner, "split values order") if count else b""
    else:
        raise ObjectError(owner, "split dict values layout of this Python version is not supported")
    vals = struct.unpack(f"<{n}Q", ip.read_within(array, 8 * n, owner, "split dict values")) if n else ()
    out = []
    for ix in order:
        if ix >= n:
            raise ObjectError(owner, f"split values order refers to entry {ix} of {n}")
        if vals[ix]:
            out.append((keys.keys[ix], vals[ix]))
    return out


def read_dict(ip: ImageReader, addr: int) -> list[tuple[int, int]]:
    """(key address, value address) pairs of a dict (or dict subclass), in iteration order."""
    kind = ip.kind(addr)
    if kind != "dict":
        raise ObjectError(addr, f"expected a dict, found {kind}")
    D = ip.P.dict
    try:
        raw = ip.space.read(addr, D.ma_values + 8)
    except MemoryReadError:
        raise ObjectError(addr, "dict object not in the image") from None
    used = struct.unpack_from("<q", raw, D.ma_used)[0]
    keys_addr = struct.unpack_from("<Q", raw, D.ma_keys)[0]
    values = struct.unpack_from("<Q", raw, D.ma_values)[0]
    if not 0 <= used <= ip.limits.max_items:
        raise ObjectError(addr, f"implausible dict size {used}")
    keys = DictKeys(ip, keys_addr, addr)
    if values:
        items = read_split_values(ip, values, keys, addr)
    else:
        items = [(k, v) for k, v in zip(keys.keys, keys.values) if k and v]
    if len(items) != used:
        raise ObjectError(addr, f"dict holds {len(items)} items but claims {used}")
    return items


def dict_get(ip: ImageReader, addr: int, key: str) -> int | None:
    """Address of the value for str `key`, or None. Non-str keys are skipped."""
    for k, v in read_dict(ip, addr):
        try:
            if ip.kind(k) == "str" and ip.str(k) == key:
                return v
        except ObjectError:
            continue
    return None


def dict_str_items(ip: ImageReader, addr: int) -> list[tuple[str, int]]:
    """(name, value address) pairs of a dict whose keys are strings (namespaces, __dict__s)."""
    out = []
    for k, v in read_dict(ip, addr):
        if ip.kind(k) == "str":
            out.append((ip.str(k), v))
    return out
