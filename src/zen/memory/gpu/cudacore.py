"""NVIDIA CUDA GPU core dumps: the device side of a CUDA process's memory.

A GPU core (the driver's user-triggered or exception core dump, `*.nvcudmp`) is an ELF64 file of type
CORE for machine EM_CUDA (190) with no program headers: everything is in sections named `.cudbg.*`
(NVIDIA's public `cudacoredump.h`, from cuda-gdb). Device global memory is in `.cudbg.global.N`
sections whose `sh_addr` is the device virtual address; the device, context and module tables
describe what was dumped. zen's cuda-gdb route writes the same layout (`zen.acquire.gpu`), so both
kinds of evidence are read alike.

The file is evidence, hence hostile: the section header table is read in one bulk numpy view and
every count, size and offset is checked against the file before use; sections that run past the
end or overlap another are dropped with a problem; a file that cannot be a GPU core is an
`ImageError` (one line, exit 2). Table layouts are data (`cudacore_tables.json`): a driver that
appends fields to an entry only makes sh_entsize larger, and fields past the entry size are absent.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

from zen.runtime.errors import ImageError

MAX_SECTIONS = 1 << 24  # a full dump of a big GPU has ~10^6 sections (per-lane registers); refuse absurd counts
MAX_ENTRIES = 1 << 16  # entries of one device/context/module/grid table
MAX_NAME = 256
MAX_LISTED = 10  # problem lines of one kind; the rest are counted in one line
MAX_RANGES_JSON = 1000  # segments listed one by one in `to_json` (all are counted; `zen info --json`)

_SHDR = np.dtype([("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"), ("offset", "<u8"),
                  ("size", "<u8"), ("link", "<u4"), ("info", "<u4"), ("addralign", "<u8"), ("entsize", "<u8")])  # fmt: skip
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")


@cache
def tables() -> dict:
    """The section types and table layouts of `cudacore_tables.json`."""
    return json.loads((Path(__file__).with_name("cudacore_tables.json")).read_text())


@dataclass(frozen=True)
class Segment:
    """One dumped range of device memory: [address, address + size) is at file offset `offset`."""

    index: int  # section index
    name: str
    address: int
    size: int
    offset: int
    managed: bool = False

    @property
    def end(self) -> int:
        return self.address + self.size

    def to_json(self) -> dict:
        return {"section": self.name, "address": f"{self.address:#x}", "size": self.size,
                **({"managed": True} if self.managed else {})}  # fmt: skip


@dataclass
class GpuContext:
    index: int
    fields: dict
    modules: int = 0
    images: int = 0

    def to_json(self) -> dict:
        f = self.fields
        return {"index": self.index, "context": f"{f.get('contextId', 0):#x}", "host_tid": f.get("tid"),
                "global_window": f"{f.get('globalWindowBase', 0):#x}", "modules": self.modules,
                "images": self.images}  # fmt: skip


@dataclass
class GpuDevice:
    index: int  # position in the device table: the CUDA ordinal the process saw (torch's cuda:N)
    fields: dict
    name: str = ""
    type: str = ""
    sm_type: str = ""
    contexts: list[GpuContext] = field(default_factory=list)
    grids: int = 0
    sms: int = 0

    def to_json(self) -> dict:
        f = self.fields
        return {"index": self.index, "name": self.name, "type": self.type, "sm_type": self.sm_type,
                "device_id": f.get("devId"), "pci": f"{f.get('pciBusId', 0):02x}:{f.get('pciDevId', 0):02x}",
                "sm_count": f.get("numSMs"), "sm_version": f"{f.get('smMajor', 0)}.{f.get('smMinor', 0)}",
                "grids_running": self.grids, "contexts": [c.to_json() for c in self.contexts]}  # fmt: skip


@dataclass
class CudaCore:
    """What a GPU core holds, parsed and checked; the bytes stay in the file."""

    path: Path
    file_size: int
    devices: list[GpuDevice]
    segments: list[Segment]
    meta: dict
    problems: list[str]
    sections: int
    zen_note: dict | None = None  # zen's own acquisition note (`.zen.acquisition`), in cores zen wrote

    @property
    def global_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def generation_flags(self) -> list[str]:
        flags = self.meta.get("flags")
        if not isinstance(flags, int):
            return []
        return [name for name, bit in tables()["generation_flags"].items() if flags & bit]

    def to_json(self) -> dict:
        return {"kind": "cuda-gpu-core", "path": str(self.path), "size": self.file_size, "sections": self.sections,
                "devices": [d.to_json() for d in self.devices], "meta": self.meta_json(),
                "global_memory": {"segments": len(self.segments), "bytes": self.global_bytes,
                                  "ranges": [s.to_json() for s in self.segments[:MAX_RANGES_JSON]],
                                  **({"ranges_listed": MAX_RANGES_JSON} if len(self.segments) > MAX_RANGES_JSON else {})},
                "problems": list(self.problems), **({"zen_acquisition": self.zen_note} if self.zen_note else {})}  # fmt: skip

    def meta_json(self) -> dict:
        m = dict(self.meta)
        if "driverVersionMajor" in m:
            m["driver"] = f"{m['driverVersionMajor']}.{m.get('driverVersionMinor', 0)}"
        if "cudaDriverVersionMajor" in m:
            m["cuda"] = f"{m['cudaDriverVersionMajor']}.{m.get('cudaDriverVersionMinor', 0)}"
        if "flags" in m:
            m["flag_names"] = self.generation_flags()
        return m


def is_cuda_core_header(head: bytes) -> bool:
    """True for the first bytes of an ELF64 little-endian core of machine EM_CUDA."""
    return (len(head) >= 20 and head[:4] == b"\x7fELF" and head[4] == 2 and head[5] == 1
            and struct.unpack_from("<HH", head, 16) == (tables()["elf"]["type_core"], tables()["elf"]["machine"]))  # fmt: skip


def parse(path: Path, data: mmap.mmap | bytes, file_size: int) -> CudaCore:
    """Parse a GPU core held in `data` (an mmap of the plain file); raises ImageError if it is not one."""
    if file_size < _EHDR.size:
        raise ImageError(f"truncated GPU core {path}: {file_size} bytes, less than an ELF header")
    ident, e_type, e_machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx = _EHDR.unpack_from(data, 0)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        raise ImageError(f"{path} is not a 64-bit little-endian ELF file")
    if e_machine != tables()["elf"]["machine"] or e_type != tables()["elf"]["type_core"]:
        raise ImageError(
            f"{path} is an ELF file but not a CUDA GPU core (machine {e_machine}, type {e_type})",
            "a GPU core is written by the CUDA driver (CUDA_ENABLE_USER_TRIGGERED_COREDUMP) or `zen acquire`",
        )
    if shentsize != 64:
        raise ImageError(f"corrupt GPU core {path}: section header size {shentsize}, expected 64")
    if shoff == 0:
        raise ImageError(f"corrupt GPU core {path}: it has no section header table")
    if shoff >= file_size:
        raise ImageError(f"truncated GPU core {path}: its section header table (offset {shoff:,}) is not in the "
                         f"{file_size:,}-byte file (at least {shoff + max(shnum, 1) * 64 - file_size:,} bytes missing)",
                         "the dump was cut short: collect it again, or use a complete copy")  # fmt: skip
    if shnum == 0 or shstrndx == 0xFFFF:  # extended numbering: count in section 0's sh_size, index in its sh_link
        if shoff + 64 > file_size:
            raise ImageError(f"truncated GPU core {path}: section header table runs past the end of the file")
        if shnum == 0:
            shnum = struct.unpack_from("<Q", data, shoff + 32)[0]
        if shstrndx == 0xFFFF:
            shstrndx = struct.unpack_from("<I", data, shoff + 40)[0]
    if shnum > MAX_SECTIONS:
        raise ImageError(f"corrupt GPU core {path}: {shnum:,} sections (more than {MAX_SECTIONS:,})")
    if shoff + shnum * 64 > file_size:
        raise ImageError(f"truncated GPU core {path}: {shnum:,} section headers at offset {shoff:,} run past the end "
                         f"of the {file_size:,}-byte file ({shoff + shnum * 64 - file_size:,} bytes missing)",
                         "the dump was cut short: collect it again, or use a complete copy")  # fmt: skip
    sh = np.frombuffer(data, dtype=_SHDR, count=shnum, offset=shoff)
    problems: list[str] = []
    names = _Names(path, data, file_size, sh, shstrndx)
    types = tables()["section_types"]
    # sections whose bytes are used must lie in the file (offset + size cannot overflow: both < 2^64, sum in Python)
    inside = (sh["offset"] <= file_size) & (sh["size"] <= file_size) & (sh["offset"] + sh["size"] <= file_size)
    inside &= sh["offset"] <= sh["offset"] + sh["size"]  # no uint64 wrap-around
    segments = _segments(sh, inside, names, types, problems)
    strtab = _strtab(data, sh, inside, names)
    devices = _devices(data, sh, inside, names, types, strtab, problems)
    meta = {}
    for i in np.flatnonzero(sh["type"] == types["meta"])[:1]:
        rows = _rows(data, sh[i], bool(inside[i]), "meta", problems, names.get(i))
        if rows:
            meta = rows[0]
            meta["generator"] = _string(strtab, meta.pop("generatorName", None))
    return CudaCore(Path(path), file_size, devices, segments, meta, problems, int(shnum), _zen_note(data, sh, inside, names))


def _zen_note(data, sh: np.ndarray, inside: np.ndarray, names: _Names) -> dict | None:
    # zen writes its note among the first sections; a core with 10^6 others is not searched name by name
    for i in np.flatnonzero((sh["type"] == 1) & inside & (sh["size"] <= 16 << 20))[:MAX_NOTE_SCAN]:  # SHT_PROGBITS
        if names.get(int(i)) == ".zen.acquisition":
            off, size = int(sh[i]["offset"]), int(sh[i]["size"])
            if size > MAX_NOTE:
                return {"error": f"the .zen.acquisition section holds {size:,} bytes (zen writes under {MAX_NOTE:,})"}
            try:
                note = json.loads(bytes(data[off : off + size]))
            except (ValueError, RecursionError):  # a hostile note nested 200,000 deep exhausts the parser's recursion
                return {"error": "the .zen.acquisition section is not valid JSON (or nested too deep)"}
            if not isinstance(note, dict):
                return {"error": "the .zen.acquisition section is not a JSON object"}
            if _depth(note) > MAX_NOTE_DEPTH:
                return {"error": f"the .zen.acquisition section is nested deeper than {MAX_NOTE_DEPTH} levels"}
            return note
    return None


MAX_NOTE = 1 << 20  # bytes of zen's acquisition note (real notes: a few KB)
MAX_NOTE_SCAN = 4096  # PROGBITS sections looked at for the note
MAX_NOTE_DEPTH = 32  # nesting of the note (real notes: 4); later readers print it recursively


def _depth(value, limit: int = MAX_NOTE_DEPTH) -> int:
    """Nesting depth of a parsed JSON value, walked without recursion, stopping past `limit`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(v, dict):
            stack += [(x, d + 1) for x in v.values()]
        elif isinstance(v, list):
            stack += [(x, d + 1) for x in v]
    return deepest


class _Names:
    """Section names from the section-name string table, decoded only when asked for."""

    def __init__(self, path: Path, data, file_size: int, sh: np.ndarray, shstrndx: int) -> None:
        self._blob = b""
        if 0 < shstrndx < len(sh):
            off, size = int(sh[shstrndx]["offset"]), int(sh[shstrndx]["size"])
            if off + size <= file_size:
                self._blob = bytes(data[off : off + min(size, 64 << 20)])
        self._sh = sh

    def get(self, i: int) -> str:
        start = int(self._sh[i]["name"])
        if start >= len(self._blob):
            return f"section {i}"
        end = self._blob.find(b"\0", start, start + MAX_NAME)
        return self._blob[start : end if end >= 0 else start + MAX_NAME].decode("ascii", "replace")


def _segments(sh: np.ndarray, inside: np.ndarray, names: _Names, types: dict, problems: list[str]) -> list[Segment]:
    """The global-memory segments, sorted by address; a segment that runs past the file, wraps past 2^64 or overlaps
    one before it is left out. Vectorized, and each kind of problem is reported for the first few sections and then
    counted: a core declaring 10^6 sections costs numpy passes and a few lines, not 10^6 Python steps and lines
    (issue 49.2)."""
    mem = np.flatnonzero((sh["type"] == types["global"]) | (sh["type"] == types["managed"]))
    mem = mem[np.argsort(sh["addr"][mem], kind="stable")]
    addr, size = sh["addr"][mem], sh["size"][mem]
    outside = ~inside[mem]
    wraps = ~outside & (size > np.uint64(2**64 - 1) - addr)
    usable = ~outside & ~wraps & (size > 0)
    ends = np.where(usable, addr + np.where(usable, size, 0), 0).astype(np.uint64)
    before = np.concatenate(([np.uint64(0)], np.maximum.accumulate(ends)[:-1])) if len(ends) else ends
    overlaps = usable & (addr < before)
    for mask, why in ((outside, "runs past the end of the file"), (wraps, "wraps past 2^64"),
                      (overlaps, "overlaps a segment before it")):  # fmt: skip
        bad = mem[mask]
        for i in bad[:MAX_LISTED]:
            s = sh[i]
            problems.append(f"{names.get(int(i))} ({int(s['addr']):#x}, {int(s['size']):,} bytes) {why}: left out")
        if len(bad) > MAX_LISTED:
            problems.append(f"{len(bad) - MAX_LISTED:,} more global-memory sections {why}: left out")
    keep = mem[usable & ~overlaps]
    return [Segment(int(i), names.get(int(i)), int(sh[i]["addr"]), int(sh[i]["size"]), int(sh[i]["offset"]),
                    int(sh[i]["type"]) == types["managed"]) for i in keep]  # fmt: skip


def _strtab(data, sh: np.ndarray, inside: np.ndarray, names: _Names) -> bytes:
    for i in np.flatnonzero(sh["type"] == 3):  # SHT_STRTAB
        if inside[i] and names.get(int(i)) == ".strtab":
            off, size = int(sh[i]["offset"]), int(sh[i]["size"])
            return bytes(data[off : off + min(size, 64 << 20)])
    return b""


def _string(strtab: bytes, index) -> str:
    if not isinstance(index, int) or index >= len(strtab):
        return ""
    end = strtab.find(b"\0", index, index + MAX_NAME)
    return strtab[index : end if end >= 0 else index + MAX_NAME].decode("utf-8", "replace")


def _rows(data, s, inside: bool, table: str, problems: list[str], name: str) -> list[dict]:
    """The entries of one table section as dicts of the fields that fit in its entry size."""
    fields = tables()["tables"][table]
    size, entsize = int(s["size"]), int(s["entsize"]) or int(s["size"])
    if not inside:
        problems.append(f"{name} runs past the end of the file: not read")
        return []
    if size == 0:
        return []
    if entsize <= 0 or size % entsize:
        problems.append(f"{name}: {size:,} bytes are not a whole number of {entsize}-byte entries: not read")
        return []
    count = size // entsize
    if count > MAX_ENTRIES:
        problems.append(f"{name}: {count:,} entries (more than {MAX_ENTRIES:,}): not read")
        return []
    fmt, names, pos = "<", [], 0
    for fname, code in fields:
        n = struct.calcsize(code)
        if pos + n > entsize:
            break
        fmt += code
        names.append(fname)
        pos += n
    if not names:
        problems.append(f"{name}: entries of {entsize} bytes hold no known field: not read")
        return []
    st, base = struct.Struct(fmt), int(s["offset"])
    return [dict(zip(names, st.unpack_from(data, base + k * entsize))) for k in range(count)]


def _devices(data, sh: np.ndarray, inside: np.ndarray, names: _Names, types: dict, strtab: bytes,
             problems: list[str]) -> list[GpuDevice]:  # fmt: skip
    dev_idx = np.flatnonzero(sh["type"] == types["devtbl"])
    if len(dev_idx) == 0:
        problems.append("no device table (.cudbg.devtbl): devices unknown")
        return []
    devtbl = int(dev_idx[0])
    rows = _rows(data, sh[devtbl], bool(inside[devtbl]), "device", problems, names.get(devtbl))
    devices = [GpuDevice(k, f, _string(strtab, f.get("devName")), _string(strtab, f.get("devType")),
                         _string(strtab, f.get("smType"))) for k, f in enumerate(rows)]  # fmt: skip
    ctx_sections: dict[int, GpuDevice] = {}
    strays = 0
    for i in np.flatnonzero(sh["type"] == types["ctxtbl"])[:MAX_ENTRIES]:
        dev = int(sh[i]["info"])
        if int(sh[i]["link"]) != devtbl or dev >= len(devices):
            strays += 1
            if strays <= MAX_LISTED:
                problems.append(f"{names.get(int(i))} names device {dev}, not in the device table: ignored")
            continue
        rows = _rows(data, sh[i], bool(inside[i]), "context", problems, names.get(int(i)))
        devices[dev].contexts = [GpuContext(k, f) for k, f in enumerate(rows)]
        ctx_sections[int(i)] = devices[dev]
    if strays > MAX_LISTED:
        problems.append(f"{strays - MAX_LISTED:,} more context tables name devices not in the device table: ignored")
    mod_sections: dict[int, GpuContext] = {}
    for i in np.flatnonzero(sh["type"] == types["modtbl"])[:MAX_ENTRIES]:
        dev, ctx = ctx_sections.get(int(sh[i]["link"])), int(sh[i]["info"])
        if dev is None or ctx >= len(dev.contexts):
            continue
        entsize = int(sh[i]["entsize"]) or 8
        dev.contexts[ctx].modules = min(int(sh[i]["size"]) // entsize, MAX_ENTRIES)
        mod_sections[int(i)] = dev.contexts[ctx]
    for i in np.flatnonzero(sh["type"] == types["relfimg"]):
        c = mod_sections.get(int(sh[i]["link"]))
        if c is not None:
            c.images += 1
    for i in np.flatnonzero((sh["type"] == types["gridtbl"]) | (sh["type"] == types["smtbl"])):
        dev = int(sh[i]["info"])
        if dev < len(devices):
            n = int(sh[i]["size"]) // max(int(sh[i]["entsize"]), 1)
            if int(sh[i]["type"]) == types["gridtbl"]:
                devices[dev].grids = n
            else:
                devices[dev].sms = n
    return devices
