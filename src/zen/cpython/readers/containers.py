"""Readers for tuple, list, set and frozenset: the addresses of their elements.

Element addresses (not values) are returned so callers decide how deep to go; `values.to_python`
converts recursively with a depth bound and cycle detection. Sizes are checked against the
allocation they claim before anything is read.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from zen.runtime.errors import ObjectError, ZenError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


def _items(ip: ImageReader, addr: int, at: int, n: int) -> list[int]:
    if n == 0:
        return []
    return list(struct.unpack(f"<{n}Q", ip.read_within(at, 8 * n, addr, f"{n} element pointers")))


def read_tuple(ip: ImageReader, addr: int, limit: int | None = None) -> list[int]:
    if ip.fast is not None:  # the compiled reader answers the plain case, None for anything the code below decides
        got = ip.fast.items(addr, limit)
        if got is not None:
            return got
    kind = ip.kind(addr)
    if kind != "tuple":
        raise ObjectError(addr, f"expected a tuple, found {kind}")
    n = ip.space.i64(addr + ip.P.varobject.ob_size)
    if not 0 <= n <= (limit or ip.limits.max_items):
        raise ObjectError(addr, f"implausible tuple size {n}")
    return _items(ip, addr, addr + ip.P.tuple.ob_item, n)


def read_list(ip: ImageReader, addr: int) -> list[int]:
    kind = ip.kind(addr)
    if kind != "list":
        raise ObjectError(addr, f"expected a list, found {kind}")
    L = ip.P.list
    n = ip.space.i64(addr + ip.P.varobject.ob_size)
    allocated = ip.space.i64(addr + L.allocated)
    if not 0 <= n <= ip.limits.max_items or allocated < n:
        raise ObjectError(addr, f"implausible list size {n} (allocated {allocated})")
    if n == 0:
        return []
    return _items(ip, addr, ip.ptr(addr + L.ob_item), n)


def read_set(ip: ImageReader, addr: int) -> list[int]:
    """Members of a set or frozenset, in table order."""
    kind = ip.kind(addr)
    if kind not in ("set", "frozenset"):
        raise ObjectError(addr, f"expected a set, found {kind}")
    S = ip.P.set
    used = ip.space.i64(addr + S.used)
    fill = ip.space.i64(addr + S.fill)
    mask = ip.space.i64(addr + S.mask)
    # CPython resizes to the smallest power of two above 4*used (2*used for huge sets), and fill
    # (used + dummies) only grows until the next resize: the table is never much larger than that.
    if not 0 <= used <= fill <= ip.limits.max_items or mask < 7 or (mask + 1) & mask or mask + 1 > max(8, 8 * (fill + 1)):
        raise ObjectError(addr, f"implausible set table (used {used}, fill {fill}, mask {mask})")
    table = ip.ptr(addr + S.table)
    esize = ip.P.setentry.size
    raw = ip.read_within(table, (mask + 1) * esize, addr, "set table")
    keys = struct.unpack(f"<{(mask + 1) * esize // 8}Q", raw)[:: esize // 8]
    out = []
    dummy = ip.wk.set_dummy
    for k in keys:
        if k == 0 or k == dummy:
            continue
        if dummy is None and _is_dummy(ip, k):
            ip.wk.set_dummy = dummy = k
            continue
        out.append(k)
    if len(out) != used:
        raise ObjectError(addr, f"set table holds {len(out)} keys but claims {used}")
    return out


def _is_dummy(ip: ImageReader, key: int) -> bool:
    try:
        return ip.type_info(ip.header(key)[1]).qualname == ip.P.set_dummy_type_name
    except ZenError:
        return False
