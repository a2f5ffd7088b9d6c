"""A parser for BTF, the kernel's compact type information (Documentation/bpf/btf.rst).

Every kernel built with CONFIG_DEBUG_INFO_BTF (Debian, Ubuntu, Fedora, RHEL since ~5.x) carries
its own types in a `.BTF` ELF section, and exposes it at /sys/kernel/btf/vmlinux. That is enough
to describe every structure Volatility reads (task_struct, mm_struct, maple tree nodes, ...)
without DWARF debug packages, which is why zen builds its kernel symbol files from it.

The blob is untrusted input (it may come from a seized machine), so every count and offset is
checked against the blob's length before it is used; a bad blob raises `BtfError`, never an
IndexError or a struct.error. Parsing is one pass of `struct.unpack_from` over the type section
plus one bulk `iter_unpack` per member list: the 4-5 MB / 100k-type BTF of a distro kernel takes
about half a second.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from zen.runtime.errors import KernelSymbolsError

BTF_MAGIC = 0xEB9F
MAX_TYPES = 4_000_000  # a kernel has ~130k; far above any real blob, bounds a hostile one
MAX_STRING = 4096

# Kinds (include/uapi/linux/btf.h)
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
VOLATILE, CONST, RESTRICT, FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT = 9, 10, 11, 12, 13, 14, 15, 16
DECL_TAG, TYPE_TAG, ENUM64 = 17, 18, 19
KIND_NAMES = {
    0: "void",
    INT: "int",
    PTR: "ptr",
    ARRAY: "array",
    STRUCT: "struct",
    UNION: "union",
    ENUM: "enum",
    FWD: "fwd",
    TYPEDEF: "typedef",
    VOLATILE: "volatile",
    CONST: "const",
    RESTRICT: "restrict",
    FUNC: "func",
    FUNC_PROTO: "func_proto",
    VAR: "var",
    DATASEC: "datasec",
    FLOAT: "float",
    DECL_TAG: "decl_tag",
    TYPE_TAG: "type_tag",
    ENUM64: "enum64",
}
# Kinds whose third header word is a size (the others hold a type id there).
SIZED_KINDS = frozenset({INT, STRUCT, UNION, ENUM, DATASEC, FLOAT, ENUM64})
# Kinds that only qualify or rename another type: a reader looks through them.
QUALIFIER_KINDS = frozenset({TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG})

# BTF_INT_ENCODING bits
INT_SIGNED, INT_CHAR, INT_BOOL = 1, 2, 4


class BtfError(KernelSymbolsError):
    """A BTF blob is missing, truncated or malformed."""


@dataclass(slots=True)
class Member:
    """A struct/union member: bit offset from the start of the struct, bit size if a bitfield."""

    name: str
    type: int
    bit_offset: int
    bit_size: int  # 0 unless a bitfield (kind_flag set on the struct)


@dataclass(slots=True)
class BtfType:
    """One BTF type record. Which fields mean something depends on `kind` (see btf.rst).

    `size` is the byte size for sized kinds; `ref` the referenced type id for the others (PTR,
    TYPEDEF, qualifiers, FUNC, VAR, FUNC_PROTO's return type). ARRAY keeps its element type in
    `ref` and count in `count`. `members` holds struct/union members, `values` enum constants,
    `params` function parameters, `vars` a DATASEC's (type id, offset, size) entries."""

    id: int
    kind: int
    name: str
    size: int = 0
    ref: int = 0
    kind_flag: bool = False
    count: int = 0
    encoding: int = 0  # INT: BTF_INT_ENCODING bits
    bits: int = 0  # INT: number of value bits
    bit_shift: int = 0  # INT: BTF_INT_OFFSET (old-style bitfields without kind_flag)
    linkage: int = 0  # VAR / FUNC linkage
    members: list[Member] | None = None
    values: list[tuple[str, int]] | None = None
    params: list[tuple[str, int]] | None = None
    vars: list[tuple[int, int, int]] | None = None

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, f"kind{self.kind}")


class Btf:
    """All types of one BTF blob, indexed by type id (id 0 is `void`)."""

    def __init__(self, types: list[BtfType], endian: str) -> None:
        self.types = types
        self.endian = endian  # "little" / "big"
        self._by_name: dict[tuple[int, str], list[int]] | None = None

    def __len__(self) -> int:
        return len(self.types)

    def __getitem__(self, type_id: int) -> BtfType:
        if not 0 <= type_id < len(self.types):
            raise BtfError(f"BTF type id {type_id} out of range (blob has {len(self.types) - 1} types)")
        return self.types[type_id]

    def find(self, name: str, kind: int | None = None) -> list[BtfType]:
        """Types called `name` (of `kind` if given), in id order."""
        if self._by_name is None:
            idx: dict[tuple[int, str], list[int]] = {}
            for t in self.types[1:]:
                if t.name:
                    idx.setdefault((t.kind, t.name), []).append(t.id)
            self._by_name = idx
        kinds = [kind] if kind is not None else list(KIND_NAMES)
        out: list[int] = []
        for k in kinds:
            out.extend(self._by_name.get((k, name), ()))
        return [self.types[i] for i in sorted(out)]

    def struct(self, name: str) -> BtfType:
        """The struct (or union) called `name`; the largest if several differ."""
        cands = [t for t in self.find(name, STRUCT) + self.find(name, UNION) if t.members is not None]
        if not cands:
            raise BtfError(f"BTF has no struct {name}")
        return max(cands, key=lambda t: (t.size, -t.id))

    def resolve(self, type_id: int, limit: int = 64) -> BtfType:
        """Look through typedefs and qualifiers (bounded: a hostile blob may loop)."""
        t = self[type_id]
        for _ in range(limit):
            if t.kind not in QUALIFIER_KINDS:
                return t
            t = self[t.ref]
        raise BtfError(f"BTF type {type_id}: qualifier/typedef chain longer than {limit} (a loop?)")

    def sizeof(self, type_id: int, limit: int = 64) -> int:
        """Byte size of a type (pointers 8; arrays count * element), bounded in depth."""
        if limit <= 0:
            raise BtfError(f"BTF type {type_id}: nesting too deep")
        t = self.resolve(type_id)
        if t.kind == PTR:
            return 8
        if t.kind == ARRAY:
            return t.count * self.sizeof(t.ref, limit - 1)
        return t.size if t.kind in SIZED_KINDS else 0

    def member_offsets(self, struct_name: str) -> dict[str, tuple[int, int]]:
        """{member: (byte offset, byte size)} of a struct, anonymous members flattened the way C
        (and Volatility's ISF reader) see them. For checks and tests."""
        out: dict[str, tuple[int, int]] = {}

        def walk(t: BtfType, base: int, depth: int) -> None:
            if depth > 32:
                raise BtfError(f"struct {struct_name}: anonymous members nested too deep")
            for m in t.members or ():
                off = base + m.bit_offset // 8
                if not m.name:
                    inner = self.resolve(m.type)
                    if inner.kind in (STRUCT, UNION):
                        walk(inner, off, depth + 1)
                    continue
                out.setdefault(m.name, (off, self.sizeof(m.type)))

        walk(self.struct(struct_name), 0, 0)
        return out


def _string_reader(strings: bytes):
    cache: dict[int, str] = {}

    def name(off: int) -> str:
        s = cache.get(off)
        if s is not None:
            return s
        if not 0 <= off < len(strings):
            raise BtfError(f"BTF string offset {off} outside the string section ({len(strings)} bytes)")
        end = strings.find(b"\x00", off, off + MAX_STRING)
        if end < 0:
            raise BtfError(f"BTF string at {off} is not NUL-terminated within {MAX_STRING} bytes")
        s = strings[off:end].decode("utf-8", "replace")
        cache[off] = s
        return s

    return name


HINT = "give /sys/kernel/btf/vmlinux (copied from the imaged machine) or a kernel image built with CONFIG_DEBUG_INFO_BTF"


def parse_btf(blob: bytes | bytearray | memoryview) -> Btf:
    """Parse a BTF blob (the bytes of a `.BTF` section or of /sys/kernel/btf/vmlinux)."""
    data = bytes(blob)
    if len(data) < 24:
        raise BtfError(f"BTF data too short ({len(data)} bytes): truncated", HINT)
    if struct.unpack_from("<H", data)[0] == BTF_MAGIC:
        e, endian = "<", "little"
    elif struct.unpack_from(">H", data)[0] == BTF_MAGIC:
        e, endian = ">", "big"
    else:
        raise BtfError(f"not BTF data: magic {data[:2].hex()} (expected 9feb)", HINT)
    _magic, version, _flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(e + "HBBIIIII", data)
    if version != 1:
        raise BtfError(f"BTF version {version} is not supported (only 1)")
    if hdr_len < 24 or hdr_len > len(data):
        raise BtfError(f"BTF header length {hdr_len} is invalid", HINT)
    body = len(data) - hdr_len
    for what, off, ln in (("type", type_off, type_len), ("string", str_off, str_len)):
        if off + ln > body:
            raise BtfError(f"BTF data is truncated: its {what} section [{off}, +{ln}) runs past the end ({body} bytes)", HINT)
    if type_off % 4:
        raise BtfError("BTF type section is not 4-byte aligned")
    tsec = data[hdr_len + type_off : hdr_len + type_off + type_len]
    strings = data[hdr_len + str_off : hdr_len + str_off + str_len]
    if strings[:1] not in (b"\x00", b""):
        raise BtfError("BTF string section does not start with an empty string")
    name = _string_reader(strings)

    types: list[BtfType] = [BtfType(0, 0, "void")]
    hdr = struct.Struct(e + "III")
    u32 = struct.Struct(e + "I")
    mem_fmt, param_fmt, enum_fmt, enum64_fmt = e + "III", e + "II", e + "Ii", e + "III"
    pos, end = 0, len(tsec)
    while pos < end:
        if len(types) > MAX_TYPES:
            raise BtfError(f"BTF has more than {MAX_TYPES} types")
        if pos + 12 > end:
            raise BtfError(f"BTF type {len(types)} truncated at type-section offset {pos}", HINT)
        name_off, info, size_type = hdr.unpack_from(tsec, pos)
        pos += 12
        kind = (info >> 24) & 0x1F
        vlen = info & 0xFFFF
        kflag = bool(info >> 31)
        if kind not in KIND_NAMES or kind == 0:
            raise BtfError(f"BTF type {len(types)} has unknown kind {kind}", "a newer BTF format than zen knows?")
        t = BtfType(len(types), kind, name(name_off), kind_flag=kflag)
        if kind in SIZED_KINDS:
            t.size = size_type
        else:
            t.ref = size_type
        per = {STRUCT: 12, UNION: 12, ENUM: 8, ENUM64: 12, FUNC_PROTO: 8, DATASEC: 12}.get(kind, 0)
        need = {INT: 4, ARRAY: 12, VAR: 4, DECL_TAG: 4}.get(kind, 0) + per * vlen
        if pos + need > end:
            raise BtfError(f"BTF type {t.id} ({t.kind_name} {t.name!r}) runs past the type section: truncated", HINT)
        chunk = tsec[pos : pos + need]
        if kind == INT:
            (word,) = u32.unpack_from(chunk)
            t.encoding, t.bit_shift, t.bits = (word >> 24) & 0x0F, (word >> 16) & 0xFF, word & 0xFF
        elif kind == ARRAY:
            t.ref, _index_type, t.count = hdr.unpack_from(chunk)
        elif kind in (STRUCT, UNION):
            if kflag:
                t.members = [Member(name(a), b, c & 0xFFFFFF, c >> 24) for a, b, c in struct.iter_unpack(mem_fmt, chunk)]
            else:
                t.members = [Member(name(a), b, c, 0) for a, b, c in struct.iter_unpack(mem_fmt, chunk)]
        elif kind == ENUM:
            # kind_flag marks signed enums (since 6.0). Without it the value is read unsigned, which
            # also keeps an older blob's -1 consistent with the unsigned base type the ISF gives it
            t.values = [(name(a), v if kflag else v & 0xFFFFFFFF) for a, v in struct.iter_unpack(enum_fmt, chunk)]
        elif kind == ENUM64:
            vals = []
            for a, lo, hi in struct.iter_unpack(enum64_fmt, chunk):
                v = (hi << 32) | lo
                if kflag and v >> 63:
                    v -= 1 << 64
                vals.append((name(a), v))
            t.values = vals
        elif kind == FUNC_PROTO:
            t.params = [(name(a), b) for a, b in struct.iter_unpack(param_fmt, chunk)]
        elif kind == VAR:
            (t.linkage,) = u32.unpack_from(chunk)
        elif kind == DATASEC:
            t.vars = list(struct.iter_unpack(mem_fmt, chunk))
        elif kind == FUNC:
            t.linkage = vlen
        pos += need
        types.append(t)

    n = len(types)
    for t in types[1:]:
        if t.kind not in SIZED_KINDS and t.ref >= n:
            raise BtfError(f"BTF type {t.id} ({t.kind_name} {t.name!r}) refers to type {t.ref}, past the last ({n - 1})")
        for m in t.members or ():
            if m.type >= n:
                raise BtfError(f"BTF struct {t.name!r} member {m.name!r} refers to type {m.type}, past the last ({n - 1})")
        for _, p in t.params or ():
            if p >= n:
                raise BtfError(f"BTF function prototype {t.id} has a parameter of type {p}, past the last ({n - 1})")
    return Btf(types, endian)
