"""TorchScript modules read from memory: the C++ `torch::jit::Module` tree behind a `ScriptModule`'s `_c`.

A scripted, traced or `torch.jit.load`ed module keeps its parameters, buffers, submodules and attributes in a
`c10::ivalue::Object`: one IValue per attribute (`slots_`), named and kinded (parameter, buffer, plain attribute) by
its `ClassType`. The layout is measured per torch version (`calibration.py` here, `zen profile torch`); a profile
without it makes TorchScript state honestly unread, never guessed.

The tree is read into the same node shape `ModuleIndex` has (`JitIndex`), keyed by the C++ Object's address, with
tensors named by their TensorImpl (`ImplReader` reads those), so the MR, the tensor files and the case contract are
the eager path's. Every walk is bounded: slots per object, names, nodes, depth; each Object is read once.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from zen.cpython.interp import Interpreter
from zen.cpython.readers.instances import read_instance
from zen.frontends.pytorch.modules import ModuleIndex, ModuleNode
from zen.frontends.pytorch.profile import TorchProfile
from zen.frontends.pytorch.tensors import TensorMeta, TensorReader
from zen.runtime.errors import ObjectError, ZenError

JIT_STRUCTS = ("pybind", "jitmodule", "jitobject", "ivalue", "classtype", "classattr", "stdstring", "conststring")
MAX_SLOTS = 65_536  # attributes of one TorchScript class
MAX_NAME = 4096  # bytes of an attribute or class name
MAX_TEXT = 1 << 20  # bytes of a string attribute
MAX_NODES = 200_000  # TorchScript modules below one root
SCRIPT_MODULE = "torch.jit._script.ScriptModule"
PLAIN_TAGS = ("NONE", "BOOL", "INT", "DOUBLE", "STRING")
CONTAINER_TAGS = ("TUPLE", "LIST", "DICT")  # hyper-parameters (kernel sizes, paddings); dicts are not decoded yet
MAX_ITEMS = 4096  # elements of one tuple or list attribute
MAX_NEST = 4  # tuples and lists inside each other
VALUE_STRUCTS = ("ivaluetuple", "ivaluelist")  # and classtype.constant_names/constant_values (`zen profile torch`)


class NotDecoded(ObjectError):
    """A value of a kind zen does not decode (a dict, an object, a tensor inside a tuple): named, never guessed."""


class JitLayoutMissing(ZenError):
    pass


@dataclass(frozen=True)
class JitType:
    """What `ModuleRecord` and `RootRecord` need of a class: the TorchScript name, demangled to the eager one."""

    module: str
    qualname: str
    script_name: str

    @property
    def full_name(self) -> str:
        return f"{self.module}.{self.qualname}" if self.module else self.qualname


@dataclass
class JitNode(ModuleNode):
    """A TorchScript module: `ModuleNode`'s fields (tensors are TensorImpl addresses) plus what its slots held."""

    values: dict[str, object] = field(default_factory=dict)  # plain attributes (tuples and lists too): name -> value
    constants: dict[str, object] = field(default_factory=dict)  # the class's `__constants__`: name -> value
    unregistered: list[str] = field(default_factory=list)  # plain attributes holding tensors
    containers: dict[str, str] = field(default_factory=dict)  # tuple, list and dict attributes: name -> kind
    other: dict[str, str] = field(default_factory=dict)  # attributes that may hold state zen did not read: name -> what


def demangle(script_name: str) -> JitType:
    """`__torch__.torch.nn.modules.container.___torch_mangle_8.Sequential` -> torch.nn.modules.container.Sequential."""
    atoms = [a for a in script_name.split(".") if a and not a.startswith("___torch_mangle_")]
    if atoms and atoms[0] == "__torch__":
        atoms = atoms[1:]
    if not atoms:
        return JitType("", script_name, script_name)
    # TorchScript names a class of `__main__` by its bare name (`__torch__.Net`)
    return JitType(".".join(atoms[:-1]) or "__main__", atoms[-1], script_name)


def has_jit_layout(tp: TorchProfile) -> bool:
    return all(s in tp.structs for s in JIT_STRUCTS)


class JitReader:
    """Reads TorchScript Objects and their ClassTypes from an image with a measured layout."""

    def __init__(self, ip: Interpreter, tp: TorchProfile) -> None:
        if not has_jit_layout(tp):
            raise JitLayoutMissing(f"the torch {tp.version} layout profile ({tp.source}) has no TorchScript layout",
                                   "recalibrate it with `zen profile torch --python PYTHON_WITH_THAT_TORCH`")  # fmt: skip
        self.ip, self.tp = ip, tp
        self.c = tp.constants
        self.tags = {self.c[f"IVALUE_TAG_{k}"]: k for k in (*PLAIN_TAGS, *CONTAINER_TAGS, "TENSOR", "OBJECT")
                     if f"IVALUE_TAG_{k}" in self.c}  # fmt: skip
        self.kinds = {self.c[f"ATTR_KIND_{k}"]: k.lower() for k in ("PARAMETER", "BUFFER", "REGULAR")}
        self._types: dict[int, tuple[JitType, list[tuple[str, str]]]] = {}
        self._constants: dict[int, dict[str, object]] = {}
        self.decodes = all(s in tp.structs for s in VALUE_STRUCTS) and all(
            f in tp.structs["classtype"]._fields for f in ("constant_names", "constant_values"))  # fmt: skip
        self.inner_wrappers: set[int] = set()  # a traced module's `_actual_script_module`: the same model, not a root

    # -- Python side: the wrapper's `_c` -----------------------------------------------------
    def object_of(self, addr: int) -> int:
        """The C++ Object behind a Python ScriptModule (RecursiveScriptModule: `_c`; traced: `_actual_script_module`)."""
        ip = self.ip
        attrs = read_instance(ip, addr).attrs
        if "_c" not in attrs and "_actual_script_module" in attrs:
            self.inner_wrappers.add(attrs["_actual_script_module"])
            attrs = read_instance(ip, attrs["_actual_script_module"]).attrs
        c = attrs.get("_c")
        if c is None:
            raise ObjectError(addr, "a TorchScript module without `_c` (its C++ module)")
        value = ip.ptr(c + self.tp.pybind.value)
        obj = ip.ptr(value + self.tp.jitmodule.object)
        self.class_of(obj)  # validates: an Object whose type is a readable ClassType
        return obj

    # -- C++ side ----------------------------------------------------------------------------
    def string(self, addr: int, limit: int = MAX_NAME) -> str:
        S = self.tp.stdstring
        ptr, size = self.ip.space.u64(addr + S.data), self.ip.space.u64(addr + S.size)
        if size > limit:
            raise ObjectError(addr, f"std::string of {size:,} bytes (limit {limit:,})")
        return self.ip.space.read(ptr, size).decode("utf-8", "backslashreplace") if size else ""

    def class_of(self, obj: int) -> tuple[JitType, list[tuple[str, str]]]:
        """(class, [(attribute name, kind)]) of an Object, read once per ClassType."""
        ct = self.ip.ptr(obj + self.tp.jitobject.type)
        got = self._types.get(ct)
        if got is not None:
            return got
        C, A = self.tp.classtype, self.tp.classattr
        name = self.string(ct + C.name)
        if not name.startswith("__torch__"):
            raise ObjectError(obj, f"not a TorchScript module: its class is {name[:80]!r}")
        begin, end = self.ip.space.u64(ct + C.attributes), self.ip.space.u64(ct + C.attributes + 8)
        size = self.c["CLASSATTR_SIZE"]
        n, rest = divmod(end - begin, size)
        if rest or not 0 <= n <= MAX_SLOTS:
            raise ObjectError(ct, f"ClassType {name[:80]} with an implausible attribute vector ({end - begin} bytes)")
        raw = self.ip.space.read(begin, n * size) if n else b""
        attrs = []
        for i in range(n):
            kind = struct.unpack_from("<I", raw, i * size + A.kind)[0]
            if kind not in self.kinds:
                raise ObjectError(ct, f"ClassType {name[:80]} attribute {i} has an unknown kind {kind}")
            attrs.append((self.string(begin + i * size + A.name), self.kinds[kind]))
        got = (demangle(name), attrs)
        self._types[ct] = got
        return got

    def slots(self, obj: int, count: int) -> list[tuple[str | int, int]]:
        """(tag name, or the raw tag when zen does not decode it; payload) of each slot."""
        O, V = self.tp.jitobject, self.tp.ivalue
        begin, end = self.ip.space.u64(obj + O.slots), self.ip.space.u64(obj + O.slots + 8)
        size = self.c["IVALUE_SIZE"]
        if end - begin != count * size:
            raise ObjectError(obj, f"Object with {(end - begin) // max(size, 1)} slots for {count} attributes")
        raw = self.ip.space.read(begin, count * size) if count else b""
        out = []
        for i in range(count):
            tag = struct.unpack_from("<I", raw, i * size + V.tag)[0]
            payload = struct.unpack_from("<Q", raw, i * size + V.payload)[0]
            out.append((self.tags.get(tag, tag), payload))
        return out

    def value(self, tag: str | int, payload: int, depth: int = 0) -> object:
        """A plain IValue (None, bool, int, float, str) or a tuple or list of them, bounded; NotDecoded otherwise."""
        if tag in ("TUPLE", "LIST") and self.decodes and depth < MAX_NEST:
            items = [self.value(t, p, depth + 1) for t, p in self._elements(tag, payload)]
            return tuple(items) if tag == "TUPLE" else items
        if tag not in PLAIN_TAGS:
            raise NotDecoded(payload, f"a value of IValue tag {tag}" + (" nested too deep" if depth >= MAX_NEST else ""))
        if tag == "NONE":
            return None
        if tag == "BOOL":
            return bool(payload & 0xFF)
        if tag == "INT":
            return struct.unpack("<q", struct.pack("<Q", payload))[0]
        if tag == "DOUBLE":
            return struct.unpack("<d", struct.pack("<Q", payload))[0]
        return self.string(payload + self.tp.conststring.str, MAX_TEXT)  # STRING

    def _elements(self, tag: str, addr: int) -> list[tuple[str | int, int]]:
        """(tag, payload) of a tuple's or list's elements: a tuple keeps up to 3 inline (after their count), more in
        a vector (count 0); a list always in a vector."""
        if tag == "TUPLE":
            T = self.tp.ivaluetuple
            n = self.ip.space.u64(addr + T.inline_size)
            if n > self.c.get("TUPLE_INLINE_MAX", 3):
                raise ObjectError(addr, f"tuple with an inline count of {n:,}")
            if n:
                return self._ivalues(addr + T.elements, n)
            at = addr + T.elements
        else:
            at = addr + self.tp.ivaluelist.elements
        begin, end = self.ip.space.u64(at), self.ip.space.u64(at + 8)
        size = self.c["IVALUE_SIZE"]
        n, rest = divmod(end - begin, size)
        if rest or not 0 <= n <= MAX_ITEMS:
            raise ObjectError(addr, f"{tag.lower()} with an implausible element vector ({end - begin:,} bytes)")
        return self._ivalues(begin, n)

    def _ivalues(self, begin: int, n: int) -> list[tuple[str | int, int]]:
        size, V = self.c["IVALUE_SIZE"], self.tp.ivalue
        raw = self.ip.space.read(begin, n * size) if n else b""
        return [(self.tags.get(t := struct.unpack_from("<I", raw, i * size + V.tag)[0], t),
                 struct.unpack_from("<Q", raw, i * size + V.payload)[0]) for i in range(n)]  # fmt: skip

    def constants_of(self, obj: int) -> dict[str, object]:
        """The class's constants (`__constants__`: kernel sizes, strides, eps): name -> value, read once per
        ClassType; a constant zen does not decode maps to a NotDecoded."""
        ct = self.ip.ptr(obj + self.tp.jitobject.type)
        got = self._constants.get(ct)
        if got is not None:
            return got
        C, size = self.tp.classtype, self.c["IVALUE_SIZE"]
        nb, ne = self.ip.space.u64(ct + C.constant_names), self.ip.space.u64(ct + C.constant_names + 8)
        vb, ve = self.ip.space.u64(ct + C.constant_values), self.ip.space.u64(ct + C.constant_values + 8)
        ssize = self.c.get("STDSTRING_SIZE", 32)
        n, rest = divmod(ne - nb, ssize)
        if rest or not 0 <= n <= MAX_SLOTS or ve - vb != n * size:
            raise ObjectError(ct, f"ClassType with {ne - nb:,} bytes of constant names for {ve - vb:,} of values")
        got = {}
        for i, (tag, payload) in enumerate(self._ivalues(vb, n)):
            name = self.string(nb + i * ssize)
            try:
                got[name] = self.value(tag, payload)
            except ZenError as exc:
                got[name] = NotDecoded(payload, str(exc))
        self._constants[ct] = got
        return got

    def node(self, obj: int) -> JitNode:
        jt, attrs = self.class_of(obj)
        node = JitNode(obj, jt, {})  # type: ignore[arg-type]  # JitType stands in for TypeInfo
        for (name, kind), (tag, payload) in zip(attrs, self.slots(obj, len(attrs))):
            if tag == "TENSOR" and kind in ("parameter", "buffer"):
                (node.parameters if kind == "parameter" else node.buffers).append((name, payload))
            elif tag == "NONE" and kind in ("parameter", "buffer"):
                (node.parameters if kind == "parameter" else node.buffers).append((name, 0))
            elif tag == "OBJECT" and self._is_module(payload):
                node.children.append((name, payload))
            elif tag == "TENSOR":  # a plain attribute holding a tensor: not state (eager calls it unregistered)
                node.unregistered.append(name)
            elif kind in ("parameter", "buffer"):
                node.other[name] = f"a {kind} slot holding IValue tag {tag}, not a tensor"
            elif tag in PLAIN_TAGS or (tag in ("TUPLE", "LIST") and self.decodes):
                try:
                    node.values[name] = self.value(tag, payload)
                except ZenError as exc:
                    node.containers[name] = f"unreadable {str(tag).lower()}: {exc}"
            elif tag in CONTAINER_TAGS:
                node.containers[name] = tag.lower()
            elif tag == "OBJECT":
                node.other[name] = f"an instance of TorchScript class {self._class_name(payload)}"
            else:
                node.other[name] = f"a C++ value of IValue tag {tag} (custom class, capsule or other)"
        if self.decodes:
            for name, v in self.constants_of(obj).items():
                if isinstance(v, NotDecoded):
                    node.containers[name] = f"constant not decoded: {v.reason}"
                else:
                    node.constants[name] = v
        return node

    def _class_name(self, obj: int) -> str:
        try:
            return self.class_of(obj)[0].script_name
        except ZenError:
            return "?"

    def _is_module(self, obj: int) -> bool:
        """A submodule is an Object of a `__torch__` class with a `training` attribute (every nn.Module has one);
        other Objects (TorchScript classes) are attributes zen does not decode."""
        try:
            _, attrs = self.class_of(obj)
        except ZenError:
            return False
        return any(n == "training" for n, _ in attrs)


class JitIndex(ModuleIndex):
    """The TorchScript modules below some roots, in `ModuleIndex`'s shape (nodes keyed by C++ Object address)."""

    def __init__(self, jr: JitReader, roots: list[int], max_nodes: int = MAX_NODES) -> None:  # noqa: D107
        self.ip = jr.ip
        self.nodes: dict[int, ModuleNode] = {}
        self.errors: dict[int, str] = {}
        stack = list(roots)
        while stack and len(self.nodes) < max_nodes:
            obj = stack.pop()
            if obj in self.nodes or obj in self.errors:
                continue
            try:
                node = jr.node(obj)
            except ZenError as exc:
                self.errors[obj] = str(exc)
                continue
            self.nodes[obj] = node
            stack += [c for _, c in node.children if c]
        if stack:
            self.errors[stack[-1]] = f"more than {max_nodes:,} TorchScript modules: the walk stopped"


class ImplReader(TensorReader):
    """A TensorReader for tensors named by their TensorImpl (TorchScript slots hold no Python tensor)."""

    def __init__(self, base: TensorReader) -> None:  # noqa: D107
        self.__dict__.update(base.__dict__)

    def meta(self, addr: int) -> TensorMeta:
        meta = self.impl_meta(addr, addr)
        meta.python_type = "TensorImpl (TorchScript)"
        return meta
