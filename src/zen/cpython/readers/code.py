"""Reader for code objects (PyCodeObject): every field needed to rebuild or fingerprint one.

The bytecode in memory is the *adaptive* copy (`co_code_adaptive`): specialised opcodes and
inline caches filled by the running interpreter. `code` in the record is the de-specialised
bytecode, equal to what `co_code` returns in the live process. Local-variable names and kinds are
stored merged (`co_localsplusnames`/`co_localspluskinds`); varnames/cellvars/freevars are derived
from the kinds exactly as CPython derives them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zen.errors import MemoryReadError, ObjectError
from zen.cpython.bytecode import deoptimize

if TYPE_CHECKING:
    from zen.cpython.interp import Interpreter

MAX_CODE_UNITS = 1 << 24


@dataclass
class CodeInfo:
    addr: int
    argcount: int
    posonlyargcount: int
    kwonlyargcount: int
    stacksize: int
    firstlineno: int
    flags: int
    nlocals: int
    nlocalsplus: int
    consts: list[int]
    names: tuple[str, ...]
    localsplusnames: tuple[str, ...]
    localspluskinds: bytes
    filename: str
    name: str
    qualname: str
    linetable: bytes
    exceptiontable: bytes
    adaptive: bytes
    code: bytes
    varnames: tuple[str, ...] = field(default=())
    cellvars: tuple[str, ...] = field(default=())
    freevars: tuple[str, ...] = field(default=())


def read_code(ip: Interpreter, addr: int) -> CodeInfo:
    kind = ip.kind(addr)
    if kind != "code":
        raise ObjectError(addr, f"expected a code object, found {kind}")
    C = ip.P.code
    from zen.cpython.readers.containers import read_tuple
    from zen.cpython.readers.text import read_bytes

    try:
        units = ip.space.i64(addr + ip.P.varobject.ob_size)
        if not 0 < units <= MAX_CODE_UNITS:
            raise ObjectError(addr, f"implausible code size of {units} units")
        unit = ip.P.constants.get("CODE_UNIT_SIZE", 2)
        raw = ip.read_within(addr, C.co_code_adaptive + units * unit, addr, "code object")
    except MemoryReadError:
        raise ObjectError(addr, "code object not in the image") from None

    def i32(off: int) -> int:
        return struct.unpack_from("<i", raw, off)[0]

    def ptr(off: int) -> int:
        return struct.unpack_from("<Q", raw, off)[0]

    adaptive = raw[C.co_code_adaptive :]
    names = tuple(ip.str(a) for a in read_tuple(ip, ptr(C.co_names)))
    lp_names = tuple(ip.str(a) for a in read_tuple(ip, ptr(C.co_localsplusnames)))
    lp_kinds = read_bytes(ip, ptr(C.co_localspluskinds))
    if len(lp_kinds) != len(lp_names):
        raise ObjectError(addr, "local names and kinds differ in length")
    info = CodeInfo(
        addr=addr,
        argcount=i32(C.co_argcount),
        posonlyargcount=i32(C.co_posonlyargcount),
        kwonlyargcount=i32(C.co_kwonlyargcount),
        stacksize=i32(C.co_stacksize),
        firstlineno=i32(C.co_firstlineno),
        flags=i32(C.co_flags),
        nlocals=i32(C.co_nlocals),
        nlocalsplus=i32(C.co_nlocalsplus),
        consts=read_tuple(ip, ptr(C.co_consts)),
        names=names,
        localsplusnames=lp_names,
        localspluskinds=lp_kinds,
        filename=ip.str(ptr(C.co_filename)),
        name=ip.str(ptr(C.co_name)),
        qualname=ip.str(ptr(C.co_qualname)),
        linetable=read_bytes(ip, ptr(C.co_linetable)),
        exceptiontable=read_bytes(ip, ptr(C.co_exceptiontable)),
        adaptive=adaptive,
        code=deoptimize(adaptive, ip.P.opcodes),
    )
    if not (0 <= info.argcount <= 1 << 16 and 0 <= info.nlocalsplus <= 1 << 20 and info.nlocalsplus == len(lp_names)):
        raise ObjectError(addr, "implausible code object counts")
    c = ip.P.constants
    local, cell, free = c["CO_FAST_LOCAL"], c["CO_FAST_CELL"], c["CO_FAST_FREE"]
    info.varnames = tuple(n for n, k in zip(lp_names, lp_kinds) if k & local)
    info.cellvars = tuple(n for n, k in zip(lp_names, lp_kinds) if k & cell)
    info.freevars = tuple(n for n, k in zip(lp_names, lp_kinds) if k & free)
    return info
