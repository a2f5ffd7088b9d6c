"""TVM's module-tree container (`__tvm_ffi__library_bin`).

Layout (tvm-ffi `ProcessLibraryBin`): <nbytes u64> then, inside those nbytes, the import tree as
two u64 vectors (indptr, child indices) and one entry per module: its kind as a string and, unless
the kind is "_lib" (the placeholder for the shared library's own kernels), its serialized bytes.
A relax model library holds the VM executable ("relax.VMExecutable") importing "_lib".
"""

from __future__ import annotations

from dataclasses import dataclass

from zen.compiled.errors import ExecutableError
from zen.compiled.static.reader import Reader

MAX_MODULES = 4096


@dataclass
class ModuleEntry:
    kind: str
    payload: memoryview | None  # None for "_lib"
    offset: int  # file offset of the payload


def parse_blob(data: bytes, offset: int) -> list[ModuleEntry]:
    """The modules of the container whose size field is at file offset `offset`.

    A negative offset means the container header was not found (no symbol) and -1-offset is the
    file offset of a "relax.VMExecutable" key: only that module is read."""
    if offset < 0:
        r = Reader(data, -1 - offset, what="module blob (found by content)")
        kind = r.string("module kind")
        payload = r.blob("module bytes")
        return [ModuleEntry(kind, payload, r.pos - len(payload))]
    head = Reader(data, offset, what="module blob")
    nbytes = head.u64("size")
    if nbytes > head.remaining:
        raise head.fail("size", f"blob of {nbytes} bytes extends past the end of the file ({head.remaining} left)")
    r = Reader(data, head.pos, head.pos + nbytes, what="module blob")
    indptr = r.vec("<u8", "import tree indptr")
    r.vec("<u8", "import tree children")
    if len(indptr) < 1 or len(indptr) - 1 > MAX_MODULES:
        raise r.fail("import tree", f"{len(indptr)} indptr entries is not a module tree")
    modules = []
    for i in range(len(indptr) - 1):
        kind = r.string(f"kind of module {i}", limit=256)
        if kind == "_lib":
            modules.append(ModuleEntry(kind, None, r.pos))
            continue
        payload = r.blob(f"bytes of module {i} ({kind})")
        modules.append(ModuleEntry(kind, payload, r.pos - len(payload)))
    return modules


def vm_payload(data: bytes, offset: int) -> tuple[memoryview, int]:
    """(bytes of the relax VM executable, their file offset)."""
    for m in parse_blob(data, offset):
        if m.kind == "relax.VMExecutable" and m.payload is not None:
            return m.payload, m.offset
    kinds = ", ".join(m.kind for m in parse_blob(data, offset)) or "none"
    raise ExecutableError(
        f"the library's module blob holds no relax.VMExecutable (modules: {kinds})",
        "zen decompiles relax VM libraries (tvm.compile + export_library); "
        "exec_mode='compiled' and Relay graph-executor libraries are not supported yet",
    )
