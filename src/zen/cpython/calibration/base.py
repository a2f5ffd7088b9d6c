"""Shared parts of the calibrator: safe ctypes memory access and the result bookkeeping.

Standard library only: this package is executed by interpreters other than zen's own.
"""

from __future__ import annotations

import ctypes
import struct

FORMAT = 1
PTR = 8


class CalibrationFailed(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Safe raw memory access in this process
# --------------------------------------------------------------------------------------------
class Memory:
    """ctypes reads that refuse addresses outside this process's readable mappings."""

    def __init__(self) -> None:
        self._maps: list[tuple[int, int]] = []
        self.refresh()

    def refresh(self) -> None:
        maps = []
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 2 or parts[1][0] != "r":
                    continue
                if len(parts) > 5 and parts[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                maps.append((lo, hi))
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(maps):  # a read may straddle two adjacent mappings (the heap splits as it grows)
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        self._maps = merged

    def readable(self, addr: int, size: int) -> bool:
        if addr <= 0 or size < 0:
            return False
        for attempt in (0, 1):
            for lo, hi in self._maps:
                if lo <= addr and addr + size <= hi:
                    return True
            if attempt == 0:
                self.refresh()
        return False

    def raw(self, addr: int, size: int) -> bytes:
        if not self.readable(addr, size):
            raise CalibrationFailed(f"refusing to read unmapped memory at {addr:#x}")
        return ctypes.string_at(addr, size)

    def try_raw(self, addr: int, size: int) -> bytes | None:
        return ctypes.string_at(addr, size) if self.readable(addr, size) else None

    def word(self, addr: int) -> int:
        return struct.unpack("<Q", self.raw(addr, 8))[0]

    def words(self, addr: int, n: int) -> tuple[int, ...]:
        return struct.unpack(f"<{n}Q", self.raw(addr, 8 * n))

    def find_word(self, addr: int, size: int, value: int, start: int = 0) -> list[int]:
        data = self.raw(addr, size)
        return [o for o in range(start, size - 7, 8) if struct.unpack_from("<Q", data, o)[0] == value]

    def find_int(self, addr: int, size: int, value: int, width: int = 4, start: int = 0, signed: bool = True) -> list[int]:
        data = self.raw(addr, size)
        fmt = {1: "b", 2: "h", 4: "i", 8: "q"}[width]
        if not signed:
            fmt = fmt.upper()
        return [o for o in range(start, size - width + 1, width) if struct.unpack_from("<" + fmt, data, o)[0] == value]

    def cstring(self, addr: int, limit: int = 256) -> bytes | None:
        out = b""
        while len(out) < limit:
            chunk = self.try_raw(addr + len(out), 16)
            if chunk is None:
                return None
            i = chunk.find(b"\0")
            if i >= 0:
                return out + chunk[:i]
            out += chunk
        return None


def one(name: str, candidates) -> int:
    """The single candidate, or a clear failure naming the field."""
    cands = sorted(set(candidates))
    if len(cands) != 1:
        raise CalibrationFailed(f"{name}: expected one candidate offset, found {cands}")
    return cands[0]


def common(name: str, *lists) -> int:
    """The single offset present in every sample's candidate list."""
    sets = [set(x) for x in lists]
    inter = set.intersection(*sets) if sets else set()
    return one(name, inter)


class CalibratorBase:
    """Collects measured fields, sizes, constants and their provenance."""

    def __init__(self) -> None:
        self.m = Memory()
        self.structs: dict[str, dict] = {}
        self.provenance: dict[str, str] = {}
        self.constants: dict[str, int] = {}
        self.checks: list[str] = []

    # -- bookkeeping ------------------------------------------------------------------------
    def field(self, struct_name: str, field: str, offset: int, ftype: str, how: str = "measured") -> int:
        s = self.structs.setdefault(struct_name, {"fields": {}})
        s["fields"][field] = [offset, ftype]
        self.provenance[f"{struct_name}.{field}"] = how
        return offset

    def size(self, struct_name: str, size: int, how: str = "measured") -> None:
        self.structs.setdefault(struct_name, {"fields": {}})["size"] = size
        self.provenance[f"{struct_name}.<size>"] = how

    def off(self, struct_name: str, field: str) -> int:
        return self.structs[struct_name]["fields"][field][0]

    def check(self, cond: bool, what: str) -> None:
        if not cond:
            raise CalibrationFailed(f"self-check failed: {what}")
        self.checks.append(what)
