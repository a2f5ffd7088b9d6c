"""BTF + symbol addresses -> a Volatility 3 ISF (Intermediate Symbol Format, JSON format 6.2.0).

The ISF says what dwarf2json would say from DWARF, in the same vocabulary, so Volatility's Linux
plugins cannot tell the difference: `base_types` (C base types by their DWARF/BTF names), `user_types`
(structs and unions with byte offsets; bitfields as `{"kind": "bitfield", ...}`; anonymous inner
structs/unions as fields marked `"anonymous": true`, which Volatility flattens), `enums` and
`symbols` (link-time addresses; `linux_banner` carries the banner text as `constant_data`, which is
how Volatility and zen match an ISF to an image).

Naming follows dwarf2json, so plugins that look types up by name find them: typedefs are looked
through, anonymous types get a content-derived `unnamed_<16 hex>` (stable across builds of the same
BTF, and across kernels for identical types). Two different BTF types may share a name (static
structs of different files); the largest keeps the name, the others get `<name>__<n>` and the
fields that use them refer to those, so every offset stays right.

The output is deterministic: keys sorted, no timestamps, `metadata` written first so that a
reader can take the banner from the first kilobytes of the file (see `read_isf_head`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from zen.memory.system.symbols import btfparse as B
from zen.memory.system.symbols.globals_table import KERNEL_GLOBALS, MAX_MEASURED, MEASURED_ARRAYS

ISF_FORMAT = "6.2.0"
ISF_SUFFIXES = (".json", ".json.xz", ".json.gz", ".json.bz2")
MAX_DEPTH = 64
# C spellings used in declarations -> the names BTF (like DWARF) gives those types.
C_BASE_NAMES = {
    "unsigned long": "long unsigned int",
    "long": "long int",
    "unsigned long long": "long long unsigned int",
    "long long": "long long int",
    "unsigned short": "short unsigned int",
    "short": "short int",
    "unsigned": "unsigned int",
}
# Enum base types by (size, signed); added to base_types if the BTF lacks one.
ENUM_BASES = {
    (1, False): "unsigned char",
    (1, True): "signed char",
    (2, False): "short unsigned int",
    (2, True): "short int",
    (4, False): "unsigned int",
    (4, True): "int",
    (8, False): "long unsigned int",
    (8, True): "long int",
}
VOID = {"kind": "base", "name": "void"}
FUNCTION = {"kind": "function"}


@dataclass
class Symbol:
    """A kernel symbol to put in the ISF (link-time address)."""

    name: str
    address: int
    type: str = "?"  # nm letter, for choosing among duplicate names


def _base(name: str, kind: str, size: int, signed: bool, endian: str) -> dict:
    return {"endian": endian, "kind": kind, "signed": signed, "size": size}


class IsfBuilder:
    """Turns one parsed BTF into ISF dictionaries; see the module docstring for the conventions."""

    def __init__(self, btf: B.Btf) -> None:
        self.btf = btf
        self.endian = btf.endian
        self.base_types: dict[str, dict] = {}
        self.user_types: dict[str, dict] = {}
        self.enums: dict[str, dict] = {}
        self._names: dict[int, str] = {}  # struct/union/enum/fwd/typedef type id -> ISF name
        self._anon: dict[int, str] = {}  # anonymous struct/union/enum type id -> unnamed_<hash>
        self._emit: list[tuple[str, int]] = []  # (ISF name, BTF type id) still to write out
        self._desc: dict[int, dict] = {}
        self._naming: set[int] = set()
        self._done: set[tuple[bool, str]] = set()  # (is enum, name) written; separate namespaces
        self._build_base_types()
        self._assign_names()

    # -- names ---------------------------------------------------------------------------------

    def _build_base_types(self) -> None:
        e = self.endian
        self.base_types["void"] = _base("void", "void", 0, False, e)
        self.base_types["pointer"] = _base("pointer", "int", 8, False, e)
        for t in self.btf.types[1:]:
            if t.kind == B.INT and t.name and t.name not in self.base_types:
                if t.encoding & B.INT_BOOL:
                    kind, signed = "bool", False
                elif t.name in ("char", "unsigned char") or t.encoding & B.INT_CHAR:
                    # BTF drops the signedness of plain char; it is signed on x86_64
                    kind, signed = "char", t.name == "char" or bool(t.encoding & B.INT_SIGNED)
                else:
                    kind, signed = "int", bool(t.encoding & B.INT_SIGNED)
                self.base_types[t.name] = _base(t.name, kind, t.size, signed, e)
            elif t.kind == B.FLOAT and t.name and t.name not in self.base_types:
                self.base_types[t.name] = _base(t.name, "float", t.size, False, e)
        for (size, signed), name in ENUM_BASES.items():
            self.base_types.setdefault(name, _base(name, "int", size, signed, e))
        # C spellings Volatility's plugins use in casts ("unsigned long", "long long", ...)
        for alias, canonical in C_BASE_NAMES.items():
            if canonical in self.base_types:
                self.base_types.setdefault(alias, dict(self.base_types[canonical]))

    def _assign_names(self) -> None:
        """ISF names of named aggregates, enums and the typedefs that name them.

        dwarf2json (and so Volatility's plugins, e.g. its kernel_cap_t / kernel_cap_struct and
        atomic64_t checks) name an *anonymous* struct or union reached through a typedef by the
        typedef (`atomic_t`, `pgd_t`, `kuid_t`, `seqlock_t`, ...); a typedef of a tagged struct
        (`spinlock_t`) or of an enum is looked through to the tag. Within one name,
        distinct definitions are ranked (largest, a tag before a typedef, lowest id): the first
        keeps the name, the others become `name__1`, `name__2`, ..."""
        groups: dict[tuple[str, str], dict[int, tuple[int, int, int]]] = {}
        origins: dict[tuple[str, str], list[tuple[int, int]]] = {}

        def add(space: str, name: str, origin: B.BtfType, target: B.BtfType, pref: int) -> None:
            key = (space, name)
            g = groups.setdefault(key, {})
            rank = (-target.size, pref, origin.id)
            if target.id not in g or rank < g[target.id]:
                g[target.id] = rank
            origins.setdefault(key, []).append((origin.id, target.id))

        for t in self.btf.types[1:]:
            if not t.name:
                continue
            if t.kind in (B.STRUCT, B.UNION):
                add("u", t.name, t, t, 0)
            elif t.kind in (B.ENUM, B.ENUM64):
                add("e", t.name, t, t, 0)
            elif t.kind == B.TYPEDEF:
                try:
                    target = self.btf.resolve(t.id)
                except B.BtfError:
                    continue
                if target.kind in (B.STRUCT, B.UNION) and not target.name:
                    add("u", t.name, t, target, 1)
            elif t.kind == B.FWD:
                self._names.setdefault(t.id, t.name)
        for key, g in groups.items():
            name = key[1]
            ranked = sorted(g, key=lambda tid: g[tid])
            isf_name = {tid: (name if i == 0 else f"{name}__{i}") for i, tid in enumerate(ranked)}
            for origin, target in origins[key]:
                n = isf_name[target]
                self._names[origin] = n
                self._emit.append((n, target))

    def _anon_name(self, t: B.BtfType) -> str:
        """`unnamed_<hash>` from the type's content (its fields and their types, recursively)."""
        if t.id in self._anon:
            return self._anon[t.id]
        if t.id in self._naming:  # a cycle through anonymous types: only a hostile BTF does that
            return f"unnamed_btf{t.id}"
        self._naming.add(t.id)
        try:
            if t.kind in (B.ENUM, B.ENUM64):
                content = [B.KIND_NAMES[t.kind], t.size, t.values]
            else:
                content = [B.KIND_NAMES[t.kind], t.size]
                for m in t.members or ():
                    content.append([m.name, m.bit_offset, m.bit_size, self.desc(m.type)])
            h = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
        finally:
            self._naming.discard(t.id)
        name = f"unnamed_{h}"
        self._anon[t.id] = name
        self._emit.append((name, t.id))
        return name

    def name_of(self, t: B.BtfType) -> str:
        """The ISF name of a struct/union/enum reached directly (not through a typedef)."""
        if t.name and t.id in self._names:
            return self._names[t.id]
        return self._anon_name(t)

    # -- type descriptors ------------------------------------------------------------------------

    def desc(self, type_id: int, depth: int = 0) -> dict:
        """The ISF type descriptor of a BTF type id (typedefs and qualifiers looked through)."""
        got = self._desc.get(type_id)
        if got is not None:
            return got
        if depth > MAX_DEPTH:
            raise B.BtfError(f"BTF type {type_id}: type nesting deeper than {MAX_DEPTH}")
        t = self.btf[type_id]
        for _ in range(MAX_DEPTH):
            if t.kind == B.TYPEDEF and t.id in self._names:
                target = self.btf.resolve(t.id)
                d = {"kind": "struct" if target.kind == B.STRUCT else "union", "name": self._names[t.id]}
                self._desc[type_id] = d
                return d
            if t.kind not in B.QUALIFIER_KINDS:
                break
            t = self.btf[t.ref]
        else:
            raise B.BtfError(f"BTF type {type_id}: qualifier/typedef chain longer than {MAX_DEPTH} (a loop?)")
        k = t.kind
        if k == 0:
            d = VOID
        elif k in (B.INT, B.FLOAT):
            d = {"kind": "base", "name": t.name if t.name in self.base_types else "void"}
        elif k == B.PTR:
            d = {"kind": "pointer", "subtype": self.desc(t.ref, depth + 1)}
        elif k == B.ARRAY:
            d = {"count": t.count, "kind": "array", "subtype": self.desc(t.ref, depth + 1)}
        elif k in (B.STRUCT, B.UNION):
            d = {"kind": "struct" if k == B.STRUCT else "union", "name": self.name_of(t)}
        elif k == B.FWD:
            d = {"kind": "union" if t.kind_flag else "struct", "name": t.name or f"unnamed_btf{t.id}"}
        elif k in (B.ENUM, B.ENUM64):
            d = {"kind": "enum", "name": self.name_of(t)}
        elif k in (B.FUNC_PROTO, B.FUNC):
            d = FUNCTION
        elif k == B.VAR:
            d = self.desc(t.ref, depth + 1)
        else:
            d = VOID
        self._desc[type_id] = d
        return d

    def _bitfield(self, m: B.Member, bit_offset: int, bit_size: int) -> tuple[int, dict]:
        """(byte offset, descriptor) of a bitfield, placed as dwarf2json places it: the byte that
        holds its first bit, and the bit within that byte (Volatility reads the member's type
        from there and shifts)."""
        t = self.btf.resolve(m.type)
        size = t.size if t.kind in (B.INT, B.ENUM, B.ENUM64) and t.size in (1, 2, 4, 8, 16) else 0
        inner = self.desc(m.type)
        if not size or inner["kind"] not in ("base", "enum"):
            size = max(1, min(8, (bit_offset % 8 + bit_size + 7) // 8))
            size = 1 << (size - 1).bit_length()
            inner = {"kind": "base", "name": ENUM_BASES[(size, False)]}
        unit, pos = bit_offset // 8, bit_offset % 8
        if pos + bit_size > size * 8:  # only packed structs do this: widen the read to cover the bits
            wide = next(n for n in (2, 4, 8) if pos + bit_size <= n * 8) if pos + bit_size <= 64 else 8
            inner = {"kind": "base", "name": ENUM_BASES[(wide, False)]}
        return unit, {"bit_length": bit_size, "bit_position": pos, "kind": "bitfield", "type": inner}

    def _fields(self, t: B.BtfType) -> dict:
        fields: dict[str, dict] = {}
        anon = 0
        for m in t.members or ():
            bit_off, bit_size = m.bit_offset, m.bit_size
            mt = self.btf.resolve(m.type)
            if not bit_size and mt.kind == B.INT and (mt.bit_shift or (mt.bits and mt.bits != mt.size * 8)):
                bit_off, bit_size = bit_off + mt.bit_shift, mt.bits  # pre-kind_flag bitfield
            if not m.name:
                if mt.kind in (B.STRUCT, B.UNION) and not bit_size:
                    fields[f"unnamed_field_{anon:x}"] = {"anonymous": True, "offset": bit_off // 8, "type": self.desc(m.type)}
                    anon += 1
                continue  # unnamed bitfields are padding
            if m.name in fields:
                continue
            if bit_size:
                off, d = self._bitfield(m, bit_off, bit_size)
            else:
                off, d = bit_off // 8, self.desc(m.type)
            fields[m.name] = {"offset": off, "type": d}
        return fields

    def _enum(self, t: B.BtfType) -> dict:
        vals = t.values or []
        signed = any(v < 0 for _, v in vals)
        size = t.size if (t.size, signed) in ENUM_BASES else 4
        consts: dict[str, int] = {}
        for n, v in vals:
            consts.setdefault(n, v)
        return {"base": ENUM_BASES[(size, signed)], "constants": consts, "size": size}

    def build_types(self) -> None:
        """Fill `user_types` and `enums`: every named struct, union, enum and typedef of one, every
        anonymous enum, and the anonymous structs/unions that something refers to."""
        for t in self.btf.types[1:]:
            if t.kind in (B.ENUM, B.ENUM64) and not t.name:
                self._anon_name(t)
        self._drain()
        for t in self.btf.types[1:]:  # declared, never defined: an empty type keeps references resolvable
            if t.kind == B.FWD:
                name = t.name or f"unnamed_btf{t.id}"
                self.user_types.setdefault(name, {"fields": {}, "kind": "union" if t.kind_flag else "struct", "size": 0})

    def _drain(self) -> None:
        """Write out every type named so far but not yet defined (fields name more types: loop)."""
        guard = 0
        while self._emit:
            guard += 1
            if guard > 4 * len(self.btf.types) + 16:
                raise B.BtfError("BTF type graph does not close (a loop?)")
            name, tid = self._emit.pop()
            t = self.btf[tid]
            is_enum = t.kind in (B.ENUM, B.ENUM64)
            if (is_enum, name) in self._done:
                continue
            self._done.add((is_enum, name))
            if is_enum:
                self.enums[name] = self._enum(t)
            else:
                self.user_types[name] = {
                    "fields": self._fields(t),
                    "kind": "struct" if t.kind == B.STRUCT else "union",
                    "size": t.size,
                }

    # -- symbols ---------------------------------------------------------------------------------

    def decl_desc(self, decl: str, measure: Callable[[int], int | None] | None = None) -> dict | None:
        """Descriptor of a C declaration from `KERNEL_GLOBALS`, or None if the BTF lacks its type.
        `measure(element size)` counts the entries of a `[?]` array in the image (None: unknown)."""
        m = re.fullmatch(
            r"\s*(?:(struct|union|enum)\s+)?([A-Za-z_][A-Za-z0-9_ ]*?|\{[A-Za-z0-9_; ]*\})\s*(\*+)?\s*(?:\[(\d*|\?)\])?\s*",
            decl,
        )
        if not m:
            return None
        tag, name, stars, count = m.groups()
        if name.startswith("{"):  # an anonymous struct known by its members
            want = [n.strip() for n in name.strip("{}").split(";") if n.strip()]
            kind = B.UNION if tag == "union" else B.STRUCT
            hits = [t for t in self.btf.types if t.kind == kind and not t.name and [x.name for x in t.members or ()] == want]
            if len({(t.size, tuple((x.bit_offset, x.type) for x in t.members or ())) for t in hits}) != 1:
                return None
            d: dict = self.desc(hits[0].id)
            elem_id = hits[0].id
        elif tag in ("struct", "union"):
            kind = B.STRUCT if tag == "struct" else B.UNION
            cands = [t for t in self.btf.find(name, kind) if self._names.get(t.id) == name]
            if not cands:
                return None
            d = {"kind": tag, "name": name}
            elem_id = cands[0].id
        elif tag == "enum":
            if name not in self.enums:
                return None
            d = {"kind": "enum", "name": name}
            elem_id = 0
        else:
            base = C_BASE_NAMES.get(name, name)
            if base in self.base_types:
                d = {"kind": "base", "name": base}
                elem_id = 0
            else:
                tds = self.btf.find(name, B.TYPEDEF)
                if not tds:
                    return None
                d = self.desc(tds[0].id)
                elem_id = tds[0].id
        for _ in range(len(stars or "")):
            d = {"kind": "pointer", "subtype": d}
        if count == "?":
            size = 8 if stars else self.btf.sizeof(elem_id) if elem_id else self.base_types[d["name"]]["size"]
            n = measure(size) if measure is not None and size > 0 else None
            if n is None:
                return None
            d = {"count": n, "kind": "array", "subtype": d}
        elif count is not None:
            d = {"count": int(count or 0), "kind": "array", "subtype": d}
        return d

    def symbols(self, syms: list[Symbol], banner: bytes | None, read: Callable[[int, int], bytes | None] | None = None) -> dict:
        """The ISF `symbols` section. A name the kernel uses twice (static symbols of different
        files) keeps one address: a global one if there is one, else the lowest. `read(address,
        size)` reads the kernel image's data (link-time addresses), to measure `[?]` arrays."""
        chosen: dict[str, Symbol] = {}
        for s in syms:
            old = chosen.get(s.name)
            if (
                old is None
                or (s.type.isupper() and not old.type.isupper())
                or (s.type.isupper() == old.type.isupper() and s.address < old.address)
            ):
                chosen[s.name] = s
        var_types: dict[str, int] = {}
        for t in self.btf.types[1:]:
            if t.kind == B.VAR and t.name:
                var_types.setdefault(t.name, t.ref)
        out: dict[str, dict] = {}
        for name, s in chosen.items():
            e: dict = {"address": s.address}
            if name in var_types:
                e["type"] = self.desc(var_types[name])
            elif name in KERNEL_GLOBALS:
                d = self.decl_desc(KERNEL_GLOBALS[name], _measurer(read, name, s.address))
                if d is not None:
                    e["type"] = d
            out[name] = e
        self._drain()  # anonymous types first named by a symbol
        if banner is not None and "linux_banner" in out:
            import base64

            out["linux_banner"]["constant_data"] = base64.b64encode(banner).decode()
        return out


def _measurer(read: Callable[[int, int], bytes | None] | None, name: str, address: int) -> Callable[[int], int | None] | None:
    """Counts the entries of the array `name` at `address` that pass its `MEASURED_ARRAYS` test."""
    test = MEASURED_ARRAYS.get(name)
    if read is None or test is None:
        return None

    def measure(size: int) -> int | None:
        n = 0
        while n < MAX_MEASURED:
            entry = read(address + n * size, size)
            if entry is None or len(entry) < size or not test(entry):
                break
            n += 1
        return n or None

    return measure


def isf_document(
    btf: B.Btf, syms: list[Symbol], banner: bytes | None, metadata: dict, read: Callable[[int, int], bytes | None] | None = None
) -> dict:
    """The whole ISF as a dict (`metadata` first). `read` gives the kernel image's data, if any."""
    b = IsfBuilder(btf)
    b.build_types()
    symbols = b.symbols(syms, banner, read)
    return {
        "metadata": metadata,
        "base_types": b.base_types,
        "user_types": b.user_types,
        "enums": b.enums,
        "symbols": symbols,
    }


def dump_isf(doc: dict) -> bytes:
    """Deterministic JSON bytes: top-level order as given (metadata first), everything below sorted."""
    parts = [json.dumps(k) + ":" + json.dumps(v, sort_keys=True, separators=(",", ":")) for k, v in doc.items()]
    return ("{" + ",\n".join(parts) + "}\n").encode()
