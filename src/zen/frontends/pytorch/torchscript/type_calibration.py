"""Measure what zen needs to print a traced graph again (`zen profile torch`): value types, constants, op names.

A model traced in the process has graphs but no code text, so zen rebuilds it from the graphs themselves
(`trace_ir.py`). That needs, beyond what `graph_calibration.py` measures:

* each value's type (`Value::type_`, a `TypePtr` whose first word is the `c10::Type`), the type's kind (a
  `TypeKind` enum, a compile-time number of a torch build, measured per kind on values of known types), a list's
  and an optional's element type, a tuple's element vector and a class attribute's type;
* a `prim::Constant`'s value: `ScalarAttributeValue<T>` keeps its value right after the name, whatever T is
  (int64, double, std::string, at::Tensor), checked on one constant of each kind;
* the names of op symbols (`aten::linear`): `c10::InternedStrings`, a process-wide object in libtorch_cpu's data,
  keeps one `SymbolInfo {namespace, qualified name, unqualified name}` per symbol in a vector indexed by symbol.
  Its place is measured as an offset from the library's first byte and checked by three builtin symbols' names.

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import os
import struct

from zen.cpython.calibration.base import CalibrationFailed, one

IR = """graph(%x : Tensor, %y : Tensor):
  %a : int = prim::Constant[value=7]()
  %b : float = prim::Constant[value=1.5]()
  %c : bool = prim::Constant[value=1]()
  %d : NoneType = prim::Constant()
  %e : str = prim::Constant[value="zen-calibration-constant-text"]()
  %f : Device = prim::Constant[value="cpu"]()
  %g : int[] = prim::ListConstruct(%a, %a)
  %h : float[] = prim::ListConstruct(%b, %b)
  %i : int? = prim::Constant()
  %j : (int, float, Tensor) = prim::TupleConstruct(%a, %b, %x)
  %k : Tensor = aten::add(%x, %y, %a)
  %l : Scalar = prim::Constant[value=3]()
  %m : int = prim::Constant[value=-9]()
  return (%k, %j, %g, %h, %c, %d, %e, %f, %i, %l, %m)
"""
NAMES = "abcdefghijklm"
KINDS = {"TENSOR": "k", "TUPLE": "j", "LIST": "g", "FLOAT": "b", "INT": "a", "NONE": "d", "STRING": "e",
         "BOOL": "c", "OPTIONAL": "i", "DEVICE": "f", "NUMBER": "l"}  # fmt: skip
LIBRARY = "libtorch_cpu.so"


def _module(torch):
    class CalibTypes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

    return torch.jit.script(CalibTypes())


def measure_jit_types(cal) -> None:
    torch, m = cal.torch, cal.m
    value = cal.off("pybind", "value")

    def ptr(o) -> int:
        return m.word(id(o) + value)

    def u32(at: int) -> int:
        return struct.unpack("<I", m.raw(at, 4))[0]

    graph = torch._C.parse_ir(IR)
    outs = [v for n in graph.nodes() for v in n.outputs()]
    cal.check(len(outs) == len(NAMES), "the calibration graph has one output per known value")
    vals = {k: ptr(v) for k, v in zip(NAMES, outs)}
    vals["x"], vals["y"] = (ptr(v) for v in graph.inputs())
    types = {k: str(v.type()) for k, v in zip(NAMES, outs)}
    # Value::type_: values of one type share the type object (ints `a`, `m`), every other pair differs

    def shared(o: int) -> bool:
        return all((m.word(vals[p] + o) == m.word(vals[q] + o)) == (types[p] == types[q]) for p in NAMES for q in NAMES)

    cands = [o for o in range(0, 160, 8)
             if all(m.readable(a + o, 8) and m.readable(m.word(a + o), 16) for a in vals.values()) and shared(o)]  # fmt: skip
    tfield = cal.field("jitvalue", "type", one("Value.type_", cands), "ptr")
    tp = {k: m.word(a + tfield) for k, a in vals.items()}
    kc = [o for o in range(8, 32, 4) if len({u32(tp[k] + o) for k in KINDS.values()}) == len(KINDS)
          and all(u32(tp[k] + o) < 256 for k in KINDS.values())]  # fmt: skip
    kind = cal.field("jittype", "kind", one("Type.kind_", kc[:1]), "u32")
    for label, k in KINDS.items():
        cal.constants[f"TYPE_{label}"] = u32(tp[k] + kind)
        cal.provenance[f"constants.TYPE_{label}"] = f"measured: the TypeKind of a {types[k]} value"
    cal.check(u32(tp["x"] + kind) == cal.constants["TYPE_TENSOR"], "a graph input's Tensor type has the Tensor kind")
    ints, floats = tp["a"], tp["b"]
    cal.field("jittype", "element", one("ListType elem", [o for o in range(16, 160, 8) if m.word(tp["g"] + o) == ints
                                                          and m.word(tp["h"] + o) == floats]), "ptr")  # fmt: skip
    # an optional keeps its contained type twice (its own field and a cached copy): either is the element
    cal.field("jittype", "contained", one("OptionalType contained", [o for o in range(16, 160, 8)
                                                                     if m.word(tp["i"] + o) == ints][:1]), "ptr")  # fmt: skip
    tup = []
    for o in range(16, 256, 8):
        b, e, cap = m.words(tp["j"] + o, 3)
        if b and b <= e <= cap and e - b == 48 and m.readable(b, 48) and m.words(b, 6)[0::2] == (ints, floats, tp["x"]):
            tup.append(o)
    cal.field("jittype", "elements", one("TupleType elements_", tup), "ptr")
    cal.constants["TYPEPTR_SIZE"] = 16
    cal.provenance["constants.TYPEPTR_SIZE"] = "measured: a tuple's element types are 16 bytes apart, the type first"
    _attribute_values(cal, m, ptr, graph, torch)
    _class_types(cal, m, ptr, torch, tp["c"], kind)
    _interned(cal, m)


def _attribute_values(cal, m, ptr, graph, torch) -> None:
    """The offset of a constant's value in its attribute, the same for every kind zen prints (checked on each)."""
    nodes: dict = {}
    for n in graph.nodes():  # the first constant of each type (the int 7, not the -9 after it)
        if n.kind() == "prim::Constant" and n.hasAttribute("value"):
            nodes.setdefault(str(n.output().type()), n)
    tensor = torch.tensor(2.5, dtype=torch.float64)
    nodes["Tensor"] = graph.insertConstant(tensor).node()
    attrs_off = cal.off("jitnode", "attributes")

    def attr(n) -> int:
        b, e = m.words(ptr(n) + attrs_off, 2)
        if e - b != 8:
            raise CalibrationFailed(f"a prim::Constant with {(e - b) // 8} attributes")
        return m.word(b)

    want = {"int": struct.pack("<q", 7), "float": struct.pack("<d", 1.5), "bool": struct.pack("<q", 1),
            "Tensor": struct.pack("<Q", tensor._cdata)}  # fmt: skip
    found = [o for o in range(16, 64, 8) if all(m.raw(attr(nodes[t]) + o, 8) == w for t, w in want.items())]
    off = cal.field("jitattr", "value", one("ScalarAttributeValue value_", found), "u64")
    cal.check(off == cal.off("jitattr", "text"), "a string attribute's text is where every other value is")
    p, n = m.words(attr(nodes["str"]) + off, 2)
    cal.check(m.raw(p, n) == b"zen-calibration-constant-text", "a string constant's text")
    minus = [nd for nd in graph.nodes() if nd.kind() == "prim::Constant" and nd.hasAttribute("value")
             and str(nd.output().type()) == "int" and nd.i("value") == -9]  # fmt: skip
    cal.check(struct.unpack("<q", m.raw(attr(minus[0]) + off, 8))[0] == -9, "a negative int constant")


def _class_types(cal, m, ptr, torch, bool_type: int, kind: int) -> None:
    """A module's ClassType kind, and where a class attribute keeps its type (`training` is a bool)."""
    sm = _module(torch)
    ct = m.word(m.word(ptr(sm._c) + cal.off("jitmodule", "object")) + cal.off("jitobject", "type"))
    cal.constants["TYPE_CLASS"] = struct.unpack("<I", m.raw(ct + kind, 4))[0]
    cal.provenance["constants.TYPE_CLASS"] = "measured: the TypeKind of a scripted module's ClassType"
    b, e = m.words(ct + cal.off("classtype", "attributes"), 2)
    size, name = cal.constants["CLASSATTR_SIZE"], cal.off("classattr", "name")
    attrs = {}
    for i in range((e - b) // size):
        p, n = m.words(b + i * size + name, 2)
        attrs[m.raw(p, n).decode()] = b + i * size
    lin_ct = m.word(m.word(ptr(sm.lin._c) + cal.off("jitmodule", "object")) + cal.off("jitobject", "type"))
    found = [o for o in range(0, name, 8) if m.word(attrs["training"] + o) == bool_type and m.word(attrs["lin"] + o) == lin_ct]
    cal.field("classattr", "type", one("ClassAttribute.attributeType_", found), "ptr")


def _interned(cal, m) -> None:
    """Where libtorch_cpu keeps the symbol table, as an offset from its first mapped byte."""
    maps = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            maps.append((lo, hi, parts[1], int(parts[2], 16), parts[5] if len(parts) > 5 else ""))
    lib = [x for x in maps if os.path.basename(x[4]).startswith(LIBRARY)]
    starts = [x for x in lib if x[3] == 0]
    if not starts:
        raise CalibrationFailed(f"{LIBRARY} is not mapped from its first byte")
    base = min(x[0] for x in starts)
    writable = [x for x in lib if x[2][1] == "w"]
    if not writable:
        raise CalibrationFailed(f"{LIBRARY} has no writable mapping")
    lo = writable[0][0]
    hi = max(x[1] for x in writable)
    after = [x for x in maps if x[0] == hi and not x[4]]  # its .bss: the anonymous mapping right after
    hi = after[0][1] if after else hi
    syms = {cal.constants["SYM_GETATTR"]: "prim::GetAttr", cal.constants["SYM_RETURN"]: "prim::Return",
            cal.constants["SYM_ATTR_NAME"]: "attr::name"}  # fmt: skip

    def text(at: int) -> bytes | None:
        p, n = m.words(at, 2)
        return m.raw(p, n) if 0 < n < 256 and m.readable(p, n) else None

    raw = m.raw(lo, hi - lo)
    hits = []
    for o in range(0, len(raw) - 24, 8):
        b, e, cap = struct.unpack_from("<3Q", raw, o)
        if not (b and b <= e <= cap) or not m.readable(b, e - b):
            continue
        for size in range(40, 136, 8):
            if (e - b) % size or (e - b) // size <= max(syms):
                continue
            hits += [(lo + o - base, size, q) for q in range(0, size - 16, 8)
                     if all(text(b + s * size + q) == t.encode() for s, t in syms.items())]  # fmt: skip
    where, size, qual = hits[0] if len(hits) == 1 else (one("c10::InternedStrings sym_to_info_", hits), 0, 0)
    cal.constants["INTERNED_OFFSET"] = where
    cal.constants["SYMBOLINFO_SIZE"] = size
    cal.field("symbolinfo", "qual", qual, "ptr", "measured: the qualified name of three builtin symbols (checked)")
    how = f"measured: the symbol vector's offset from {LIBRARY}'s first byte, found by three builtin symbols' names"
    cal.provenance["constants.INTERNED_OFFSET"] = how
    cal.provenance["constants.SYMBOLINFO_SIZE"] = "measured: SymbolInfo {namespace, qualified, unqualified} stride"
