"""Find the CPython interpreter in an address space: version, `_PyRuntime`, the `type` type.

No address is hard-coded; every fact is located from the image and the method is recorded so a
report can say how it was found. In order of preference:

* dynamic symbols of the mapped libpython or python executable (from the image, else its file):
  `Py_Version` (3.11+) gives the exact version, `_PyRuntime` and `PyType_Type` their addresses;
* the `.PyRuntime` ELF section (3.10+) from the file's section headers;
* before 3.11 (no `Py_Version`): the `sys.version` banner in the module's data;
* the `xdebugpy` cookie that starts `_PyRuntime` in 3.13+, followed by PY_VERSION_HEX;
* the self-referential `type` object (its ob_type points to itself) in the module's data;
* the module's file name (`libpython3.11.so`) as a last resort for the minor version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from zen.cpython.layout.symbols import ModuleSymbols, load_symbols, symbols_from_disk
from zen.memory.space import AddressSpace
from zen.runtime.errors import InterpreterNotFound, MemoryReadError

COOKIE = int.from_bytes(b"xdebugpy", "little")
_NAME_RE = re.compile(r"(?:^|/)(?:lib)?python(\d)\.?(\d+)?[^/]*$")
LEVELS = {0xA: "a", 0xB: "b", 0xC: "rc", 0xF: ""}


def version_from_hex(hv: int) -> str:
    major, minor, micro = hv >> 24, (hv >> 16) & 0xFF, (hv >> 8) & 0xFF
    level, serial = (hv >> 4) & 0xF, hv & 0xF
    suffix = LEVELS.get(level, "?")
    return f"{major}.{minor}.{micro}" + (f"{suffix}{serial}" if suffix else "")


def plausible_hexversion(hv: int) -> bool:
    return hv >> 24 == 3 and 0 <= (hv >> 16) & 0xFF < 40 and (hv >> 4) & 0xF in LEVELS


@dataclass
class InterpreterInfo:
    """Where the interpreter is and how we know."""

    version: str
    minor: str
    hexversion: int | None
    runtime: int | None
    type_type: int | None
    module_path: str | None
    symbols: dict[str, int] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    static_build: bool = False
    debug_offsets: dict | None = None  # 3.13+: the image's own offsets table, cross-checked with the profile

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "minor": self.minor,
            "hexversion": self.hexversion,
            "runtime": self.runtime,
            "type_type": self.type_type,
            "module": self.module_path,
            "static_build": self.static_build,
            "how": dict(self.how),
            "warnings": list(self.warnings),
            "debug_offsets": self.debug_offsets,
        }


def candidate_modules(space: AddressSpace) -> list[str]:
    """Mapped files that may hold the interpreter: libpython first, then python executables."""
    paths = []
    for r in space.regions:
        if r.offset == 0 and r.file_backed and r.path not in paths:
            paths.append(r.path)
    lib = [p for p in paths if "libpython" in p.rsplit("/", 1)[-1]]
    exe = [p for p in paths if p not in lib and _NAME_RE.search(p)]
    return lib + exe


def _minor_from_name(path: str) -> str | None:
    m = _NAME_RE.search(path)
    if m and m.group(2):
        return f"{m.group(1)}.{m.group(2)}"
    return None


def _find_cookie(space: AddressSpace, syms: ModuleSymbols | None) -> tuple[int, int] | None:
    """(address, hexversion) of a `_Py_DebugOffsets` cookie, preferring the python module's data."""
    from zen.memory.scan import find_u64, writable_chunks

    chunks = writable_chunks(space)
    if syms is not None:
        own = [c for c in chunks if (r := space.region_of(c.start)) is not None and r.path == syms.path]
        chunks = own + [c for c in chunks if c not in own]
    for addr in find_u64(space, COOKIE, chunks).tolist():
        try:
            hv = space.u64(addr + 8)
        except MemoryReadError:
            continue
        if plausible_hexversion(hv):
            return addr, hv
    return None


# "3.10.13 (main, May  9 2026, 07:34:36) [GCC 12.2.0]"; 3.9 and older: ") \n[GCC ..."
_BANNER_RE = re.compile(rb"(\d)\.(\d{1,2})\.(\d{1,3})(?:(a|b|rc)(\d{1,2}))?\+? \([^()\x00]{1,80}\) ?\n?\[[^\x00]{1,80}")
_LEVEL_CODES = {b"a": 0xA, b"b": 0xB, b"rc": 0xC, None: 0xF}
MAX_BANNER_SCAN = 64 << 20  # bytes of the module's data searched for the version banner


def _banner_version(space: AddressSpace, path: str | None) -> tuple[int, int] | None:
    """(address, hexversion) of the `sys.version` banner Py_GetVersion() formats at start-up
    ("3.10.13 (main, May  9 2026, 07:34:36) [GCC 12.2.0]") into a static buffer of the python
    module: before 3.11 there is no `Py_Version` symbol. Only the module's own writable mappings
    and the anonymous one after them (its .bss) are searched: strings elsewhere prove nothing."""
    if path is None:
        return None
    regions = space.regions
    own = []
    for i, r in enumerate(regions):
        if r.writable and (r.path == path or (i and regions[i - 1].path == path and not r.file_backed)):
            own.append(r)
    budget = MAX_BANNER_SCAN
    for r in own:
        for c in space.chunks:
            if c.end <= r.start or c.start >= r.end or budget <= 0:
                continue
            lo, hi = max(c.start, r.start), min(c.end, r.end)
            data = c.read(lo - c.start, hi - lo)
            budget -= len(data)
            m = _BANNER_RE.search(data)
            if m:
                major, minor, micro = int(m.group(1)), int(m.group(2)), int(m.group(3))
                level, serial = _LEVEL_CODES.get(m.group(4), 0xF), int(m.group(5) or 0)
                if major == 3 and micro < 256:
                    return lo + m.start(), (major << 24) | (minor << 16) | (micro << 8) | (level << 4) | serial
    return None


def find_self_typed(space: AddressSpace, path: str | None) -> list[int]:
    """Addresses A with *(A+8) == A: candidates for the `type` type object (ob_type is itself)."""
    out: list[int] = []
    for c in space.chunks:
        r = space.region_of(c.start)
        if r is None or not r.writable or (path is not None and r.path != path):
            continue
        arr = c.array()
        skip = (-c.start) % 8
        n = (len(arr) - skip) // 8
        if n < 2:
            continue
        q = arr[skip : skip + 8 * n].view(np.uint64)
        pos = np.uint64(c.start + skip) + np.arange(n, dtype=np.uint64) * np.uint64(8)
        hits = np.flatnonzero(q[1:] == pos[:-1])
        out.extend((pos[hits]).tolist())
    return out


def discover(space: AddressSpace, file_root: str | None = None) -> InterpreterInfo:
    """Locate the interpreter; raises InterpreterNotFound with a reason when there is none."""
    mods = candidate_modules(space)
    chosen: ModuleSymbols | None = None
    for path in mods:
        syms = load_symbols(space, path, file_root)
        if syms is not None and ("_PyRuntime" in syms.symbols or "Py_Version" in syms.symbols or "PyType_Type" in syms.symbols):
            chosen = syms
            break
    info = InterpreterInfo(
        version="",
        minor="",
        hexversion=None,
        runtime=None,
        type_type=None,
        module_path=chosen.path if chosen else (mods[0] if mods else None),
    )
    if chosen is not None:
        info.symbols = {k: v for k, v in chosen.symbols.items() if k.startswith(("Py", "_Py", "_PySet"))}
        info.static_build = "libpython" not in chosen.path.rsplit("/", 1)[-1]
        src = f"{chosen.source} symbols of {chosen.path.rsplit('/', 1)[-1]}"
        if "Py_Version" in chosen.symbols:
            try:
                hv = space.u32(chosen.symbols["Py_Version"])
                if plausible_hexversion(hv):
                    info.hexversion = hv
                    info.how["version"] = f"Py_Version ({src})"
            except MemoryReadError as exc:
                info.warnings.append(f"Py_Version unreadable: {exc}")
        if "_PyRuntime" in chosen.symbols:
            info.runtime = chosen.symbols["_PyRuntime"]
            info.how["runtime"] = f"_PyRuntime ({src})"
        else:
            # Section headers are never mapped: only the file on disk has `.PyRuntime`.
            disk = chosen if chosen.source == "disk" else symbols_from_disk(chosen.path, chosen.base, file_root)
            if disk is not None and ".PyRuntime" in disk.sections:
                info.runtime = disk.sections[".PyRuntime"]
                info.how["runtime"] = "ELF section .PyRuntime (file on disk)"
        if "PyType_Type" in chosen.symbols:
            info.type_type = chosen.symbols["PyType_Type"]
            info.how["type_type"] = f"PyType_Type ({src})"
    if info.hexversion is None or info.runtime is None:
        cookie = _find_cookie(space, chosen)
        if cookie is not None:
            addr, hv = cookie
            if info.hexversion is None:
                info.hexversion = hv
                info.how["version"] = "_Py_DebugOffsets cookie 'xdebugpy' (3.13+)"
            if info.runtime is None:
                info.runtime = addr
                info.how["runtime"] = "_Py_DebugOffsets cookie 'xdebugpy' starts _PyRuntime"
    if info.hexversion is None:
        banner = _banner_version(space, info.module_path)
        named = next((m for m in (_minor_from_name(p) for p in mods) if m), None)
        if banner is not None and (named is None or version_from_hex(banner[1]).startswith(named + ".")):
            info.hexversion = banner[1]
            info.how["version"] = f"sys.version banner in the data of {info.module_path.rsplit('/', 1)[-1]} at {banner[0]:#x}"
    if info.hexversion is not None:
        info.version = version_from_hex(info.hexversion)
        info.minor = ".".join(info.version.split(".")[:2])
    else:
        minor = next((m for m in (_minor_from_name(p) for p in mods) if m), None)
        if minor is None:
            where = "no libpython or python executable is mapped" if not mods else "no interpreter symbols or version marker"
            raise InterpreterNotFound(
                f"no CPython interpreter found in {space.description}: {where}",
                "is this an image of a Python process? `zen info` lists the mapped files",
            )
        info.minor = info.version = minor
        info.how["version"] = f"file name of {info.module_path} (minor version only)"
        info.warnings.append("exact Python version unknown: only the minor version was inferred from a file name")
    if info.type_type is None:
        cands = find_self_typed(space, info.module_path) or find_self_typed(space, None)
        if len(cands) >= 1:
            info.type_type = cands[0]
            info.how["type_type"] = "self-referential object (ob_type == itself)"
            if len(cands) > 1:
                info.warnings.append(f"{len(cands)} self-typed objects; chose {cands[0]:#x} (validated later by name)")
    if info.runtime is None:
        info.warnings.append("_PyRuntime not located: interpreter state (threads, GC lists, sys.modules) unavailable")
    return info
