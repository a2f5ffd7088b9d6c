"""ELF dynamic symbols of a mapped module, read from the image first and from disk second.

The image is the evidence, so symbols come from the module's own mapped ELF header, program
headers and PT_DYNAMIC (DT_SYMTAB/DT_STRTAB/DT_GNU_HASH) when those pages are present. glibc
rewrites .dynamic entries to absolute addresses at load time, so every DT_* pointer is accepted
either relative to the load bias or already relocated. When the pages are missing (and could not
be filled from disk) we parse the file itself with pyelftools, which also gives section headers
(`.PyRuntime`) that are never mapped.

The symbol table is decoded with one numpy structured view; nothing loops over bytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

from zen.memory.space import AddressSpace
from zen.runtime.errors import MemoryReadError

DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT = 0, 4, 5, 6, 10, 11
DT_GNU_HASH = 0x6FFFFEF5
PT_LOAD, PT_DYNAMIC = 1, 2
MAX_DYN = 4096
MAX_SYMBOLS = 1 << 20
SYM_DTYPE = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")])


@dataclass
class ModuleSymbols:
    """Defined dynamic symbols of one module, as absolute addresses in the imaged process."""

    path: str
    base: int  # address where file offset 0 is mapped
    bias: int  # load bias: absolute address = st_value + bias
    symbols: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    sections: dict[str, int] = field(default_factory=dict)  # from disk only (never mapped)
    source: str = "image"  # "image" or "disk"

    def get(self, name: str) -> int | None:
        return self.symbols.get(name)


def module_base(space: AddressSpace, path: str) -> int | None:
    """Lowest address at which `path` is mapped from file offset 0."""
    bases = [r.start for r in space.regions if r.path == path and r.offset == 0]
    return min(bases) if bases else None


def symbols_from_image(space: AddressSpace, path: str, base: int) -> ModuleSymbols:
    """Parse the dynamic symbol table of the module mapped at `base` from the image's bytes."""
    ehdr = space.read(base, 64)
    if ehdr[:4] != b"\x7fELF" or ehdr[4] != 2:
        raise MemoryReadError(base, 64, "no 64-bit ELF header at module base")
    (e_phoff,) = struct.unpack_from("<Q", ehdr, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", ehdr, 54)
    if e_phentsize != 56 or not 0 < e_phnum < 512:
        raise MemoryReadError(base, 64, "implausible program header table")
    ph = space.read(base + e_phoff, 56 * e_phnum)
    loads, dyn = [], None
    for i in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr, _pa, p_filesz, p_memsz, _al = struct.unpack_from("<IIQQQQQQ", ph, 56 * i)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset))
        elif p_type == PT_DYNAMIC:
            dyn = (p_vaddr, p_memsz)
    if not loads or dyn is None:
        raise MemoryReadError(base, 64, "module has no PT_LOAD or PT_DYNAMIC")
    first_vaddr, first_off = min(loads)
    bias = base - (first_vaddr - first_off)
    raw = space.read(bias + dyn[0], min(dyn[1], 16 * MAX_DYN))
    tags: dict[int, int] = {}
    for i in range(0, len(raw) - 15, 16):
        tag, val = struct.unpack_from("<qQ", raw, i)
        if tag == DT_NULL:
            break
        tags.setdefault(tag, val)

    def addr(v: int) -> int:
        return v if v >= bias and bias else v + bias

    if DT_SYMTAB not in tags or DT_STRTAB not in tags:
        raise MemoryReadError(base, 64, "module has no dynamic symbol table")
    symtab, strtab = addr(tags[DT_SYMTAB]), addr(tags[DT_STRTAB])
    strsz = tags.get(DT_STRSZ, 0)
    count = _symbol_count(space, tags, addr, symtab, strtab)
    syms = np.frombuffer(space.read(symtab, count * SYM_DTYPE.itemsize), dtype=SYM_DTYPE)
    strings = space.read(strtab, strsz) if strsz else b""
    out = ModuleSymbols(path, base, bias, source="image")
    _collect(out, syms, strings, bias)
    return out


def _symbol_count(space: AddressSpace, tags: dict[int, int], addr, symtab: int, strtab: int) -> int:
    """Number of dynamic symbols: DT_HASH's nchain, else the GNU hash chains, else the gap to DT_STRTAB."""
    if DT_HASH in tags:
        nchain = struct.unpack("<I", space.read(addr(tags[DT_HASH]) + 4, 4))[0]
        if 0 < nchain < MAX_SYMBOLS:
            return nchain
    if DT_GNU_HASH in tags:
        h = addr(tags[DT_GNU_HASH])
        nbuckets, symoffset, bloom_size, _shift = struct.unpack("<IIII", space.read(h, 16))
        if 0 < nbuckets < MAX_SYMBOLS and bloom_size < MAX_SYMBOLS:
            buckets_at = h + 16 + 8 * bloom_size
            buckets = np.frombuffer(space.read(buckets_at, 4 * nbuckets), dtype="<u4")
            last = int(buckets.max()) if buckets.size else 0
            if last < symoffset:
                return symoffset
            chains_at = buckets_at + 4 * nbuckets
            idx = last
            for _ in range(MAX_SYMBOLS):
                word = struct.unpack("<I", space.read(chains_at + 4 * (idx - symoffset), 4))[0]
                if word & 1:
                    return idx + 1
                idx += 1
    if strtab > symtab and (strtab - symtab) % SYM_DTYPE.itemsize == 0:
        return min((strtab - symtab) // SYM_DTYPE.itemsize, MAX_SYMBOLS)
    raise MemoryReadError(symtab, 0, "cannot size the dynamic symbol table")


def _collect(out: ModuleSymbols, syms: np.ndarray, strings: bytes, bias: int) -> None:
    defined = syms[(syms["shndx"] != 0) & (syms["value"] != 0)]
    for rec in defined:
        start = int(rec["name"])
        end = strings.find(b"\0", start)
        if start >= len(strings) or end < 0:
            continue
        name = strings[start:end].decode("ascii", "replace")
        out.symbols.setdefault(name, int(rec["value"]) + bias)
        out.sizes.setdefault(name, int(rec["size"]))


def symbols_from_disk(path: str, base: int, file_root: str | None = None) -> ModuleSymbols | None:
    """Parse the module's file with pyelftools (dynsym, symtab if present, section addresses)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    local = os.path.join(file_root, path.lstrip("/")) if file_root else path
    if not os.path.isfile(local):
        return None
    try:
        with open(local, "rb") as fh:
            elf = ELFFile(fh)
            loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            if not loads:
                return None
            first = min(loads, key=lambda s: s["p_vaddr"])
            bias = base - (first["p_vaddr"] - first["p_offset"])
            out = ModuleSymbols(path, base, bias, source="disk")
            for sec in elf.iter_sections():
                if sec.name:
                    out.sections.setdefault(sec.name, sec["sh_addr"] + bias)
                if isinstance(sec, SymbolTableSection):
                    for sym in sec.iter_symbols():
                        if sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
                            out.symbols.setdefault(sym.name, sym["st_value"] + bias)
                            out.sizes.setdefault(sym.name, sym["st_size"])
            return out
    except (ELFError, OSError, ValueError, struct.error):
        return None


def load_symbols(space: AddressSpace, path: str, file_root: str | None = None) -> ModuleSymbols | None:
    """Symbols of a mapped module: from the image when its pages are there, else from disk."""
    base = module_base(space, path)
    if base is None:
        return None
    try:
        return symbols_from_image(space, path, base)
    except MemoryReadError:
        return symbols_from_disk(path, base, file_root)
