"""Tensors whose state is more than one storage: wrapper subclasses and Parameter subclasses, read in parts.

Why: quantized models keep their weights in tensor subclasses. A *wrapper* subclass (torchao's `Int8Tensor`,
optimum-quanto's `WeightQBytesTensor`, NF4, DTensor-style: PyTorch's `__tensor_flatten__` protocol) has an
outer TensorImpl with no storage of its own; its bytes are in *inner* tensors held as attributes (`qdata`,
`scale`, `zero_point`; `_data`, `_scale`), its metadata in other attributes (block size, target dtype, qtype).
A *Parameter subclass* (bitsandbytes' `Int8Params`, `Params4bit`) has its own storage (the int8 or packed
4-bit data) and keeps the rest in attributes (`SCB`, `quant_state` with absmax and the quantization map).

Both are read the same way, without running the subclass's code (`__tensor_flatten__` is code in the image):
every tensor among the object's attributes is an inner tensor, read bit-exact like any other and written to
the weights file as `KEY.NAME` (quanto's own state_dict names; recursively for nested subclasses); the other
attributes are encoded with the module-state encoder (`state.py`), tensors inside them (a `quant_state`'s
absmax) becoming extra tensors. The outer record is `composite`: its data are its parts, and `reuse` rebuilds
the object of the same class around them (`reuse/graph.py`).
"""

from __future__ import annotations

from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import dict_get
from zen.cpython.readers.instances import read_instance
from zen.cpython.readers.types import TypeInfo
from zen.frontends.pytorch.mr import TensorSlot, tensor_record
from zen.frontends.pytorch.tensors import TensorReader
from zen.runtime.errors import ZenError

TENSOR_TYPES = ("torch.Tensor", "torch._C.TensorBase")
MAX_NEST = 4  # a subclass inside a subclass inside ... (torchao's older AQT: tensor_impl -> int_data)
MAX_PARTS = 32  # inner tensors of one object
COMPOSITE = "composite"


class ClassLookup:
    """Which class in a type's MRO defines a name, read from the type dicts in the image (cached)."""

    def __init__(self, ip: Interpreter) -> None:
        self.ip = ip
        self._cache: dict[tuple[int, str, str], str | None] = {}

    @classmethod
    def shared(cls, ip: Interpreter) -> ClassLookup:
        """One lookup (and cache) per interpreter."""
        return ip.census_memo.setdefault("class_lookup", cls(ip))  # type: ignore[return-value]

    def definer(self, t: TypeInfo, name: str, stop: tuple[str, ...]) -> str | None:
        """Full name of the first class in `t`'s MRO (before any class named in `stop`) defining `name`."""
        key = (t.addr, name, stop[0])
        if key not in self._cache:
            self._cache[key] = self._find(t, name, stop)
        return self._cache[key]

    def _find(self, t: TypeInfo, name: str, stop: tuple[str, ...]) -> str | None:
        for a in t.mro_addrs[:64]:
            try:
                c = self.ip.type_info(a)
                if c.full_name in stop:
                    return None
                if c.dict_addr and dict_get(self.ip, c.dict_addr, name) is not None:
                    return c.full_name
            except ZenError:
                return None
        return None

    def mro_names(self, t: TypeInfo) -> set[str]:
        names = set()
        for a in t.mro_addrs[:64]:
            try:
                names.add(self.ip.type_info(a).full_name)
            except ZenError:
                break
        return names


def inner_tensors(ip: Interpreter, addr: int, tensor_types: set[int]) -> list[tuple[str, int]]:
    """(attribute name, tensor address) of the tensors an object holds in its attributes, in insertion order."""
    out = []
    for name, v in read_instance(ip, addr).attrs.items():
        try:
            if ip.type_of(v) in tensor_types:
                out.append((name, v))
        except ZenError:
            continue
    return out


def expand(ip: Interpreter, reader: TensorReader, slot: TensorSlot, tensor_types: set[int], wrapper: bool,
           depth: int = 0, seen: dict[int, str] | None = None) -> list[TensorSlot]:  # fmt: skip
    """The slots of `slot`'s inner tensors (recursively), marking `slot` composite. `wrapper`: the outer object
    has no storage of its own (its data are the parts); else its own data stays the record's (a Parameter
    subclass) and only its attributes are parts. Raises ZenError when the parts cannot be read. `seen`: objects
    already expanded (shared by a model's walk): a hostile image's subclasses that hold each other are expanded
    once, so the parts stay bounded by the objects the image holds, never multiplied by the nesting."""
    seen = {} if seen is None else seen
    seen.setdefault(slot.addr, slot.key)
    parts = inner_tensors(ip, slot.addr, tensor_types)
    if len(parts) > MAX_PARTS:
        raise ZenError(f"{slot.key}: {len(parts)} inner tensors (more than {MAX_PARTS})")
    if wrapper and not parts:
        raise ZenError(f"{slot.key}: a tensor subclass with no inner tensor among its attributes")
    rec = slot.record
    rec.components = {name: f"{slot.key}.{name}" for name, _ in parts}
    if wrapper:
        rec.status = COMPOSITE
        rec.note = f"a {rec.python_type} tensor subclass: its data are its inner tensors ({', '.join(rec.components)})"
    out: list[TensorSlot] = []
    for name, a in parts:
        key = f"{slot.key}.{name}"
        try:
            meta = reader.meta(a)
            sub = TensorSlot(key, a, "inner", meta, tensor_record(key, "inner", a, meta, reader=reader))
        except ZenError as exc:
            sub = TensorSlot(key, a, "inner", None, tensor_record(key, "inner", a, None, str(exc)))
        out.append(sub)
        if sub.meta is None or not is_wrapper(ip, a):
            continue
        if a in seen:  # the same subclass object, read where it was first met: not read (and counted) again
            sub.record.status, sub.record.tied_to = COMPOSITE, seen[a]
            sub.record.note = f"the same {sub.record.python_type} object as {seen[a]}, whose parts are read there"
        elif depth >= MAX_NEST:
            sub.record.status = "subclass"
            sub.record.note = f"a tensor subclass nested deeper than {MAX_NEST} levels of subclasses: its parts were not read"
        else:
            out += expand(ip, reader, sub, tensor_types, True, depth + 1, seen)
    return out


def is_wrapper(ip: Interpreter, addr: int) -> bool:
    """Whether the tensor object's class implements `__tensor_flatten__` (below torch.Tensor)."""
    try:
        t = ip.type_info(ip.type_of(addr))
    except ZenError:
        return False
    if t.full_name in ("torch.Tensor", "torch.nn.parameter.Parameter"):
        return False
    return ClassLookup.shared(ip).definer(t, "__tensor_flatten__", TENSOR_TYPES) is not None
