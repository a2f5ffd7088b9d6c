"""Readers for function objects and their companions: cell, bound method, staticmethod,
classmethod and property.

A function's identity for forensics is its code object plus the environment it closes over:
globals (which module), defaults, keyword defaults, closure cells, qualname, annotations. These
records keep addresses of the referenced objects so later stages can follow them lazily.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zen.runtime.errors import MemoryReadError, ObjectError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


def _struct(ip: ImageReader, addr: int, kind: str, size: int) -> bytes:
    got = ip.kind(addr)
    if got != kind:
        raise ObjectError(addr, f"expected a {kind} object, found {got}")
    try:
        return ip.space.read(addr, size)
    except MemoryReadError:
        raise ObjectError(addr, f"{kind} object not in the image") from None


def _w(raw: bytes, off: int) -> int:
    return struct.unpack_from("<Q", raw, off)[0]


@dataclass
class FunctionInfo:
    addr: int
    name: str
    qualname: str
    module: str | None
    code: int
    globals: int
    builtins: int
    defaults: int  # tuple or 0
    kwdefaults: int  # dict or 0
    closure: int  # tuple of cells or 0
    doc: int
    dict: int
    annotations: int


_FIELDS = (
    "func_name",
    "func_qualname",
    "func_module",
    "func_code",
    "func_globals",
    "func_builtins",
    "func_defaults",
    "func_kwdefaults",
    "func_closure",
    "func_doc",
    "func_dict",
    "func_annotations",
)  # FunctionInfo's order


def _native_spec(ip: ImageReader) -> bytes | None:
    """The function layout as the compiled reader takes it (native/functions.c), made once per interpreter;
    None without the compiled reader or with a field missing (the reference then reads, and says what is wrong)."""
    memo = ip.census_memo
    if "function_spec" not in memo:
        F = ip.P.function
        ok = ip.fast is not None and all(F.has(n) for n in _FIELDS if n != "func_builtins")
        words = [F.size, *(getattr(F, n) if F.has(n) else -1 for n in _FIELDS)] if ok else []
        memo["function_spec"] = struct.pack(f"<{len(words)}q", *words) if ok else None
    return memo["function_spec"]  # type: ignore[return-value]


def read_function(ip: ImageReader, addr: int) -> FunctionInfo:
    spec = ip.census_memo.get("function_spec", b"") if ip.fast is not None else None
    if spec == b"":
        spec = _native_spec(ip)
    got = ip.fast.function(addr, spec) if spec is not None else None  # type: ignore[union-attr]
    if got is not None:  # read in one call (the plain case); the Python below is the reference
        return FunctionInfo(addr, *got)
    F = ip.P.function
    raw = _struct(ip, addr, "function", F.size)
    module = _w(raw, F.func_module)
    mod_name = None
    if module and ip.kind(module) == "str":
        mod_name = ip.str(module)
    info = FunctionInfo(
        addr=addr,
        name=ip.str(_w(raw, F.func_name)),
        qualname=ip.str(_w(raw, F.func_qualname)),
        module=mod_name,
        code=_w(raw, F.func_code),
        globals=_w(raw, F.func_globals),
        builtins=_w(raw, F.func_builtins) if F.has("func_builtins") else 0,  # 3.10+
        defaults=_w(raw, F.func_defaults),
        kwdefaults=_w(raw, F.func_kwdefaults),
        closure=_w(raw, F.func_closure),
        doc=_w(raw, F.func_doc),
        dict=_w(raw, F.func_dict),
        annotations=_w(raw, F.func_annotations),
    )
    if ip.kind(info.code) != "code":
        raise ObjectError(addr, "function's code pointer does not point to a code object")
    return info


def read_cell(ip: ImageReader, addr: int) -> int:
    """Address of the cell's contents (0 when the cell is empty)."""
    raw = _struct(ip, addr, "cell", ip.P.cell.ob_ref + 8)
    return _w(raw, ip.P.cell.ob_ref)


@dataclass
class MethodInfo:
    addr: int
    func: int
    self: int


def read_method(ip: ImageReader, addr: int) -> MethodInfo:
    M = ip.P.method
    raw = _struct(ip, addr, "method", max(M.im_func, M.im_self) + 8)
    return MethodInfo(addr, _w(raw, M.im_func), _w(raw, M.im_self))


def read_wrapped(ip: ImageReader, addr: int) -> int:
    """The callable inside a staticmethod or classmethod."""
    kind = ip.kind(addr)
    if kind not in ("staticmethod", "classmethod"):
        raise ObjectError(addr, f"expected a staticmethod/classmethod, found {kind}")
    S = getattr(ip.P, kind)
    return ip.ptr(addr + S.callable)


@dataclass
class PropertyInfo:
    addr: int
    fget: int
    fset: int
    fdel: int
    doc: int


def read_property(ip: ImageReader, addr: int) -> PropertyInfo:
    P = ip.P.property
    raw = _struct(ip, addr, "property", max(P.fget, P.fset, P.fdel, P.doc) + 8)
    return PropertyInfo(addr, _w(raw, P.fget), _w(raw, P.fset), _w(raw, P.fdel), _w(raw, P.doc))


def carries_own_name(ip: ImageReader, f: FunctionInfo) -> bool:
    """Whether a function's `__qualname__` is its code's: False for a wrapper that took another function's
    name through `functools.wraps` (dynamo's `_fn` carries `Module._call_impl`'s), which must be identified by
    its code object, never by the name it carries. Before 3.11 code has no qualname: the names are compared."""
    C = ip.P.code
    if C.has("co_qualname"):
        return ip.str(ip.ptr(f.code + C.co_qualname)) == f.qualname
    if C.has("co_name"):
        return ip.str(ip.ptr(f.code + C.co_name)) == f.name
    return True
