"""Readers for str (PyUnicodeObject, all kinds), bytes (PyBytesObject) and bytearray.

A str is "compact" (data right after the header; ASCII strings have a shorter header) unless it
is an instance of a str subclass, which keeps a pointer to separately allocated data. The kind
(1, 2 or 4 bytes per character) and the ascii/compact flags come from the state bit field, whose
bit positions are measured by calibration.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from zen.runtime.errors import MemoryReadError, ObjectError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader

_ENCODINGS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}


def _expect(ip: ImageReader, addr: int, kind: str) -> None:
    got = ip.kind(addr)
    if got != kind:
        raise ObjectError(addr, f"expected a {kind} object, found {got}")


def read_str(ip: ImageReader, addr: int) -> str:
    _expect(ip, addr, "str")
    U = ip.P.unicode
    c = ip.P.constants
    try:
        head = ip.space.read(addr, U.state + 4)
        length = struct.unpack_from("<q", head, U.length)[0]
        state = struct.unpack_from("<I", head, U.state)[0]
    except MemoryReadError:
        raise ObjectError(addr, "str header not in the image") from None
    if not 0 <= length <= ip.limits.max_str:
        raise ObjectError(addr, f"implausible str length {length}")
    kind = (state >> c["UNICODE_KIND_SHIFT"]) & 7
    if kind not in _ENCODINGS:
        raise ObjectError(addr, f"invalid str kind {kind}")
    compact = (state >> c["UNICODE_COMPACT_BIT"]) & 1
    is_ascii = (state >> c["UNICODE_ASCII_BIT"]) & 1
    if compact:
        data = addr + (U.ascii_data if is_ascii else U.compact_data)
    else:
        data = ip.ptr(addr + U.legacy_data)
    raw = ip.read_within(data, length * kind, addr, "str data")
    if is_ascii and kind == 1:
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise ObjectError(addr, "str flagged ASCII holds non-ASCII bytes") from None
    try:
        return raw.decode(_ENCODINGS[kind], "surrogatepass")
    except UnicodeDecodeError:
        raise ObjectError(addr, "str data is not valid for its kind") from None


def read_bytes(ip: ImageReader, addr: int) -> bytes:
    if ip.fast is not None:  # the compiled reader answers the plain case, None for anything the code below decides
        got = ip.fast.bytes(addr)
        if got is not None:
            return got
    _expect(ip, addr, "bytes")
    size = ip.space.i64(addr + ip.P.varobject.ob_size)
    if not 0 <= size <= ip.limits.max_bytes:
        raise ObjectError(addr, f"implausible bytes size {size}")
    return ip.read_within(addr + ip.P.bytes.ob_sval, size, addr, "bytes data")


def read_bytearray(ip: ImageReader, addr: int) -> bytearray:
    _expect(ip, addr, "bytearray")
    B = ip.P.bytearray
    size = ip.space.i64(addr + ip.P.varobject.ob_size)
    alloc = ip.space.i64(addr + B.ob_alloc)
    if not 0 <= size <= ip.limits.max_bytes or (size and alloc < size):
        raise ObjectError(addr, f"implausible bytearray size {size} (allocated {alloc})")
    if size == 0:
        return bytearray()
    start = ip.ptr(addr + B.ob_start)
    return bytearray(ip.read_within(start, size, addr, "bytearray data"))
