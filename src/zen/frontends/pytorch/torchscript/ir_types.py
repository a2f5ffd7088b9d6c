"""TorchScript value types and op-symbol names, read from an image: what printing a graph again needs.

A graph names its ops by `c10::Symbol` (a number) and types its values by `c10::Type` objects. Both are decoded
here with the layout `zen profile torch` measured (`type_calibration.py`): a type's kind (the `TypeKind` numbers of
that torch build, kept in the profile), a list's or optional's element, a tuple's elements, a class's qualified
name; a symbol's name from libtorch_cpu's `c10::InternedStrings`, found at the measured offset from the library's
first byte and trusted only after three builtin symbols read back their own names. Every walk is bounded.
"""

from __future__ import annotations

import os
import re

from zen.frontends.pytorch.torchscript.reader import JitReader
from zen.runtime.errors import ZenError

TYPE_FIELDS = {"jittype": ("kind", "element", "contained", "elements"), "jitvalue": ("type",), "classattr": ("type",),
               "jitattr": ("value",), "symbolinfo": ("qual",)}  # fmt: skip
TYPE_CONSTANTS = ("TYPE_TENSOR", "TYPE_INT", "TYPE_FLOAT", "TYPE_BOOL", "TYPE_NONE", "TYPE_STRING", "TYPE_DEVICE",
                  "TYPE_LIST", "TYPE_OPTIONAL", "TYPE_TUPLE", "TYPE_CLASS", "TYPE_NUMBER", "INTERNED_OFFSET",
                  "SYMBOLINFO_SIZE", "TYPEPTR_SIZE")  # fmt: skip
LIBRARY = "libtorch_cpu.so"
MAX_SYMBOLS = 1_000_000
MAX_TYPE_DEPTH = 16
MAX_TUPLE = 256
SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_.]*")
# kinds printed by name, in the IR's own spelling (the same in annotations)
PLAIN = {"TENSOR": "Tensor", "INT": "int", "FLOAT": "float", "BOOL": "bool", "NONE": "NoneType", "STRING": "str",
         "DEVICE": "Device"}  # fmt: skip


class TypeUnsupported(ZenError):
    pass


def has_type_layout(jr: JitReader) -> bool:
    tp = jr.tp
    return all(c in tp.constants for c in TYPE_CONSTANTS) and all(
        s in tp.structs and all(f in tp.structs[s]._fields for f in fs) for s, fs in TYPE_FIELDS.items())  # fmt: skip


class TypeReader:
    """A `c10::Type` as a small tree: ("Tensor",), ("list", elem), ("optional", elem), ("tuple", [..]), ("class", q)."""

    def __init__(self, jr: JitReader) -> None:  # noqa: D107
        self.jr, self.ip, self.tp = jr, jr.ip, jr.tp
        c = self.tp.constants
        self.kinds = {c[f"TYPE_{k}"]: k for k in (*PLAIN, "LIST", "OPTIONAL", "TUPLE", "CLASS", "NUMBER")}
        self._cache: dict[int, tuple] = {}

    def of_value(self, value: int) -> tuple:
        return self.read(self.ip.ptr(value + self.tp.jitvalue.type))

    def read(self, t: int, depth: int = 0) -> tuple:
        got = self._cache.get(t)
        if got is not None:
            return got
        if depth > MAX_TYPE_DEPTH:
            raise TypeUnsupported(f"a type nested more than {MAX_TYPE_DEPTH} deep")
        T = self.tp.jittype
        code = self.ip.space.u32(t + T.kind)
        kind = self.kinds.get(code)
        if kind is None:
            raise TypeUnsupported(f"a value of TypeKind {code} (not one zen prints)")
        if kind in PLAIN:
            out: tuple = (PLAIN[kind],)
        elif kind == "NUMBER":
            out = ("Scalar",)
        elif kind == "LIST":
            out = ("list", self.read(self.ip.ptr(t + T.element), depth + 1))
        elif kind == "OPTIONAL":
            out = ("optional", self.read(self.ip.ptr(t + T.contained), depth + 1))
        elif kind == "TUPLE":
            b, e = self.ip.space.u64(t + T.elements), self.ip.space.u64(t + T.elements + 8)
            size = self.tp.constants["TYPEPTR_SIZE"]
            n, rest = divmod(e - b, size)
            if rest or not 0 <= n <= MAX_TUPLE:
                raise TypeUnsupported(f"a tuple type of {e - b:,} bytes of elements")
            out = ("tuple", tuple(self.read(self.ip.ptr(b + i * size), depth + 1) for i in range(n)))
        else:
            out = ("class", self.jr.string(t + self.tp.classtype.name, 4096))
        self._cache[t] = out
        return out


def ir_name(t: tuple) -> str:
    """The type in the IR's spelling (`int[]`, `int?`, `(int, Tensor)`), which `torch._C.parse_ir` reads."""
    if t[0] == "list":
        return f"{ir_name(t[1])}[]"
    if t[0] == "optional":
        return f"{ir_name(t[1])}?"
    if t[0] == "tuple":
        return "(" + ", ".join(ir_name(x) for x in t[1]) + ")"
    if t[0] == "class":
        raise TypeUnsupported(f"a value of class type {t[1][:80]} where a plain value was expected")
    return t[0]


def annotation(t: tuple) -> str:
    """The type as TorchScript code declares it (`List[int]`, `Optional[bool]`, a class's qualified name)."""
    if t[0] == "list":
        return f"List[{annotation(t[1])}]"
    if t[0] == "optional":
        return f"Optional[{annotation(t[1])}]"
    if t[0] == "tuple":
        return "Tuple[" + ", ".join(annotation(x) for x in t[1]) + "]" if t[1] else "Tuple[()]"
    if t[0] == "Scalar":
        raise TypeUnsupported("a Scalar-typed attribute")
    return t[1] if t[0] == "class" else t[0]


class SymbolTable:
    """Op names by symbol, from libtorch_cpu's interned strings."""

    def __init__(self, jr: JitReader) -> None:  # noqa: D107
        self.jr, self.ip, c = jr, jr.ip, jr.tp.constants
        starts = [r.start for r in self.ip.space.regions if os.path.basename(r.path).startswith(LIBRARY) and r.offset == 0]
        if not starts:
            raise ZenError(f"{LIBRARY} is not among the image's file mappings: op names cannot be read")
        vec = min(starts) + c["INTERNED_OFFSET"]
        self.size, self.qual = c["SYMBOLINFO_SIZE"], jr.tp.symbolinfo.qual
        self.begin = self.ip.space.u64(vec)
        n, rest = divmod(self.ip.space.u64(vec + 8) - self.begin, self.size)
        if rest or not 0 < n <= MAX_SYMBOLS:
            raise ZenError(f"no symbol table at {vec:#x} ({LIBRARY}'s interned strings): a profile of another build?")
        self.count = n
        self._names: dict[int, str] = {}
        for sym, want in ((c["SYM_GETATTR"], "prim::GetAttr"), (c["SYM_RETURN"], "prim::Return"),
                          (c["SYM_ATTR_NAME"], "attr::name")):  # fmt: skip
            if self.name(sym) != want:
                raise ZenError(f"the symbol table at {vec:#x} does not name builtin symbol {sym} {want}: another build?")

    def name(self, sym: int) -> str:
        got = self._names.get(sym)
        if got is None:
            if not 0 <= sym < self.count:
                raise ZenError(f"symbol {sym} is outside the table of {self.count:,}")
            got = self.jr.string(self.begin + sym * self.size + self.qual, 256)
            if not SYMBOL.fullmatch(got):
                raise ZenError(f"symbol {sym} reads as {got[:60]!r}, not a qualified op name")
            self._names[sym] = got
        return got
