"""Readers for int (arbitrary precision), bool, float and complex.

CPython ints are arrays of 30-bit digits (15-bit on some builds: both measured). Up to 3.11 the
sign and digit count share `ob_size`; 3.12+ pack them into `lv_tag`. Digits are decoded with one
numpy-free pass over at most `max_items` digits.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from zen.runtime.errors import ObjectError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


def read_int(ip: ImageReader, addr: int) -> int:
    kind = ip.kind(addr)
    if kind not in ("int", "bool"):
        raise ObjectError(addr, f"expected an int object, found {kind}")
    c = ip.P.constants
    L = ip.P.long
    if c.get("LONG_REPR", 0) == 0:
        size = ip.space.i64(addr + L.ob_size)
        negative, ndigits = size < 0, abs(size)
    else:
        tag = ip.space.u64(addr + L.lv_tag)
        sign = tag & c["LONG_TAG_SIGN_MASK"]
        ndigits = tag >> c["LONG_TAG_SHIFT"]
        negative = sign == c["LONG_TAG_NEG"]
        if sign == c["LONG_TAG_ZERO"]:
            ndigits = 0
    if ndigits > ip.limits.max_items:
        raise ObjectError(addr, f"implausible int size of {ndigits} digits")
    if ndigits == 0:
        return 0
    width = c["LONG_SIZEOF_DIGIT"]
    bits = c["LONG_BITS_PER_DIGIT"]
    raw = ip.read_within(addr + L.ob_digit, ndigits * width, addr, "int digits")
    digits = struct.unpack(f"<{ndigits}{'I' if width == 4 else 'H'}", raw)
    if any(d >> bits for d in digits):
        raise ObjectError(addr, "int digit out of range")
    value = 0
    for d in reversed(digits):
        value = (value << bits) | d
    return -value if negative else value


def read_bool(ip: ImageReader, addr: int) -> bool:
    if addr == ip.wk.singletons.get("True"):
        return True
    if addr == ip.wk.singletons.get("False"):
        return False
    return bool(read_int(ip, addr))


def read_float(ip: ImageReader, addr: int) -> float:
    kind = ip.kind(addr)
    if kind != "float":
        raise ObjectError(addr, f"expected a float object, found {kind}")
    return struct.unpack("<d", ip.space.read(addr + ip.P.float.ob_fval, 8))[0]


def read_complex(ip: ImageReader, addr: int) -> complex:
    kind = ip.kind(addr)
    if kind != "complex":
        raise ObjectError(addr, f"expected a complex object, found {kind}")
    C = ip.P.complex
    return complex(
        struct.unpack("<d", ip.space.read(addr + C.real, 8))[0], struct.unpack("<d", ip.space.read(addr + C.imag, 8))[0]
    )
