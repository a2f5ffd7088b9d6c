"""Reader for code objects of CPython 3.10 and earlier (before 3.11 merged the local tables).

`co_code` is a bytes object the interpreter never rewrites (no adaptive copy to de-specialise),
locals are three tuples (`co_varnames`, `co_cellvars`, `co_freevars`), there is no `co_qualname`
and no exception table, and the line table is `co_linetable` (3.10) or `co_lnotab` (3.8/3.9).
The record is the same `CodeInfo` as for 3.11+, so that every later stage reads one shape:
`localsplusnames` is laid out as a 3.10 frame's `f_localsplus` is (varnames, then cells, then
free variables), with the 3.11 kind bits, and `qualname` is the code's name (the function
object holds the qualified name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zen.cpython.readers.code_info import CodeInfo
from zen.runtime.errors import MemoryReadError, ObjectError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader

_INTS = ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_stacksize", "co_firstlineno", "co_flags", "co_nlocals")
_PTRS = ("co_code", "co_consts", "co_names", "co_varnames", "co_cellvars", "co_freevars", "co_filename", "co_name")


def read_legacy_code(ip: ImageReader, addr: int) -> CodeInfo:
    from zen.cpython.readers.containers import read_tuple
    from zen.cpython.readers.text import read_bytes

    C = ip.P.code
    line_field = "co_linetable" if C.has("co_linetable") else "co_lnotab"
    try:
        raw = ip.read_within(addr, C.size, addr, "code object")
    except MemoryReadError:
        raise ObjectError(addr, "code object not in the image") from None
    f = C.reader(*_INTS, *_PTRS, line_field).unpack(raw)
    if ip.kind(f.co_code) != "bytes":
        raise ObjectError(addr, "co_code is not a bytes object")
    code = read_bytes(ip, f.co_code)
    if len(code) % 2 or not 0 < len(code) // 2 <= ip.limits.max_code_units:
        raise ObjectError(addr, f"implausible bytecode of {len(code)} bytes (limit max_code_units={ip.limits.max_code_units})")

    def names(a: int) -> tuple[str, ...]:
        return tuple(ip.str(x) for x in read_tuple(ip, a))

    varnames, cellvars, freevars = names(f.co_varnames), names(f.co_cellvars), names(f.co_freevars)
    total = len(varnames) + len(cellvars) + len(freevars)
    if not (0 <= f.co_argcount <= 1 << 16 and f.co_nlocals == len(varnames) and total <= 1 << 20):
        raise ObjectError(addr, "implausible code object counts")
    c = ip.P.constants
    kinds = bytes(
        [c["CO_FAST_LOCAL"]] * len(varnames) + [c["CO_FAST_CELL"]] * len(cellvars) + [c["CO_FAST_FREE"]] * len(freevars)
    )
    name = ip.str(f.co_name)
    return CodeInfo(
        addr=addr,
        argcount=f.co_argcount,
        posonlyargcount=f.co_posonlyargcount,
        kwonlyargcount=f.co_kwonlyargcount,
        stacksize=f.co_stacksize,
        firstlineno=f.co_firstlineno,
        flags=f.co_flags,
        nlocals=f.co_nlocals,
        nlocalsplus=len(kinds),
        consts=read_tuple(ip, f.co_consts),
        names=names(f.co_names),
        localsplusnames=varnames + cellvars + freevars,
        localspluskinds=kinds,
        filename=ip.str(f.co_filename),
        name=name,
        qualname=name,
        linetable=read_bytes(ip, getattr(f, line_field)),
        exceptiontable=b"",
        adaptive=code,
        code=code,
        varnames=varnames,
        cellvars=cellvars,
        freevars=freevars,
        free_base=len(varnames),
    )
