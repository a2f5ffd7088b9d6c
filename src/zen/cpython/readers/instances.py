"""Reader for instances of Python classes: their attributes, wherever CPython put them.

Attributes of an instance can live in four places, and a forensic reader must look in all:

* a *managed dict* (3.11+, Py_TPFLAGS_MANAGED_DICT): a pointer stored before the object header;
* *inline values* that were never turned into a dict: a values array (pointer before the header in
  3.11/3.12) whose keys are the class's shared keys (`ht_cached_keys`), insertion order in its
  prefix — most instances in a real process are like this, since nobody asked for `__dict__`;
* a classic `__dict__` at `tp_dictoffset` (extension types, subclasses of variable-size builtins);
* `__slots__`: member descriptors in the class dicts give the offset of each slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zen.cpython.readers.dicts import DictKeys, read_dict, read_split_values
from zen.cpython.readers.types import read_type
from zen.runtime.errors import MemoryReadError, ObjectError, ZenError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


@dataclass
class InstanceInfo:
    addr: int
    type: int
    type_name: str
    attrs: dict[str, int] = field(default_factory=dict)  # name -> value address
    slots: dict[str, int] = field(default_factory=dict)  # name -> value address (0 = unset)
    dict_addr: int = 0  # materialised __dict__, if any
    storage: str = "none"  # "managed-dict", "inline-values", "dict-offset", "none"


def _names(ip: ImageReader, pairs: list[tuple[int, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in pairs:
        if ip.kind(k) == "str":
            out[ip.str(k)] = v
    return out


def read_instance(ip: ImageReader, addr: int) -> InstanceInfo:
    tp = ip.type_of(addr)
    t = read_type(ip, tp)
    info = InstanceInfo(addr, tp, t.full_name)
    c = ip.P.constants
    if t.flags & c.get("TPFLAGS_MANAGED_DICT", 0):  # 3.11+
        dict_ptr, values = _managed(ip, addr, t.flags, t.basicsize)
        if dict_ptr:
            info.dict_addr = dict_ptr
            info.storage = "managed-dict"
            info.attrs = _names(ip, read_dict(ip, dict_ptr))
        elif values:
            if not t.cached_keys:
                raise ObjectError(addr, "inline values but the class has no shared keys")
            keys = DictKeys(ip, t.cached_keys, addr)
            info.storage = "inline-values"
            info.attrs = _names(ip, read_split_values(ip, values, keys, addr))
    elif t.dictoffset:
        off = t.dictoffset
        if off < 0:
            size = abs(ip.space.i64(addr + ip.P.varobject.ob_size))
            total = t.basicsize + size * t.itemsize
            off += (total + 7) & ~7
        dict_ptr = ip.ptr(addr + off)
        if dict_ptr:
            info.dict_addr = dict_ptr
            info.storage = "dict-offset"
            info.attrs = _names(ip, read_dict(ip, dict_ptr))
    info.slots = read_slots(ip, addr, t.mro_addrs)
    return info


def _managed(ip: ImageReader, addr: int, flags: int, basicsize: int) -> tuple[int, int]:
    """(dict, values) of an instance with a managed dict; either may be 0.

    3.11: two pointers before the object. 3.12: one pointer that is the dict, or the values
    address minus one (low bit set). 3.13+: the dict pointer before the object, the values inline
    after the header (only while their `valid` byte says they are the attributes)."""
    I, c = ip.P.instance, ip.P.constants
    try:
        dict_ptr = ip.ptr(addr + I.dict_ptr)
        if I.has("values_ptr"):
            values = ip.ptr(addr + I.values_ptr)
            if c.get("INSTANCE_VALUES_TAGGED"):
                if dict_ptr & 1:
                    return 0, dict_ptr + 1
                return dict_ptr, 0
            return dict_ptr, values
        if I.has("inline_values") and flags & c.get("TPFLAGS_INLINE_VALUES", 0):
            # after the instance's own fields: 3.13 only inlines for basicsize 16, 3.14 for any
            at = addr + basicsize
            valid = ip.space.read(at + ip.P.dictvalues.valid, 1)[0]
            return dict_ptr, (at if valid else 0)
        return dict_ptr, 0
    except MemoryReadError:
        raise ObjectError(addr, "managed dict pointers around the object are not in the image") from None


def read_slots(ip: ImageReader, addr: int, mro: list[int]) -> dict[str, int]:
    """Values of `__slots__` members defined by heap classes in `mro` (0 for unset slots).

    Where each class keeps its members (`_slot_layout`) is read once per class and image, not once per
    instance: the encoder meets thousands of instances of a few slotted classes (GPT-2's class records:
    1,930 instances, 33,000 reads of the same class dicts, 40% of the records' time). What an instance
    gives, and which error stops it, are as when the class dict was read for each instance."""
    out: dict[str, int] = {}
    if ip.wk.types.get("member_descriptor") is None:
        return out
    layouts = ip.census_memo.setdefault("slot_layouts", {})
    for cls in mro:
        layout = layouts.get(cls)
        if layout is None:
            layout = layouts[cls] = _slot_layout(ip, cls)
        members, stop = layout
        for name, offset in members:
            out[name] = ip.ptr(addr + offset)
        if stop is not None:
            offset, error = stop
            if offset is not None:  # the member's value was read before its name failed
                ip.ptr(addr + offset)
            raise error.with_traceback(None)
    return out


def _slot_layout(ip: ImageReader, cls: int) -> tuple[list[tuple[str, int]], tuple[int | None, ZenError] | None]:
    """`cls`'s own slot members, in its dict's order, as (name, offset in an instance); and where reading them
    stopped: (the offset of the member whose value an instance reads before the error, or None; the error)."""
    md_kind = ip.wk.types["member_descriptor"]
    MD, MDef = ip.P.memberdescr, ip.P.memberdef
    t_object_ex = ip.P.constants.get("T_OBJECT_EX", 16)
    try:
        ct = read_type(ip, cls)
    except ZenError:
        return [], None
    if not ct.is_heap or not ct.slot_names or not ct.dict_addr:
        return [], None
    members: list[tuple[str, int]] = []
    offset = None
    try:
        for k, v in read_dict(ip, ct.dict_addr):
            offset = None
            if ip.kind(k) != "str" or ip.header(v)[1] != md_kind:
                continue
            if ip.ptr(v + MD.d_type) != cls:
                continue
            mdef = ip.ptr(v + MD.d_member)
            at = ip.space.i64(mdef + MDef.offset)
            mtype = ip.space.u32(mdef + MDef.type)
            if mtype not in (t_object_ex, 6) or not 0 < at < ct.basicsize:  # T_OBJECT_EX / T_OBJECT
                continue
            offset = at  # an instance reads this member's value first, then its name
            members.append((ip.str(k), at))
    except ZenError as exc:
        return members, (offset, exc)
    return members, None
