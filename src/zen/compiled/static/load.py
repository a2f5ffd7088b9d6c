"""One call from a library path to its parsed VM executable and kernel graph (static, no TVM)."""

from __future__ import annotations

from pathlib import Path

from zen.compiled.static.elf import Library, open_library
from zen.compiled.static.graph import Graph, build_graph
from zen.compiled.static.signatures import kernel_signatures
from zen.compiled.static.tvm_blob import vm_payload
from zen.compiled.static.vm_executable import Executable, parse_executable


def load_executable(path: str | Path) -> tuple[Library, Executable]:
    lib = open_library(Path(path))
    if lib.blob_offset is None:
        payload = memoryview(lib.data)
    else:
        payload, _ = vm_payload(lib.data, lib.blob_offset)
    return lib, parse_executable(payload)


def load_graph(path: str | Path, entry: str = "main") -> tuple[Library, Executable, Graph]:
    lib, ex = load_executable(path)
    sigs = kernel_signatures(lib.data) if lib.data[:4] == b"\x7fELF" else {}
    return lib, ex, build_graph(ex, entry, sigs)
