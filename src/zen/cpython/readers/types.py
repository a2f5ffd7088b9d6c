"""Reader for type objects (PyTypeObject / PyHeapTypeObject), static and heap.

Heap types (classes from `class` statements) carry their name and qualname as str objects
(ht_name, ht_qualname) and their module in `__dict__['__module__']`. Static types (defined in C)
only have `tp_name`, a C string "module.Name" (builtins have no dot). Results are cached per
address: a census touches the same few thousand types millions of times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zen.runtime.errors import MemoryReadError, ObjectError, ZenError

if TYPE_CHECKING:
    from zen.cpython.facade import ImageReader


@dataclass
class TypeInfo:
    addr: int
    name: str
    qualname: str
    module: str
    flags: int
    basicsize: int
    itemsize: int
    dictoffset: int
    weaklistoffset: int
    base: int
    bases: list[int]
    mro_addrs: list[int]  # (not "mro": a dataclass would take type.mro for a default)
    dict_addr: int
    is_heap: bool
    metatype: int
    cached_keys: int = 0
    slot_names: list[str] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return self.qualname if self.module == "builtins" else f"{self.module}.{self.qualname}"

    def has_flag(self, bit: int) -> bool:
        return bool(self.flags & bit)


def read_type(ip: ImageReader, addr: int) -> TypeInfo:
    cached = ip._type_cache.get(addr)
    if cached is not None:
        return cached  # type: ignore[return-value]
    ip.check_type(addr)
    P = ip.P
    T = P.type
    try:
        raw = ip.space.read(addr, T.size)
    except MemoryReadError:
        # Static types are smaller than heap types; read just the PyTypeObject part.
        try:
            raw = ip.space.read(addr, P.heaptype.ht_name)
        except MemoryReadError:
            raise ObjectError(addr, "type object not in the image") from None
    u = int.from_bytes

    def word(off: int) -> int:
        return u(raw[off : off + 8], "little")

    def sword(off: int) -> int:
        return u(raw[off : off + 8], "little", signed=True)

    flags = word(T.tp_flags)
    is_heap = bool(flags & P.c("TPFLAGS_HEAPTYPE"))
    limits = ip.limits
    basicsize, itemsize = sword(T.tp_basicsize), sword(T.tp_itemsize)
    if not (0 < basicsize < 1 << 24 and 0 <= itemsize < 1 << 16):
        raise ObjectError(addr, f"implausible type sizes {basicsize}/{itemsize}")
    info = TypeInfo(
        addr=addr,
        name="",
        qualname="",
        module="builtins",
        flags=flags,
        basicsize=basicsize,
        itemsize=itemsize,
        dictoffset=sword(T.tp_dictoffset),
        weaklistoffset=sword(T.tp_weaklistoffset),
        base=word(T.tp_base),
        bases=[],
        mro_addrs=[],
        dict_addr=word(T.tp_dict),
        is_heap=is_heap,
        metatype=word(ip.P.object.ob_type),
    )
    # Cache before following pointers: MRO tuples refer back to this type.
    ip._type_cache[addr] = info
    try:
        if is_heap and len(raw) >= T.size:
            H = P.heaptype
            info.name = ip.str(word(H.ht_name))
            info.qualname = ip.str(word(H.ht_qualname))
            info.cached_keys = word(H.ht_cached_keys)
            slots = word(H.ht_slots)
            if slots and not ip.is_none(slots):
                from zen.cpython.readers.containers import read_tuple

                info.slot_names = [ip.str(a) for a in read_tuple(ip, slots)]
            info.module = _module_from_dict(ip, info.dict_addr) or "builtins"
        else:
            cname = ip.space.cstring(word(T.tp_name), 1024).decode("utf-8", "replace")
            mod, _, qual = cname.rpartition(".")
            info.name = info.qualname = qual
            info.module = mod or "builtins"
        from zen.cpython.readers.containers import read_tuple

        bases = word(T.tp_bases)
        mro = word(T.tp_mro)
        info.bases = read_tuple(ip, bases, limit=limits.max_mro) if bases else []
        info.mro_addrs = read_tuple(ip, mro, limit=limits.max_mro) if mro else [addr]
    except ZenError:
        del ip._type_cache[addr]
        raise
    return info


def _module_from_dict(ip: ImageReader, dict_addr: int) -> str | None:
    if not dict_addr:
        return None
    from zen.cpython.readers.dicts import dict_get

    v = dict_get(ip, dict_addr, "__module__")
    if v is None or ip.kind(v) != "str":
        return None
    return ip.str(v)


def mro_names(ip: ImageReader, t: TypeInfo) -> list[str]:
    """Full names of the classes in a type's MRO (unreadable entries are shown by address)."""
    out = []
    for a in t.mro_addrs:
        try:
            out.append(read_type(ip, a).full_name)
        except ZenError:
            out.append(f"<unreadable type {a:#x}>")
    return out


def is_subtype(ip: ImageReader, taddr: int, base_full_name: str) -> bool:
    """True if a class named `base_full_name` is in the MRO of `taddr`."""
    t = read_type(ip, taddr)
    for a in t.mro_addrs:
        try:
            if read_type(ip, a).full_name == base_full_name:
                return True
        except ZenError:
            continue
    return False
