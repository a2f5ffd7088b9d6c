"""Rebuild `types.CodeType` objects from code objects in an image.

A rebuilt code object compares equal (`==`) to the original: same de-specialised bytecode,
constants (recursively, including nested code objects and frozensets), names, local names and
kinds, line and exception tables, flags and qualname. Building one only *constructs* an object;
nothing recovered is ever executed here.

Only possible when the image's Python minor version equals the running interpreter's (bytecode
is version specific); otherwise callers use the field-level `CodeInfo` records.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zen.cpython.readers.code import CodeInfo, read_code
from zen.runtime.errors import ObjectError, VersionMismatch

if TYPE_CHECKING:
    from zen.cpython.interp import Interpreter

CodeReader = Callable[[int], CodeInfo | None]

MAX_CONST_DEPTH = 64
_SCALARS = frozenset(("none", "ellipsis", "bool", "int", "float", "complex", "str", "bytes"))


def can_rebuild(ip: Interpreter) -> bool:
    return ip.P.minor == f"{sys.version_info.major}.{sys.version_info.minor}"


def rebuilt_memo(ip: Interpreter) -> dict[int, types.CodeType]:
    """The code objects rebuilt from this interpreter's image so far, by address: the PR's value
    encoder (functions made inside functions) and code.marshal ask for some of the same ones.
    Sharing them is safe for the case files: those are written by `canonical_marshal`, whose
    bytes do not depend on how many references zen holds."""
    return ip.census_memo.setdefault("rebuilt_code", {})  # type: ignore[return-value]


def rebuild_code(ip: Interpreter, addr: int, _memo: dict[int, types.CodeType] | None = None, _depth: int = 0,
                 read: CodeReader | None = None) -> types.CodeType:  # fmt: skip
    """A `types.CodeType` equal to the code object at `addr`. `read` (address -> CodeInfo, or None
    when unreadable) lets a caller that has read the code objects already (the runtime index)
    give its cached records instead of reading each one again."""
    if not can_rebuild(ip):
        raise VersionMismatch(
            f"cannot rebuild Python {ip.P.minor} code objects in Python {sys.version_info.major}.{sys.version_info.minor}",
            f"run zen under Python {ip.P.minor} to rebuild code; field-level records are still available",
        )
    memo = _memo if _memo is not None else {}
    hit = memo.get(addr)
    if hit is not None:
        return hit
    if _depth > MAX_CONST_DEPTH:
        raise ObjectError(addr, "code objects nested too deeply")
    if read is None:
        ci = read_code(ip, addr)
    else:
        got = read(addr)
        if got is None:
            raise ObjectError(addr, "code object not readable")
        ci = got
    consts = tuple(_const(ip, a, memo, _depth + 1, read) for a in ci.consts)
    try:
        code = types.CodeType(
            ci.argcount,
            ci.posonlyargcount,
            ci.kwonlyargcount,
            ci.nlocals,
            ci.stacksize,
            ci.flags,
            ci.code,
            consts,
            ci.names,
            ci.varnames,
            ci.filename,
            ci.name,
            ci.qualname,
            ci.firstlineno,
            ci.linetable,
            ci.exceptiontable,
            ci.freevars,
            ci.cellvars,
        )
    except (ValueError, TypeError, SystemError) as exc:
        raise ObjectError(addr, f"recovered fields do not form a valid code object: {exc}") from None
    memo[addr] = code
    return code


def _const(ip: Interpreter, addr: int, memo: dict, depth: int, read: CodeReader | None) -> Any:
    kind = ip.kind(addr)
    if kind == "code":
        return rebuild_code(ip, addr, memo, depth, read)
    if kind == "tuple":
        from zen.cpython.readers.containers import read_tuple

        return tuple(_const(ip, a, memo, depth + 1, read) for a in read_tuple(ip, addr))
    if kind == "frozenset":
        from zen.cpython.readers.containers import read_set

        return frozenset(_const(ip, a, memo, depth + 1, read) for a in read_set(ip, addr))
    if kind in _SCALARS:
        if ip.wk.kind_by_type.get(ip.type_of(addr)) != kind:
            raise ObjectError(addr, f"constant of a {kind} subclass cannot be rebuilt exactly")
        if kind == "str":
            return ip.str(addr)
        return ip.value(addr, 1)
    raise ObjectError(addr, f"unexpected constant of kind {kind} in a code object")


def code_spec(ip: Interpreter, addr: int, _depth: int = 0) -> dict:
    """A code object of the image as plain JSON data, for an interpreter of the image's own version
    to build (`codebuild_child.py`): zen's interpreter cannot build another version's code objects,
    that version's can, and then compares them with the originals exactly (issue 17)."""
    if _depth > MAX_CONST_DEPTH:
        raise ObjectError(addr, "code objects nested too deeply")
    ci = read_code(ip, addr)
    return {
        "code": {
            "argcount": ci.argcount, "posonlyargcount": ci.posonlyargcount, "kwonlyargcount": ci.kwonlyargcount,
            "nlocals": ci.nlocals, "stacksize": ci.stacksize, "flags": ci.flags, "codestring": ci.code.hex(),
            "consts": [_const_spec(ip, a, _depth + 1) for a in ci.consts], "names": list(ci.names),
            "varnames": list(ci.varnames), "filename": ci.filename, "name": ci.name, "qualname": ci.qualname,
            "firstlineno": ci.firstlineno, "linetable": ci.linetable.hex(), "exceptiontable": ci.exceptiontable.hex(),
            "freevars": list(ci.freevars), "cellvars": list(ci.cellvars),
        }
    }  # fmt: skip


def _const_spec(ip: Interpreter, addr: int, depth: int) -> dict:
    kind = ip.kind(addr)
    if kind == "code":
        return code_spec(ip, addr, depth)
    if kind in ("tuple", "frozenset"):
        from zen.cpython.readers.containers import read_set, read_tuple

        items = read_tuple(ip, addr) if kind == "tuple" else read_set(ip, addr)
        return {kind: [_const_spec(ip, a, depth + 1) for a in items]}
    if kind not in _SCALARS:
        raise ObjectError(addr, f"unexpected constant of kind {kind} in a code object")
    if ip.wk.kind_by_type.get(ip.type_of(addr)) != kind:
        raise ObjectError(addr, f"constant of a {kind} subclass cannot be rebuilt exactly")
    if kind == "str":
        return {"str": ip.str(addr)}
    v = ip.value(addr, 1)
    if kind in ("none", "ellipsis"):
        return {kind: None}
    if kind in ("int", "float"):
        return {kind: repr(v)}  # exact: an int of any size, a float's shortest round-trip repr
    if kind == "complex":
        return {kind: [repr(v.real), repr(v.imag)]}
    if kind == "bytes":
        return {kind: v.hex()}
    return {kind: v}  # bool
