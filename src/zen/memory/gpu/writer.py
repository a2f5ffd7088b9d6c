"""Writing GPU cores in the CUDA driver's layout (zen's cuda-gdb route, and constructed test evidence).

zen's own GPU images use the format the driver writes (`cudacoredump.h`): ELF64 CORE for EM_CUDA,
one `.cudbg.global.N` section per dumped range with `sh_addr` = its device address, an optional
device table with its string table, and a `.zen.acquisition` section holding zen's JSON note (how,
when, from which process, which ranges failed). Readers need no second code path.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from zen.evidence.digest_cache import file_sha256
from zen.memory.gpu.cudacore import tables

ZEN_SECTION = ".zen.acquisition"
SHT_PROGBITS, SHT_STRTAB = 1, 3
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")


@dataclass
class Range:
    """A device range to write: `data` is bytes or the path of a file holding exactly `size` bytes."""

    address: int
    size: int
    data: bytes | str | os.PathLike
    managed: bool = False


class _Out:
    """The output file and the position in it."""

    def __init__(self, fh) -> None:
        self.fh, self.pos = fh, 0

    def write(self, b: bytes | memoryview) -> None:
        self.fh.write(b)
        self.pos += len(b)

    def align(self, n: int = 8) -> None:
        if self.pos % n:
            self.write(b"\0" * (n - self.pos % n))


SHN_LORESERVE, SHN_XINDEX = 0xFF00, 0xFFFF  # ELF: section counts and indexes from here on are in section 0


def write_gpu_core(path: str | os.PathLike, ranges: Iterable[Range], *, devices: list[dict] | None = None,
                   note: dict | None = None) -> str:  # fmt: skip
    """Write a GPU core; returns its sha256. `devices`: device-table entries by field name
    (`devName`/`devType`/`smType` given as strings)."""
    types = tables()["section_types"]
    names = bytearray(b"\0")
    sections: list[tuple] = [(0, 0, 0, 0, 0, 0, 0, 0)]  # name, type, addr, offset, size, link, info, entsize

    def name(s: str) -> int:
        off = len(names)
        names.extend(s.encode() + b"\0")
        return off

    with open(path, "wb") as fh:
        out = _Out(fh)
        out.write(b"\0" * _EHDR.size)
        for k, r in enumerate(sorted(ranges, key=lambda r: r.address)):
            out.align()
            off = out.pos
            _copy(out, r)
            t = types["managed"] if r.managed else types["global"]
            sections.append((name(f".cudbg.global.{k}"), t, r.address, off, r.size, 0, 0, 0))
        if devices:
            strtab = bytearray(b"\0")
            rows = []
            fields = tables()["tables"]["device"]
            fmt = "<" + "".join(code for _, code in fields)
            for d in devices:
                vals = []
                for fname, _ in fields:
                    v = d.get(fname, 0)
                    if isinstance(v, str):
                        vals.append(len(strtab))
                        strtab.extend(v.encode() + b"\0")
                    else:
                        vals.append(int(v))
                rows.append(struct.pack(fmt, *vals))
            out.align()
            dev_index = len(sections)
            sections.append((name(".cudbg.devtbl"), types["devtbl"], 0, out.pos, sum(map(len, rows)), 0, 0, struct.calcsize(fmt)))
            out.write(b"".join(rows))
            out.align()
            sections.append((name(".strtab"), SHT_STRTAB, 0, out.pos, len(strtab), 0, 0, 0))
            out.write(bytes(strtab))
            for k, d in enumerate(devices):
                ctx = d.get("contexts") or []
                if ctx:
                    cf = tables()["tables"]["context"]
                    cfmt = "<" + "".join(code for _, code in cf)
                    blob = b"".join(struct.pack(cfmt, *[int(c.get(f, 0)) for f, _ in cf]) for c in ctx)
                    out.align()
                    sections.append((name(f".cudbg.ctxtbl.dev{k}"), types["ctxtbl"], 0, out.pos, len(blob), dev_index, k,
                                     struct.calcsize(cfmt)))  # fmt: skip
                    out.write(blob)
        if note is not None:
            blob = json.dumps(note, sort_keys=True).encode()
            out.align()
            sections.append((name(ZEN_SECTION), SHT_PROGBITS, 0, out.pos, len(blob), 0, 0, 0))
            out.write(blob)
        shstrndx = len(sections)
        sections.append((name(".shstrtab"), SHT_STRTAB, 0, 0, 0, 0, 0, 0))
        out.align()
        sections[-1] = (sections[-1][0], SHT_STRTAB, 0, out.pos, len(names), 0, 0, 0)
        out.write(bytes(names))
        out.align()
        shoff = out.pos
        shnum, e_shstrndx = len(sections), shstrndx
        if shnum >= SHN_LORESERVE:  # ELF extended numbering: the count in section 0's size, the index in its link
            sections[0] = (0, 0, 0, 0, shnum, shstrndx if shstrndx >= SHN_LORESERVE else 0, 0, 0)
            shnum, e_shstrndx = 0, SHN_XINDEX if shstrndx >= SHN_LORESERVE else shstrndx
        for nm, t, addr, off, size, link, info, ent in sections:
            out.write(_SHDR.pack(nm, t, 0, addr, off, size, link, info, 8 if t else 0, ent))
        ident = b"\x7fELF" + bytes([2, 1, 1, tables()["elf"]["osabi"], 7]) + b"\0" * 7
        header = _EHDR.pack(ident, tables()["elf"]["type_core"], tables()["elf"]["machine"], 1, 0, 0, shoff, 0, 64, 0, 0,
                            64, shnum, e_shstrndx)  # fmt: skip
        fh.seek(0)
        fh.write(header)
    return file_sha256(Path(path))  # the header is written last (it holds the section table's offset)


def _copy(out: _Out, r: Range) -> None:
    if isinstance(r.data, (bytes, bytearray, memoryview)):
        if len(r.data) != r.size:
            raise ValueError(f"range {r.address:#x}: {len(r.data)} bytes given, {r.size} declared")
        out.write(r.data)
        return
    with open(r.data, "rb") as src:
        n = 0
        while True:
            block = src.read(16 << 20)
            if not block:
                break
            n += len(block)
            out.write(block)
    if n != r.size:
        raise ValueError(f"range {r.address:#x}: {n} bytes in {r.data}, {r.size} declared")
