"""Reader for code objects (PyCodeObject): every field needed to rebuild or fingerprint one.

The bytecode in memory is the *adaptive* copy (`co_code_adaptive`): specialised opcodes and
inline caches filled by the running interpreter. `code` in the record is the de-specialised
bytecode, equal to what `co_code` returns in the live process. Local-variable names and kinds are
stored merged (`co_localsplusnames`/`co_localspluskinds`); varnames/cellvars/freevars are derived
from the kinds exactly as CPython derives them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zen.cpython.bytecode import deoptimize
from zen.errors import MemoryReadError, ObjectError

if TYPE_CHECKING:
    from zen.cpython.interp import Interpreter

MAX_CODE_UNITS = 1 << 24
_FIELDS = (
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_stacksize",
    "co_firstlineno",
    "co_flags",
    "co_nlocals",
    "co_nlocalsplus",
    "co_consts",
    "co_names",
    "co_localsplusnames",
    "co_localspluskinds",
    "co_filename",
    "co_name",
    "co_qualname",
    "co_linetable",
    "co_exceptiontable",
)


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

    f = C.reader(*_FIELDS).unpack(raw)
    adaptive = raw[C.co_code_adaptive :]
    names = tuple(ip.str(a) for a in read_tuple(ip, f.co_names))
    lp_names = tuple(ip.str(a) for a in read_tuple(ip, f.co_localsplusnames))
    lp_kinds = read_bytes(ip, f.co_localspluskinds)
    if len(lp_kinds) != len(lp_names):
        raise ObjectError(addr, "local names and kinds differ in length")
    info = CodeInfo(
        addr=addr,
        argcount=f.co_argcount,
        posonlyargcount=f.co_posonlyargcount,
        kwonlyargcount=f.co_kwonlyargcount,
        stacksize=f.co_stacksize,
        firstlineno=f.co_firstlineno,
        flags=f.co_flags,
        nlocals=f.co_nlocals,
        nlocalsplus=f.co_nlocalsplus,
        consts=read_tuple(ip, f.co_consts),
        names=names,
        localsplusnames=lp_names,
        localspluskinds=lp_kinds,
        filename=ip.str(f.co_filename),
        name=ip.str(f.co_name),
        qualname=ip.str(f.co_qualname),
        linetable=read_bytes(ip, f.co_linetable),
        exceptiontable=read_bytes(ip, f.co_exceptiontable),
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


def read_code_brief(ip: Interpreter, addr: int) -> tuple[str, str, int, bytes]:
    """(qualname, filename, first line, de-specialised bytecode): what a system-wide table needs,
    without reading constants, names and local tables."""
    kind = ip.kind(addr)
    if kind != "code":
        raise ObjectError(addr, f"expected a code object, found {kind}")
    C = ip.P.code
    units = ip.space.i64(addr + ip.P.varobject.ob_size)
    if not 0 < units <= MAX_CODE_UNITS:
        raise ObjectError(addr, f"implausible code size of {units} units")
    raw = ip.read_within(addr, C.co_code_adaptive + units * ip.P.constants.get("CODE_UNIT_SIZE", 2), addr, "code object")
    f = C.reader("co_qualname", "co_filename", "co_firstlineno").unpack(raw)
    adaptive = raw[C.co_code_adaptive :]
    if C.has("co_warmup"):
        # 3.11 quickens code (rewrites opcodes, fills caches) only once its warm-up counter reaches
        # zero: before that the adaptive bytes are exactly co_code and need no de-specialisation.
        warm = int.from_bytes(raw[C.co_warmup : C.co_warmup + 2], "little", signed=True)
        if warm < 0:
            return ip.str(f.co_qualname), ip.str(f.co_filename), f.co_firstlineno, adaptive
    return ip.str(f.co_qualname), ip.str(f.co_filename), f.co_firstlineno, deoptimize(adaptive, ip.P.opcodes)
