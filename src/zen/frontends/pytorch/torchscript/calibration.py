"""Measure the C++ layout of TorchScript modules (`zen profile torch`): where a scripted module keeps its state.

A `torch.jit.ScriptModule` is a Python wrapper around a pybind11 instance (`_c`) that points to a `torch::jit::Module`,
whose `c10::ivalue::Object` holds one IValue per attribute (`slots_`) typed by a `ClassType` that names each attribute
and says whether it is a parameter, a buffer or a plain attribute. Nothing of this is reachable from Python objects
in an image, so it is measured here, in an interpreter with that torch, on a module whose every value is known: the
pybind value pointer, the Module -> Object pointer, the Object's type and slot vector, the IValue size, tag position
and tag numbers, the ClassType's attribute vector (element size, kind and name fields), its qualified name, and the
string IValue's text. Every offset is found by searching for a known value and checked on a second module.

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import struct

from zen.cpython.calibration.base import CalibrationFailed, common, one

LONG_TEXT = "zen-calibration-jit-string"  # longer than the std::string small buffer: stored on the heap
INT_VALUE = 0x5A5A1234
FLOAT_VALUE = 1.5


def _modules(torch):
    """A module with one attribute of every kind the reader decodes, and a submodule (scripted from this file)."""

    class CalibSub(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 5)

        def forward(self, x):
            return self.lin(x)

    class Calib(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p0 = torch.nn.Parameter(torch.arange(6.0).view(2, 3))
            self.register_buffer("b0", torch.arange(4, dtype=torch.int64))
            self.i0 = INT_VALUE
            self.f0 = FLOAT_VALUE
            self.s0 = LONG_TEXT
            self.t0 = (1, 2)
            self.l0 = [3, 5]
            self.d0 = {"a": 1}
            self.sub = CalibSub()

        def forward(self, x):
            extra = self.t0[0] + self.l0[0] + self.d0["a"]
            return self.sub(x).sum() * self.f0 + self.p0.sum() + self.i0 + float(len(self.s0)) + self.b0.sum() + extra

    return torch.jit.script(Calib())


def _string_at(m, addr: int, text: str) -> int | None:
    """Offset of a std::string {data pointer, size} holding `text` within 256 bytes at addr."""
    want = text.encode()
    for off in range(0, 256, 8):
        ptr, size = m.words(addr + off, 2)
        if size == len(want) and ptr and m.readable(ptr, size) and m.raw(ptr, size) == want:
            return off
    return None


def _identifier(m, addr: int) -> str | None:
    """The text of a std::string at addr when it is a short Python identifier, else None."""
    ptr, size = m.words(addr, 2)
    if not (0 < size < 256 and m.readable(ptr, size)):
        return None
    text = m.raw(ptr, size)
    return text.decode() if text.isascii() and text.decode().isidentifier() else None


def measure_jit(cal) -> None:
    torch, m = cal.torch, cal.m
    sm = _modules(torch)
    objs = [(sm._c, sm._c._type()), (sm.sub._c, sm.sub._c._type())]
    # pybind11 instance -> C++ value pointer (the same offset for a ScriptModule and a ClassType object)
    cands = []
    for o in range(16, 64, 8):
        ok = True
        for c, t in objs:
            mod, ct = m.word(id(c) + o), m.word(id(t) + o)
            if not (mod and ct and m.readable(mod, 64)):
                ok = False
                break
            if not any(m.readable(w, 256) and m.find_word(w, 256, ct) for w in m.words(mod, 4) if w):
                ok = False
                break
        if ok:
            cands.append(o)
    value = cal.field("pybind", "value", one("pybind11 instance value pointer", cands[:1]), "ptr")
    modules = [(m.word(id(c) + value), m.word(id(t) + value)) for c, t in objs]

    # the word whose target holds the module's ClassType at one offset in every module (a word that merely points
    # near a ClassType pointer, as a neighbouring heap chunk can, fails on the other module: seen once under load)
    def type_at(j: int) -> set[int]:
        got = [set(m.find_word(m.word(mod + j), 256, ct)) if m.readable(m.word(mod + j), 256) else set()
               for mod, ct in modules]  # fmt: skip
        return set.intersection(*got)

    obj_off = one("Module._ivalue_", [j for j in range(0, 32, 8) if type_at(j)])
    cal.field("jitmodule", "object", obj_off, "ptr")
    pairs = [(m.word(mod + obj_off), ct) for mod, ct in modules]
    cal.field("jitobject", "type", common("Object.type_", *[m.find_word(o, 256, ct)[:1] for o, ct in pairs]), "ptr")
    top_obj, top_ct = pairs[0]
    sub_obj = pairs[1][0]
    _class_type(cal, m, top_ct, sm._c._type().qualified_name(), pairs[1][1], sm.sub._c._type().qualified_name())
    names = _attribute_names(cal, m, top_ct)
    _slots(cal, m, top_obj, names, sm, sub_obj)


def _class_type(cal, m, ct: int, qualname: str, ct2: int, qualname2: str) -> None:
    name_off = common("ClassType qualified name", *[[o] if (o := _string_at(m, a, q)) is not None else []
                                                    for a, q in ((ct, qualname), (ct2, qualname2))])  # fmt: skip
    cal.field("classtype", "name", name_off, "ptr")
    cal.field("stdstring", "data", 0, "ptr", "derived: the std::string holding the name starts with its data pointer")
    cal.field("stdstring", "size", 8, "u64", "derived: the size follows the data pointer")
    known = {"p0", "b0", "i0", "f0", "s0", "sub"}
    found = None
    for off in range(0, 320, 8):
        b, e, cap = m.words(ct + off, 3)
        if not (b and b <= e <= cap and 0 < e - b < 4096):
            continue
        for size in range(40, 104, 8):
            if (e - b) % size:
                continue
            for k in range(0, size - 8, 8):
                texts = [_identifier(m, b + i * size + k) for i in range((e - b) // size)]
                if all(texts) and known <= set(texts):
                    found = (off, size, k)
                    break
            if found:
                break
        if found:
            break
    if found is None:
        raise CalibrationFailed("ClassType attribute vector not found")
    cal.field("classtype", "attributes", found[0], "ptr")
    cal.constants["CLASSATTR_SIZE"] = found[1]
    cal.provenance["constants.CLASSATTR_SIZE"] = "measured: element size of ClassType::attributes_ (names every element)"
    cal.field("classattr", "name", found[2], "ptr")


def _attribute_names(cal, m, ct: int) -> list[str]:
    b, e = m.words(ct + cal.off("classtype", "attributes"), 2)
    size, name = cal.constants["CLASSATTR_SIZE"], cal.off("classattr", "name")
    names = []
    for i in range((e - b) // size):
        ptr, n = m.words(b + i * size + name, 2)
        names.append(m.raw(ptr, n).decode())
    cal.check({"p0", "b0", "i0", "sub"} <= set(names), "ClassType attributes name the module's attributes")
    # the kind field: parameter, buffer and plain attribute differ, and every plain attribute agrees
    elem = [m.raw(b + i * size, size) for i in range(len(names))]
    idx = {n: i for i, n in enumerate(names)}
    cands = [k for k in range(0, name, 4)
             if len({struct.unpack_from("<I", elem[idx[n]], k)[0] for n in ("p0", "b0", "i0")}) == 3
             and struct.unpack_from("<I", elem[idx["i0"]], k)[0] == struct.unpack_from("<I", elem[idx["sub"]], k)[0]
             and all(struct.unpack_from("<I", x, k)[0] < 8 for x in elem)]  # fmt: skip
    kind = cal.field("classattr", "kind", one("ClassAttribute.kind_", cands[:1]), "u32")
    for label, n in (("PARAMETER", "p0"), ("BUFFER", "b0"), ("REGULAR", "i0")):
        cal.constants[f"ATTR_KIND_{label}"] = struct.unpack_from("<I", elem[idx[n]], kind)[0]
        cal.provenance[f"constants.ATTR_KIND_{label}"] = f"measured on attribute {n}"
    return names


def _slots(cal, m, obj: int, names: list[str], sm, sub_obj: int) -> None:
    cands = []
    for off in range(0, 256, 8):
        b, e, cap = m.words(obj + off, 3)
        if b and b <= e <= cap and (e - b) % len(names) == 0 and (e - b) // len(names) in (16, 24, 32):
            size = (e - b) // len(names)
            if m.word(b + names.index("p0") * size) == sm.p0._cdata and m.word(b + names.index("sub") * size) == sub_obj:
                cands.append((off, size))
    off, size = one("Object.slots_", cands[:1])
    cal.field("jitobject", "slots", off, "ptr")
    cal.constants["IVALUE_SIZE"] = size
    cal.provenance["constants.IVALUE_SIZE"] = "measured: slots_ bytes / ClassType attribute count"
    base = m.word(obj + off)
    raw = {n: m.raw(base + i * size, size) for i, n in enumerate(names)}
    cal.check(raw["b0"][:8] == struct.pack("<Q", sm.b0._cdata), "a buffer's slot holds its TensorImpl")
    cal.check(raw["i0"][:8] == struct.pack("<q", INT_VALUE), "an int's slot holds the int64")
    cal.check(raw["f0"][:8] == struct.pack("<d", FLOAT_VALUE), "a float's slot holds the double")
    kinds = ("p0", "i0", "f0", "s0", "sub", "training", "t0", "l0", "d0")
    tag_cands = [k for k in range(8, size, 4)
                 if len({struct.unpack_from("<I", raw[n], k)[0] for n in kinds}) == len(kinds)
                 and all(struct.unpack_from("<I", raw[n], k)[0] < 64 for n in kinds)]  # fmt: skip
    tag = cal.field("ivalue", "tag", one("IValue.tag", tag_cands[:1]), "u32")
    cal.field("ivalue", "payload", 0, "u64", "measured: slots hold the TensorImpl, int64 and double at offset 0")
    for label, n in (("TENSOR", "p0"), ("INT", "i0"), ("DOUBLE", "f0"), ("STRING", "s0"), ("OBJECT", "sub"),
                     ("BOOL", "training"), ("TUPLE", "t0"), ("LIST", "l0"), ("DICT", "d0")):  # fmt: skip
        cal.constants[f"IVALUE_TAG_{label}"] = struct.unpack_from("<I", raw[n], tag)[0]
        cal.provenance[f"constants.IVALUE_TAG_{label}"] = f"measured on attribute {n}"
    cal.check(cal.constants["IVALUE_TAG_TENSOR"] == struct.unpack_from("<I", raw["b0"], tag)[0], "buffer tag is Tensor")
    # None is the zero tag of c10's TORCH_FORALL_TAGS; checked: an unset optional attribute is not measurable here
    cal.constants["IVALUE_TAG_NONE"] = 0
    cal.provenance["constants.IVALUE_TAG_NONE"] = "c10/core/ivalue.h: None is the first tag"
    text = struct.unpack_from("<Q", raw["s0"], 0)[0]
    cal.field("conststring", "str", one("ConstantString.str_", [o] if (o := _string_at(m, text, LONG_TEXT)) is not None
                                        else []), "ptr")  # fmt: skip


K_INT = 0x5A5A4321  # a module constant (`__constants__`): kept by the ClassType, not in the Object's slots
K_TUPLE = (0x5A5A0003, 0x5A5A0004)
T_LONG = (0x5A5A0011, 0x5A5A0012, 0x5A5A0013, 0x5A5A0014)  # longer than a tuple's inline storage (3)
L_VALUES = [0x5A5A0021, 0x5A5A0022, 0x5A5A0023]


def _values_module(torch):
    """A module with constants, a short and a long tuple and a list of known ints (scripted from this file)."""

    class CalibValues(torch.nn.Module):
        __constants__ = ["k0", "kt"]

        def __init__(self) -> None:
            super().__init__()
            self.k0 = K_INT
            self.kt = K_TUPLE
            self.t2 = (T_LONG[0], T_LONG[1])
            self.t4 = T_LONG
            self.l3 = list(L_VALUES)

        def forward(self, x):
            return x + self.k0 + self.kt[0] + self.t2[0] + self.t4[0] + self.l3[0]

    return torch.jit.script(CalibValues())


def measure_jit_values(cal) -> None:
    """The ClassType's constants (`__constants__`: a name vector and an IValue vector) and the tuple and list
    IValues' element storage. A tuple keeps up to 3 elements inline (a count, then the IValues) and more in a
    vector (count 0): a scripted module's tuples were seen in the vector form and a `jit.load`ed module's short
    tuples inline, so both are measured, the second on the module saved and loaded again."""
    import io

    torch, m = cal.torch, cal.m
    size, tag_off = cal.constants["IVALUE_SIZE"], cal.off("ivalue", "tag")
    t_int, t_tuple = cal.constants["IVALUE_TAG_INT"], cal.constants["IVALUE_TAG_TUPLE"]
    sm = _values_module(torch)
    buf = io.BytesIO()
    torch.jit.save(sm, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    value = cal.off("pybind", "value")

    def obj_of(s) -> int:
        return m.word(m.word(id(s._c) + value) + cal.off("jitmodule", "object"))

    def ivalues(begin: int, n: int) -> list[tuple[int, int]]:
        raw = m.raw(begin, n * size)
        return [(struct.unpack_from("<Q", raw, i * size)[0], struct.unpack_from("<I", raw, i * size + tag_off)[0])
                for i in range(n)]  # fmt: skip

    objs = [obj_of(sm), obj_of(loaded)]
    cts = [m.word(o + cal.off("jitobject", "type")) for o in objs]

    def names_at(ct: int, off: int) -> list[str] | None:
        b, e, cap = m.words(ct + off, 3)
        if not (b and b <= e <= cap and 0 < e - b <= 32 * 16 and (e - b) % 32 == 0 and m.readable(b, e - b)):
            return None
        got = [_identifier(m, b + i * 32) for i in range((e - b) // 32)]
        return got if all(got) else None  # type: ignore[return-value]

    names_off = common("ClassType.constantNames_", *[[o for o in range(0, 512, 8) if (names_at(ct, o) or []) and
                                                      sorted(names_at(ct, o) or []) == ["k0", "kt"]] for ct in cts])  # fmt: skip
    cal.field("classtype", "constant_names", names_off, "ptr")
    cal.constants["STDSTRING_SIZE"] = 32
    cal.provenance["constants.STDSTRING_SIZE"] = "measured: the constant name vector's element size (two names)"

    def values_at(ct: int, off: int) -> list[tuple[int, int]] | None:
        b, e, cap = m.words(ct + off, 3)
        if not (b and b <= e <= cap and e - b == 2 * size and m.readable(b, e - b)):
            return None
        return ivalues(b, 2)

    def constants(ct: int, off: int) -> dict[str, tuple[int, int]]:
        return dict(zip(names_at(ct, names_off) or [], values_at(ct, off) or []))

    values_off = common("ClassType.constantValues_", *[[o for o in range(0, 512, 8) if o != names_off
                                                        and constants(ct, o).get("k0") == (K_INT, t_int)
                                                        and constants(ct, o).get("kt", (0, 0))[1] == t_tuple]
                                                       for ct in cts])  # fmt: skip
    cal.field("classtype", "constant_values", values_off, "ptr")
    slots = {}
    for o, ct, s in zip(objs, cts, (sm, loaded)):
        attrs = _attribute_names_of(cal, m, ct)
        b = m.word(o + cal.off("jitobject", "slots"))
        slots[s is sm] = dict(zip(attrs, ivalues(b, len(attrs))))
    # a tuple: an intrusive_ptr target (vtable, counts), then the inline count (0: the elements are in a vector)
    scripted_t4 = slots[True]["t4"][0]
    vec = [o for o in range(16, 64, 8) if m.word(scripted_t4 + o - 8) == 0
           and _ivalue_vector(m, scripted_t4 + o, size, tag_off) == [(v, t_int) for v in T_LONG]]  # fmt: skip
    elements = cal.field("ivaluetuple", "elements", one("ivalue::Tuple elements", vec[:1]), "ptr")
    cal.field("ivaluetuple", "inline_size", elements - 8, "u64", "measured: 0 before a tuple's element vector")
    cal.constants["TUPLE_INLINE_MAX"] = 3
    cal.provenance["constants.TUPLE_INLINE_MAX"] = "ATen/core/ivalue_inl.h TupleElements: 3 IValues inline"
    short = [slots[s]["t2"][0] for s in (True, False)] + [constants(ct, values_off)["kt"][0] for ct in cts]
    want = {(T_LONG[0], T_LONG[1]), K_TUPLE}
    for t in short:  # each short tuple, inline or not, reads back as its ints
        n = m.word(t + elements - 8)
        got = ivalues(t + elements, n) if 0 < n <= 3 else _ivalue_vector(m, t + elements, size, tag_off)
        cal.check(tuple(v for v, _ in got) in want and all(k == t_int for _, k in got), "a short tuple's ints")
    cal.check(any(0 < m.word(t + elements - 8) <= 3 for t in short), "a loaded short tuple is stored inline")
    lists = [slots[s]["l3"][0] for s in (True, False)]
    cands = [[o for o in range(16, 64, 8) if _ivalue_vector(m, lst + o, size, tag_off) == [(v, t_int) for v in L_VALUES]]
             for lst in lists]  # fmt: skip
    cal.field("ivaluelist", "elements", common("c10::detail::ListImpl.list", *cands), "ptr")


def _ivalue_vector(m, addr: int, size: int, tag_off: int) -> list[tuple[int, int]] | None:
    b, e, cap = m.words(addr, 3)
    if not (b and b <= e <= cap and 0 < e - b <= 64 * size and (e - b) % size == 0 and m.readable(b, e - b)):
        return None
    raw = m.raw(b, e - b)
    return [(struct.unpack_from("<Q", raw, i)[0], struct.unpack_from("<I", raw, i + tag_off)[0])
            for i in range(0, e - b, size)]  # fmt: skip


def _attribute_names_of(cal, m, ct: int) -> list[str]:
    b, e = m.words(ct + cal.off("classtype", "attributes"), 2)
    size, name = cal.constants["CLASSATTR_SIZE"], cal.off("classattr", "name")
    return [m.raw(*m.words(b + i * size + name, 2)).decode() for i in range((e - b) // size)]
