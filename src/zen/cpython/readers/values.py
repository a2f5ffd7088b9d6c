"""Convert plain data objects of an image into Python values, recursively and bounded.

Plain data (None, bools, numbers, strings, bytes, tuples, lists, dicts, sets) becomes the equal
Python value. Anything else (functions, instances, modules...) becomes a `Ref` naming its address
and type, so a hyper-parameter dict with an odd member is still readable. Recursion is bounded
in depth and breaks cycles (a list containing itself becomes a Ref at the second visit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zen.runtime.errors import ObjectError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


@dataclass(frozen=True)
class Ref:
    """An object that is not plain data (or could not be converted), by address and type name."""

    addr: int
    type_name: str
    note: str = ""

    def __repr__(self) -> str:
        extra = f" {self.note}" if self.note else ""
        return f"<{self.type_name} at {self.addr:#x}{extra}>"


def to_python(ip: ImageReader, addr: int, depth: int, _active: set[int] | None = None) -> Any:
    if addr == 0:
        raise ObjectError(addr, "NULL object pointer")
    kind = ip.kind(addr)
    simple = _SIMPLE.get(kind)
    if simple is not None:
        return simple(ip, addr)
    if kind not in _CONTAINERS:
        return Ref(addr, ip.type_name(addr))
    if depth <= 0:
        return Ref(addr, kind, "nested too deep")
    active = _active if _active is not None else set()
    if addr in active:
        return Ref(addr, kind, "cycle")
    active.add(addr)
    try:
        return _CONTAINERS[kind](ip, addr, depth - 1, active)
    finally:
        active.discard(addr)


def _hashable(v: Any) -> Any:
    try:
        hash(v)
        return v
    except TypeError:
        return Ref(0, type(v).__name__, "unhashable")


def _tuple(ip, addr, depth, active):
    from zen.cpython.readers.containers import read_tuple

    return tuple(to_python(ip, a, depth, active) for a in read_tuple(ip, addr))


def _list(ip, addr, depth, active):
    from zen.cpython.readers.containers import read_list

    return [to_python(ip, a, depth, active) for a in read_list(ip, addr)]


def _dict(ip, addr, depth, active):
    from zen.cpython.readers.dicts import read_dict

    return {_hashable(to_python(ip, k, depth, active)): to_python(ip, v, depth, active) for k, v in read_dict(ip, addr)}


def _set(ip, addr, depth, active):
    from zen.cpython.readers.containers import read_set

    items = {_hashable(to_python(ip, a, depth, active)) for a in read_set(ip, addr)}
    return frozenset(items) if ip.kind(addr) == "frozenset" else items


def _slice(ip: ImageReader, addr: int, depth: int, active: set[int]) -> slice:
    """3.14 folds constant slices (`x[1:2]`) into code constants."""
    S = ip.P.slice
    parts = [ip.ptr(addr + off) for off in (S.start, S.stop, S.step)]
    return slice(*(to_python(ip, a, depth, active) for a in parts))


def _simple_table():
    from zen.cpython.readers import numbers, text

    return {
        "none": lambda ip, a: None,
        "ellipsis": lambda ip, a: Ellipsis,
        "notimplemented": lambda ip, a: NotImplemented,
        "bool": lambda ip, a: numbers.read_bool(ip, a),
        "int": numbers.read_int,
        "float": numbers.read_float,
        "complex": numbers.read_complex,
        "str": lambda ip, a: ip.str(a),
        "bytes": text.read_bytes,
        "bytearray": text.read_bytearray,
    }


_SIMPLE = _simple_table()
_CONTAINERS = {"tuple": _tuple, "list": _list, "dict": _dict, "set": _set, "frozenset": _set, "slice": _slice}
