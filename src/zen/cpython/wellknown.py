"""Addresses of the built-in types and singletons every reader dispatches on.

Exported symbols (`PyLong_Type`, `_Py_NoneStruct`, ...) give them directly. Without symbols we
enumerate the static type objects in the interpreter module's data (objects whose type is `type`)
and match their `tp_name`; singletons are then the objects of `NoneType`/`bool`/`ellipsis` in that
data. Both routes agree on real images; the second one keeps zen working on stripped builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zen.cpython.discover import InterpreterInfo
from zen.cpython.layout.profile import Profile
from zen.memory.scan import find_u64
from zen.memory.space import AddressSpace
from zen.runtime.errors import InterpreterNotFound, MemoryReadError

# reader kind -> (exported symbol, tp_name)
TYPES: dict[str, tuple[str, str]] = {
    "type": ("PyType_Type", "type"),
    "object": ("PyBaseObject_Type", "object"),
    "int": ("PyLong_Type", "int"),
    "bool": ("PyBool_Type", "bool"),
    "float": ("PyFloat_Type", "float"),
    "complex": ("PyComplex_Type", "complex"),
    "str": ("PyUnicode_Type", "str"),
    "bytes": ("PyBytes_Type", "bytes"),
    "bytearray": ("PyByteArray_Type", "bytearray"),
    "tuple": ("PyTuple_Type", "tuple"),
    "list": ("PyList_Type", "list"),
    "dict": ("PyDict_Type", "dict"),
    "set": ("PySet_Type", "set"),
    "frozenset": ("PyFrozenSet_Type", "frozenset"),
    "slice": ("PySlice_Type", "slice"),  # code constants from 3.14 (folded `x[1:2]`)
    "none": ("_PyNone_Type", "NoneType"),
    "ellipsis": ("PyEllipsis_Type", "ellipsis"),
    "notimplemented": ("_PyNotImplemented_Type", "NotImplementedType"),
    "module": ("PyModule_Type", "module"),
    "function": ("PyFunction_Type", "function"),
    "code": ("PyCode_Type", "code"),
    "cell": ("PyCell_Type", "cell"),
    "method": ("PyMethod_Type", "method"),
    "staticmethod": ("PyStaticMethod_Type", "staticmethod"),
    "classmethod": ("PyClassMethod_Type", "classmethod"),
    "property": ("PyProperty_Type", "property"),
    "member_descriptor": ("PyMemberDescr_Type", "member_descriptor"),
    "frame": ("PyFrame_Type", "frame"),
    "mappingproxy": ("PyDictProxy_Type", "mappingproxy"),
    "builtin_function": ("PyCFunction_Type", "builtin_function_or_method"),
    "weakref": ("_PyWeakref_RefType", "weakref"),
}
SINGLETONS = {
    "None": "_Py_NoneStruct",
    "True": "_Py_TrueStruct",
    "False": "_Py_FalseStruct",
    "Ellipsis": "_Py_EllipsisObject",
    "NotImplemented": "_Py_NotImplementedStruct",
}


@dataclass
class WellKnown:
    """Built-in type addresses by reader kind, and singleton addresses."""

    types: dict[str, int] = field(default_factory=dict)
    singletons: dict[str, int] = field(default_factory=dict)
    kind_by_type: dict[int, str] = field(default_factory=dict)
    how: str = "symbols"
    set_dummy: int | None = None

    def type(self, kind: str) -> int:
        return self.types[kind]


def resolve(space: AddressSpace, info: InterpreterInfo, profile: Profile) -> WellKnown:
    wk = WellKnown()
    syms = info.symbols
    for kind, (sym, _) in TYPES.items():
        if sym in syms:
            wk.types[kind] = syms[sym]
    for name, sym in SINGLETONS.items():
        if sym in syms:
            wk.singletons[name] = syms[sym]
    if "_PySet_Dummy" in syms:
        try:
            wk.set_dummy = space.u64(syms["_PySet_Dummy"])
        except MemoryReadError:
            wk.set_dummy = None
    missing = [k for k in TYPES if k not in wk.types]
    if missing or len(wk.singletons) < 3:
        _resolve_by_name(space, info, profile, wk, missing)
    if "type" not in wk.types and info.type_type is not None:
        wk.types["type"] = info.type_type
    essential = ("type", "int", "str", "tuple", "dict", "list", "code", "function")
    lost = [k for k in essential if k not in wk.types]
    if lost:
        raise InterpreterNotFound(
            f"built-in types not found in the image: {', '.join(lost)}",
            "the interpreter's data pages may be missing from the image",
        )
    wk.kind_by_type = {addr: kind for kind, addr in wk.types.items()}
    return wk


def _resolve_by_name(space, info, profile, wk: WellKnown, missing: list[str]) -> None:
    """Find static types by tp_name among objects whose ob_type is `type` in the module's data."""
    type_type = wk.types.get("type", info.type_type)
    if type_type is None:
        return
    from zen.memory.scan import writable_chunks

    chunks = [c for c in writable_chunks(space) if (r := space.region_of(c.start)) and r.path == info.module_path]
    want = {TYPES[k][1]: k for k in missing}
    tp_name = profile.type.tp_name
    for hit in find_u64(space, type_type, chunks or None).tolist():
        obj = hit - 8
        try:
            name = space.cstring(space.u64(obj + tp_name), 64).decode("ascii", "replace")
        except MemoryReadError:
            continue
        kind = want.get(name)
        if kind is not None and kind not in wk.types:
            wk.types[kind] = obj
    wk.how = "symbols + type names" if wk.how == "symbols" and len(wk.types) > len(missing) else "type names"
    for name, kind in (("None", "none"), ("Ellipsis", "ellipsis"), ("NotImplemented", "notimplemented")):
        if name not in wk.singletons and kind in wk.types:
            hits = find_u64(space, wk.types[kind], chunks or None).tolist()
            objs = [h - 8 for h in hits if h - 8 not in wk.types.values()]
            if objs:
                wk.singletons[name] = objs[0]
    if ("True" not in wk.singletons or "False" not in wk.singletons) and "bool" in wk.types:
        off = profile.long.ob_size if profile.long.has("ob_size") else profile.long.lv_tag
        for hit in find_u64(space, wk.types["bool"], chunks or None).tolist():
            obj = hit - 8
            try:
                size = space.u64(obj + off)
            except MemoryReadError:
                continue
            digit = space.u32(obj + profile.long.ob_digit) if size else 0
            wk.singletons.setdefault("True" if digit else "False", obj)
