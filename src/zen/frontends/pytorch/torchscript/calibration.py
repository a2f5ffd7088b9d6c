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
