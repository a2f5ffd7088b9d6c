"""Locating TVM's payload inside a shared library, by symbols or, when they are gone, by content.

A library from `export_library` exports `__tvm_ffi__library_bin` (the serialized module tree, in
.rodata) and one `__tvm_ffi_<kernel>` function per compiled kernel. Both sit in .dynsym, which
`strip --strip-all` keeps; if even they are missing (a hand-stripped or relinked file) the module
blob is found by its content, the length-prefixed key "relax.VMExecutable".
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError, ELFParseError
from elftools.elf.elffile import ELFFile

from zen.compiled.errors import ExecutableError

LIBRARY_BIN = "__tvm_ffi__library_bin"
KERNEL_PREFIX = "__tvm_ffi_"
VM_KEY = b"relax.VMExecutable"
MAX_FILE = 1 << 34  # 16 GiB: beyond any model library; refuses device files and the like

# OverflowError: a section offset past 2^63 reaches a seek (bench/fuzz_cli.py, tvm input 107)
_PARSE_ERRORS = (ELFError, ELFParseError, struct.error, ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError)


@dataclass
class Library:
    """What the ELF layer knows: file bytes, where the module blob starts, the exported kernels."""

    path: Path
    data: bytes
    blob_offset: int | None  # file offset of the u64 size that starts the module blob
    kernels: dict[str, int] = field(default_factory=dict)  # kernel name -> address of its entry point
    found_by: str = "symbol"
    machine: str = ""
    stripped: bool = False


def read_file(path: Path) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise ExecutableError(f"{path} does not exist or is not a regular file", "give the .so written by export_library")
    size = os.path.getsize(path)
    if size > MAX_FILE:
        raise ExecutableError(f"{path} is {size} bytes: too large for a model library")
    return path.read_bytes()


def _vaddr_to_offset(elf: ELFFile, addr: int) -> int | None:
    for seg in elf.iter_segments():
        if seg["p_type"] != "PT_LOAD":
            continue
        start, filesz = seg["p_vaddr"], seg["p_filesz"]
        if start <= addr < start + filesz:
            return addr - start + seg["p_offset"]
    return None


def _scan_for_blob(data: bytes) -> int | None:
    """File offset of the module blob's size field, found from the key string of its VM module."""
    key = struct.pack("<Q", len(VM_KEY)) + VM_KEY
    at = data.find(key)
    if at < 0:
        return None
    # blob: <nbytes u64> <indptr vec> <children vec> <key str> ...; walk back over the two vectors
    # is ambiguous, so return the key itself and let the blob parser start there (flagged by -1 - offset)
    return -1 - at


def open_library(path: Path) -> Library:
    """Parse the ELF file at `path` far enough to find TVM's module blob and kernel symbols."""
    data = read_file(path)
    if data[:4] != b"\x7fELF":
        if data[:8] in (struct.pack("<Q", 0xD225DE2F4214151E), struct.pack("<Q", 0xD225DE2F4214151D)):
            return Library(Path(path), data, None, found_by="raw VMExecutable file")
        raise ExecutableError(
            f"{path} is not an ELF shared library (starts with {data[:4]!r})", "give the .so file written by TVM's export_library"
        )
    import io

    try:
        elf = ELFFile(io.BytesIO(data))
        machine = elf["e_machine"]
        symbols: dict[str, int] = {}
        stripped = elf.get_section_by_name(".symtab") is None
        for name in (".dynsym", ".symtab"):
            sec = elf.get_section_by_name(name)
            if sec is None or not hasattr(sec, "iter_symbols"):
                continue
            if sec["sh_size"] > len(data):
                raise ExecutableError(f"{path}: section {name} claims {sec['sh_size']} bytes, more than the file")
            for sym in sec.iter_symbols():
                if sym.name.startswith(KERNEL_PREFIX) and sym["st_value"]:
                    symbols.setdefault(sym.name, sym["st_value"])
        blob = None
        if LIBRARY_BIN in symbols:
            blob = _vaddr_to_offset(elf, symbols[LIBRARY_BIN])
    except _PARSE_ERRORS as exc:
        raise ExecutableError(
            f"{path}: malformed ELF file ({type(exc).__name__}: {exc})",
            "the file is truncated or corrupt; use an intact copy of the library",
        ) from None
    kernels = {n[len(KERNEL_PREFIX) :]: a for n, a in symbols.items() if n != LIBRARY_BIN}
    found_by = "symbol " + LIBRARY_BIN
    if blob is None or blob >= len(data):
        blob, found_by = _scan_for_blob(data), "content scan"
        if blob is None:
            raise ExecutableError(
                f"{path} holds no TVM module blob (no {LIBRARY_BIN} symbol and no relax.VMExecutable)",
                "zen decompiles libraries written by TVM's relax export_library (TVM >= 0.20)",
            )
    return Library(Path(path), data, blob, kernels, found_by, str(machine), stripped)
