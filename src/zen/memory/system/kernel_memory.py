"""Kernel memory read directly: struct fields at the ISF's offsets, virtual addresses through the page tables.

Why not Volatility's objects here: each field read through them builds an object and translates its address
page by page (tens of µs), and the first `task_struct` object makes Volatility build the ~1,500 types reachable
from it; the task list, the VMA tree and the file paths of the process zen analyses cost more than a second of
a whole-machine recovery that way (bench/results/perf_issue50.md). The offsets come from the same ISF JSON
Volatility loaded, so both read the same bytes; Volatility stays the reference (the tests compare the two on real
guests) and the fallback where this reader lacks a field (`Unsupported`: an older kernel's layout).

Everything read is untrusted: a translation that fails returns None, every walk built on this reader is bounded
by its caller, and nothing here allocates more than the size asked for (at most `MAX_READ`).
"""

from __future__ import annotations

import struct

from zen.memory.system.pagetables import PAGE, PFN_MASK, PHYS_MASK, PRESENT, PROTNONE, PSE

MAX_READ = 1 << 20  # the most one read returns (a command line is at most 64 KiB, a struct a few KiB)
MAX_ANONYMOUS_DEPTH = 8  # nesting of anonymous unions and structs searched for a member
_U64 = struct.Struct("<Q")
_PAGE_SIZES = (1 << 30, 1 << 21)  # a PSE entry at the PDPT, PD level maps this much


class Unsupported(Exception):
    """The ISF lacks a type or member this reader needs: the caller uses Volatility's objects instead."""


class KernelMemory:
    """Fields and bytes of the kernel's virtual memory (and of a process's, given its top table)."""

    def __init__(self, isf: dict, phys_read, dtb: int, aslr: int) -> None:
        self._types: dict = isf.get("user_types") or {}
        self._symbols: dict = isf.get("symbols") or {}
        self._phys_read = phys_read  # (physical address, size) -> bytes or None, never past the image
        self.dtb = dtb & PFN_MASK
        self.aslr = aslr
        self._members: dict[tuple[str, str], tuple[int, dict]] = {}
        self._pages: dict[tuple[int, int], int | None] = {}

    # -- layout --------------------------------------------------------------------------------
    def has(self, type_name: str, member: str) -> bool:
        try:
            self.member(type_name, member)
        except Unsupported:
            return False
        return True

    def offset(self, type_name: str, path: str) -> int:
        """Offset of a member path ("f_path.dentry") from the start of `type_name`."""
        total, current = 0, type_name
        for name in path.split("."):
            off, typ = self.member(current, name)
            total += off
            current = typ.get("name", "")
        return total

    def size(self, type_name: str) -> int:
        t = self._types.get(type_name)
        if not t or not isinstance(t.get("size"), int):
            raise Unsupported(f"the symbols have no type {type_name}")
        return t["size"]

    def member(self, type_name: str, name: str) -> tuple[int, dict]:
        """(offset, type description) of a member, searched into anonymous unions and structs as Volatility does."""
        key = (type_name, name)
        hit = self._members.get(key)
        if hit is None:
            hit = self._find(type_name, name, 0)
            if hit is None:
                raise Unsupported(f"the symbols' {type_name} has no member {name}")
            self._members[key] = hit
        return hit

    def _find(self, type_name: str, name: str, depth: int) -> tuple[int, dict] | None:
        t = self._types.get(type_name)
        fields = t.get("fields") if isinstance(t, dict) else None
        if not isinstance(fields, dict) or depth > MAX_ANONYMOUS_DEPTH:
            return None
        f = fields.get(name)
        if isinstance(f, dict) and isinstance(f.get("offset"), int) and isinstance(f.get("type"), dict):
            return f["offset"], f["type"]
        for f in fields.values():
            if isinstance(f, dict) and f.get("anonymous") and isinstance(f.get("offset"), int):
                inner = self._find(str((f.get("type") or {}).get("name", "")), name, depth + 1)
                if inner is not None:
                    return f["offset"] + inner[0], inner[1]
        return None

    def symbol(self, name: str) -> int:
        """Virtual address of a kernel symbol, KASLR applied."""
        s = self._symbols.get(name)
        if not isinstance(s, dict) or not isinstance(s.get("address"), int):
            raise Unsupported(f"the symbols have no {name}")
        return s["address"] + self.aslr

    def symbol_type(self, name: str) -> str:
        """The type name of a kernel symbol (an anonymous struct's generated name, for `tk_core`)."""
        s = self._symbols.get(name)
        t = s.get("type") if isinstance(s, dict) else None
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise Unsupported(f"the symbols do not give {name}'s type")
        return t["name"]

    def has_symbol(self, name: str) -> bool:
        return isinstance(self._symbols.get(name), dict)

    # -- memory --------------------------------------------------------------------------------
    def translate(self, vaddr: int, dtb: int | None = None) -> int | None:
        """Physical address of a virtual one in the kernel's (or the table `dtb`'s) address space, or None."""
        top = self.dtb if dtb is None else dtb & PFN_MASK
        key = (top, vaddr & ~(PAGE - 1))
        if key not in self._pages:
            self._pages[key] = self._walk(top, key[1])
        base = self._pages[key]
        return None if base is None else base + (vaddr & (PAGE - 1))

    def _walk(self, top: int, vaddr: int) -> int | None:
        """Linux's x86_64 4-level semantics, as pagetables.py and Volatility's LinuxIntel32e read them."""
        if not 0 <= vaddr < 1 << 64:
            return None
        table = top
        for level, shift in enumerate((39, 30, 21, 12)):
            raw = self._phys_read(table + ((vaddr >> shift) & 0x1FF) * 8, 8)
            if raw is None or len(raw) < 8:
                return None
            e = _U64.unpack(raw)[0]
            if not e & (PRESENT | PROTNONE):
                return None
            frame = (e if e & PRESENT else ~e) & PFN_MASK
            if level in (1, 2) and e & PSE:
                span = _PAGE_SIZES[level - 1]
                return (frame & ~(span - 1) & PHYS_MASK) + (vaddr & (span - 1))
            table = frame
        return table

    def read(self, vaddr: int, size: int, dtb: int | None = None) -> bytes | None:
        """`size` bytes at a virtual address, or None when any page of them is not in the image."""
        if not 0 < size <= MAX_READ:
            return None if size else b""
        out = []
        pos, end = vaddr, vaddr + size
        while pos < end:
            n = min(end - pos, PAGE - (pos & (PAGE - 1)))
            p = self.translate(pos, dtb)
            data = None if p is None else self._phys_read(p, n)
            if data is None or len(data) < n:
                return None
            out.append(data)
            pos += n
        return b"".join(out)

    def readable(self, vaddr: int, size: int) -> bool:
        """Whether every page of [vaddr, vaddr+size) translates (Volatility's `is_readable` for a struct)."""
        if not vaddr or size <= 0:
            return False
        page = vaddr & ~(PAGE - 1)
        while page < vaddr + size:
            if self.translate(page) is None:
                return False
            page += PAGE
        return True

    def u64(self, vaddr: int) -> int | None:
        raw = self.read(vaddr, 8)
        return None if raw is None else _U64.unpack(raw)[0]

    def unsigned(self, vaddr: int, size: int) -> int | None:
        raw = self.read(vaddr, size)
        return None if raw is None else int.from_bytes(raw, "little")

    def signed(self, vaddr: int, size: int) -> int | None:
        raw = self.read(vaddr, size)
        return None if raw is None else int.from_bytes(raw, "little", signed=True)

    def field(self, base: int, type_name: str, path: str, size: int = 8, signed: bool = False) -> int | None:
        """An integer member (`path` in `type_name`) of the struct at `base`, or None when unreadable."""
        at = base + self.offset(type_name, path)
        return self.signed(at, size) if signed else self.unsigned(at, size)

    def string(self, vaddr: int, most: int) -> str | None:
        """A C string of at most `most` bytes, decoded as Volatility decodes it (UTF-8, ending at NUL or the first
        byte that does not decode); reads the pages that translate, stops at the first that does not."""
        data = b""
        pos, end = vaddr, vaddr + most
        while pos < end:
            n = min(end - pos, PAGE - (pos & (PAGE - 1)))
            chunk = self.read(pos, n)
            if chunk is None:
                break
            data += chunk
            if b"\x00" in chunk:
                break
            pos += n
        if not data:
            return None
        text = data.decode("utf-8", errors="replace")
        for stop in ("\ufffd", "\x00"):
            i = text.find(stop)
            if i >= 0:
                text = text[:i]
        return text
