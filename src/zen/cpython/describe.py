"""Short, typed descriptions of arbitrary objects for listings (`zen objects`) and reports.

Each description is a JSON-able dict: address, type, and what matters for that kind (a value for
plain data, name/module/qualname for functions and classes, attributes for instances). Failures
to read are described, not raised: a listing of ten thousand objects must survive one bad one.
"""

from __future__ import annotations

from typing import Any

from zen.cpython.interp import Interpreter
from zen.runtime.errors import ZenError

PLAIN = {
    "none",
    "bool",
    "int",
    "float",
    "complex",
    "str",
    "bytes",
    "bytearray",
    "tuple",
    "list",
    "dict",
    "set",
    "frozenset",
    "ellipsis",
    "notimplemented",
}


def short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(ip: Interpreter, addr: int, *, depth: int = 2) -> dict:
    out: dict[str, Any] = {"addr": f"{addr:#x}"}
    try:
        tp = ip.type_of(addr)
        out["type"] = ip.type_info(tp).full_name
        kind = ip.kind_of_type(tp)
        out["kind"] = kind
        if kind in PLAIN:
            out["value"] = short(ip.value(addr, depth))
        elif kind == "function":
            from zen.cpython.readers.functions import read_function

            f = read_function(ip, addr)
            out.update(qualname=f.qualname, module=f.module, code=f"{f.code:#x}")
        elif kind == "code":
            from zen.cpython.readers.code import read_code

            c = read_code(ip, addr)
            out.update(qualname=c.qualname, filename=c.filename, firstlineno=c.firstlineno)
        elif kind == "module":
            from zen.cpython.readers.modules import read_module

            m = read_module(ip, addr)
            out.update(name=m.name, file=m.file)
        elif kind == "type":
            t = ip.type_info(addr)
            out.update(name=t.full_name, heap=t.is_heap)
        elif kind == "instance":
            from zen.cpython.readers.instances import read_instance

            inst = read_instance(ip, addr)
            out["storage"] = inst.storage
            attrs = {}
            for name, v in list(inst.attrs.items())[:12]:
                attrs[name] = _brief(ip, v)
            for name, v in inst.slots.items():
                attrs[name] = _brief(ip, v) if v else "<unset>"
            out["attrs"] = attrs
    except ZenError as exc:
        out["error"] = str(exc)
    return out


def _brief(ip: Interpreter, addr: int) -> str:
    try:
        kind = ip.kind(addr)
        if kind in PLAIN:
            return short(ip.value(addr, 1), 60)
        return f"<{ip.type_name(addr)} at {addr:#x}>"
    except ZenError as exc:
        return f"<unreadable: {exc}>"
