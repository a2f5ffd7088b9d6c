"""The namespaces of a process's classes and modules, read for many dicts at once.

The closure and the PR read the namespace of every class and module the model's code touches, one
at a time as the walk reaches them: a thousand dicts, tens of thousands of str keys, each key a
header check, a type check and a string read in Python (`dict_str_items`). Here the items of every
class and module dict are gathered in one pass (`bulk.dict_entries`) and every key is checked in
the same vectorised way `bulk.strs` checks a compact ASCII str; a namespace asked for is then a
slice of those arrays with its names decoded. A dict with any key the fast checks do not accept
(another kind of key, a non-ASCII name, anything unusual) is read by `dict_str_items` instead,
so a namespace is always exactly what the reader gives (`tests/test_bulk_readers.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from zen.cpython import bulk
from zen.memory.scan import Located

if TYPE_CHECKING:
    from zen.cpython.interp import Interpreter


class NamespaceTable:
    """The items of many dicts as arrays, and their str keys' data positions in the image."""

    def __init__(self, ip: Interpreter, dict_addrs: list[int]) -> None:
        self.ip = ip
        self.dicts = list(dict.fromkeys(dict_addrs))
        self.index = {d: i for i, d in enumerate(self.dicts)}
        got = bulk.dict_entries(ip, self.dicts)
        self.ok, self.owner, self.keys, self.values = got.ok, got.owner, got.keys, got.values
        self.starts = np.concatenate(([0], np.cumsum(np.bincount(self.owner, minlength=len(self.dicts))))).tolist()
        # kept as arrays, sliced per namespace asked for: a recovery asks for ~1,300 of ~12,000 dicts (30,000 of
        # 225,000 entries in a GPT-2 process), and making lists of all of them cost more than those questions
        self._fast, self._buf, self._pos, self._len = _ascii_keys(ip, self.keys)

    def items(self, dict_addr: int) -> list[tuple[str, int]] | None:
        """`dict_str_items(ip, dict_addr)` when every key passes the fast checks; else None."""
        i = self.index.get(dict_addr)
        if i is None or not self.ok[i]:
            return None
        lo, hi = self.starts[i], self.starts[i + 1]
        if not self._fast[lo:hi].all():
            return None
        cache = self.ip._str_cache
        buffers = self.ip.space.chunk_table()[4]
        keys, values = self.keys[lo:hi].tolist(), self.values[lo:hi].tolist()
        names = [cache.get(k) for k in keys]
        if None in names:  # the keys not read before: their bytes, where the checks above found them
            bufs, pos, lens = self._buf[lo:hi].tolist(), self._pos[lo:hi].tolist(), self._len[lo:hi].tolist()
            for j, k in enumerate(keys):
                if names[j] is None:
                    p = pos[j]
                    try:
                        names[j] = cache[k] = bytes(buffers[bufs[j]][p : p + lens[j]]).decode("ascii")
                    except UnicodeDecodeError:
                        return None  # the reader refuses it (and says why)
        return list(zip(names, values))


def _ascii_keys(ip: Interpreter, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mask of keys that are exact, compact, ASCII str objects whose data lies in one chunk (what
    `read_str` reads without question), with each one's buffer, offset in it and length."""
    n = len(keys)
    if not n:
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros(0, dtype=bool), empty, empty, empty
    U, c = ip.P.unicode, ip.P.constants
    fields = U.fields()
    at = Located(ip.space, keys, max(U.length, U.state, ip.P.object.ob_type) + 8)  # the header, found once
    good = bulk.plain_headers(ip, keys, ip.wk.types["str"], at)
    length, ok1 = bulk.gather_field(ip, keys, U.length, "i64", at)
    state, ok2 = bulk.gather_field(ip, keys, U.state, fields["state"][1] if "state" in fields else "u32", at)
    good &= ok1 & ok2 & (length >= 0) & (length <= ip.limits.max_str)
    good &= ((state >> c["UNICODE_KIND_SHIFT"]) & 7) == 1
    good &= ((state >> c["UNICODE_COMPACT_BIT"]) & 1) == 1
    good &= ((state >> c["UNICODE_ASCII_BIT"]) & 1) == 1
    data = keys + np.uint64(U.ascii_data)
    good &= bulk.within_chunk(ip, data, np.where(good, length, 0))
    starts, _ends, ids, offs, _bufs = ip.space.chunk_table()
    which = np.maximum(np.searchsorted(starts, data, side="right").astype(np.int64) - 1, 0)
    good &= ids[which] >= 0
    pos = offs[which] + (data - starts[which]).astype(np.int64)
    return good, ids[which], pos, length
