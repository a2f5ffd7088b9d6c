"""Measure CPython's struct layouts in the running interpreter and write a layout profile (JSON).

Why measure instead of transcribing headers: offsets change between minor versions (and build
options), and a profile that was *measured* in an interpreter of the target's version is evidence
an investigator can reproduce: `zen profile python --python /path/to/python3.X`. Every offset here
is found by making objects whose contents we know, reading their bytes with ctypes at `id(obj)`,
and locating known values (object addresses, lengths, hashes, counts). Where several candidates
remain, a second, different sample disambiguates. A pointer is only ever dereferenced after
checking it lies in a readable mapping of this process (/proc/self/maps), so a wrong guess
cannot crash the calibration.

This file must stay runnable on its own with only the standard library, under any CPython from
3.11 on, because it is executed by *other* interpreters than the one zen runs on:

    python3.X path/to/calibrate.py -o cpython-3.X.json

Fields the running interpreter cannot reveal (a few flag bit values) come from the C headers of
that version and are *verified* against real objects; the profile's "provenance" says which is
which.
"""

from __future__ import annotations

import argparse
import builtins
import ctypes
import gc
import inspect
import json
import opcode
import platform
import struct
import sys
import threading

FORMAT = 1
PTR = 8


class CalibrationFailed(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Safe raw memory access in this process
# --------------------------------------------------------------------------------------------
class Memory:
    """ctypes reads that refuse addresses outside this process's readable mappings."""

    def __init__(self) -> None:
        self._maps: list[tuple[int, int]] = []
        self.refresh()

    def refresh(self) -> None:
        maps = []
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 2 or parts[1][0] != "r":
                    continue
                if len(parts) > 5 and parts[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                maps.append((lo, hi))
        self._maps = sorted(maps)

    def readable(self, addr: int, size: int) -> bool:
        if addr <= 0 or size < 0:
            return False
        for attempt in (0, 1):
            for lo, hi in self._maps:
                if lo <= addr and addr + size <= hi:
                    return True
            if attempt == 0:
                self.refresh()
        return False

    def raw(self, addr: int, size: int) -> bytes:
        if not self.readable(addr, size):
            raise CalibrationFailed(f"refusing to read unmapped memory at {addr:#x}")
        return ctypes.string_at(addr, size)

    def try_raw(self, addr: int, size: int) -> bytes | None:
        return ctypes.string_at(addr, size) if self.readable(addr, size) else None

    def word(self, addr: int) -> int:
        return struct.unpack("<Q", self.raw(addr, 8))[0]

    def words(self, addr: int, n: int) -> tuple[int, ...]:
        return struct.unpack(f"<{n}Q", self.raw(addr, 8 * n))

    def find_word(self, addr: int, size: int, value: int, start: int = 0) -> list[int]:
        data = self.raw(addr, size)
        return [o for o in range(start, size - 7, 8) if struct.unpack_from("<Q", data, o)[0] == value]

    def find_int(self, addr: int, size: int, value: int, width: int = 4, start: int = 0, signed: bool = True) -> list[int]:
        data = self.raw(addr, size)
        fmt = {1: "b", 2: "h", 4: "i", 8: "q"}[width]
        if not signed:
            fmt = fmt.upper()
        return [o for o in range(start, size - width + 1, width) if struct.unpack_from("<" + fmt, data, o)[0] == value]

    def cstring(self, addr: int, limit: int = 256) -> bytes | None:
        out = b""
        while len(out) < limit:
            chunk = self.try_raw(addr + len(out), 16)
            if chunk is None:
                return None
            i = chunk.find(b"\0")
            if i >= 0:
                return out + chunk[:i]
            out += chunk
        return None


def one(name: str, candidates) -> int:
    """The single candidate, or a clear failure naming the field."""
    cands = sorted(set(candidates))
    if len(cands) != 1:
        raise CalibrationFailed(f"{name}: expected one candidate offset, found {cands}")
    return cands[0]


def common(name: str, *lists) -> int:
    """The single offset present in every sample's candidate list."""
    sets = [set(x) for x in lists]
    inter = set.intersection(*sets) if sets else set()
    return one(name, inter)


# --------------------------------------------------------------------------------------------
# Sample objects (module level so that their code is compiled but never executed)
# --------------------------------------------------------------------------------------------
_CODE_SAMPLES = """
def c1(a1, a2, a3, /, b1, b2, b3, b4, *args, k1, k2, k3, k4, k5, k6, **kw):
    l1 = l2 = l3 = 0
    cellA = 1
    cellB = 2
    def g():
        return cellA + cellB
    return g

def outer():
    fa = fb = fc = 1
    def c2(p1, /, q1, q2, q3, *, r1, r2, r3, r4, r5):
        m1 = 1
        def h():
            return q1
        return fa + fb + fc
    return c2
"""


def _sample_code():
    """Two code objects whose counts differ field by field (compiled, never run).

    c1: argcount 7, posonly 3, kwonly 6, nlocals 19, 2 plain cells, no free vars.
    c2: argcount 4, posonly 1, kwonly 5, nlocals 11, 1 argument cell, 3 free vars.
    """
    mod = compile(_CODE_SAMPLES, "<zen-calibration>", "exec")
    codes = {c.co_name: c for c in mod.co_consts if hasattr(c, "co_code")}
    outer = codes["outer"]
    inner = next(c for c in outer.co_consts if hasattr(c, "co_code") and c.co_name == "c2")
    c1 = codes["c1"].replace(co_firstlineno=4321, co_stacksize=77, co_qualname="calib.q1")
    c2 = inner.replace(co_firstlineno=8765, co_stacksize=55, co_qualname="calib.q2")
    return c1, c2


class _Plain:
    pass


class _Plain2(_Plain):
    pass


class _Slotted:
    __slots__ = ("alpha", "beta")


class _Props:
    def _get(self):
        return 1

    prop_attr = property(_get, None, None, "prop doc")
    st = staticmethod(len)
    cl = classmethod(len)


class Calibrator:
    def __init__(self) -> None:
        self.m = Memory()
        self.structs: dict[str, dict] = {}
        self.provenance: dict[str, str] = {}
        self.constants: dict[str, int] = {}
        self.checks: list[str] = []

    # -- bookkeeping ------------------------------------------------------------------------
    def field(self, struct_name: str, field: str, offset: int, ftype: str, how: str = "measured") -> int:
        s = self.structs.setdefault(struct_name, {"fields": {}})
        s["fields"][field] = [offset, ftype]
        self.provenance[f"{struct_name}.{field}"] = how
        return offset

    def size(self, struct_name: str, size: int, how: str = "measured") -> None:
        self.structs.setdefault(struct_name, {"fields": {}})["size"] = size
        self.provenance[f"{struct_name}.<size>"] = how

    def off(self, struct_name: str, field: str) -> int:
        return self.structs[struct_name]["fields"][field][0]

    def check(self, cond: bool, what: str) -> None:
        if not cond:
            raise CalibrationFailed(f"self-check failed: {what}")
        self.checks.append(what)

    # -- object header ------------------------------------------------------------------------
    def object_header(self) -> None:
        m = self.m
        x = object()
        w = m.words(id(x), 2)
        rc = sys.getrefcount(x) - 1
        if w[0] == rc:
            self.field("object", "ob_refcnt", 0, "i64")
        elif w[0] & 0xFFFFFFFF == rc:
            self.field("object", "ob_refcnt", 0, "u32")
        else:
            raise CalibrationFailed(f"refcount not at offset 0 ({w[0]} vs {rc})")
        self.field("object", "ob_type", one("ob_type", m.find_word(id(x), 16, id(object))), "ptr")
        self.size("object", object.__basicsize__)
        t = (1, 2, 3, 4, 5, 6, 7)
        self.field("varobject", "ob_size", one("ob_size", m.find_word(id(t), 24, 7, start=16)), "i64")
        self.size("varobject", tuple.__basicsize__)

    # -- unicode -------------------------------------------------------------------------------
    def unicode(self) -> None:
        m = self.m
        # Built at run time so that none of them is interned (interning sets state bits too).
        samples = {
            "ascii": "".join(["calibration_", "ascii_Zq"]),
            "latin1": "".join(["calibration_", "\xe9\xe8_latin1"]),
            "ucs2": "".join(["calibration_", "\u0100\u2603_ucs2"]),
            "ucs4": "".join(["calibration_", "\U0001f600_ucs4"]),
        }
        kinds = {"ascii": 1, "latin1": 1, "ucs2": 2, "ucs4": 4}
        size = 128
        ln = common(
            "unicode.length",
            *[m.find_word(id(s), size, len(s), start=16) for s in samples.values()],
        )
        self.field("unicode", "length", ln, "i64")
        hs = common("unicode.hash", *[m.find_word(id(s), size, hash(s) & 0xFFFFFFFFFFFFFFFF) for s in samples.values()])
        self.field("unicode", "hash", hs, "i64")
        state_off = hs + 8
        self.field("unicode", "state", state_off, "u32", "derived: the field after hash")
        states = {k: struct.unpack("<I", m.raw(id(s) + state_off, 4))[0] for k, s in samples.items()}
        kind_shift = None
        for shift in range(0, 29):
            if all((states[k] >> shift) & 7 == kinds[k] for k in samples):
                kind_shift = shift
                break
        if kind_shift is None:
            raise CalibrationFailed(f"unicode kind bits not found in states {states}")
        # The state word has uninitialised padding bits: decide the ascii bit on many strings, and
        # only among the low bits where CPython keeps its flags.
        extra_ascii = ["".join(["zen-ascii-", str(i)]) for i in range(8)]
        extra_other = ["".join(["zen-\xe9-", str(i)]) for i in range(4)] + ["".join(["zen-\u2603-", str(i)]) for i in range(4)]

        def st(s: str) -> int:
            return struct.unpack("<I", m.raw(id(s) + state_off, 4))[0]

        ascii_bit = one(
            "unicode ascii bit",
            [b for b in range(kind_shift + 3, 16)
             if all((st(s) >> b) & 1 for s in [samples["ascii"]] + extra_ascii)
             and not any((st(s) >> b) & 1 for s in [samples[k] for k in ("latin1", "ucs2", "ucs4")] + extra_other)],
        )
        compact_bit = kind_shift + 3
        self.check(all((states[k] >> compact_bit) & 1 for k in samples), "unicode compact bit set on compact strings")
        self.constants.update(
            UNICODE_KIND_SHIFT=kind_shift, UNICODE_COMPACT_BIT=compact_bit, UNICODE_ASCII_BIT=ascii_bit
        )
        self.provenance["constants.UNICODE_KIND_SHIFT"] = "measured"
        self.provenance["constants.UNICODE_ASCII_BIT"] = "measured"
        self.provenance["constants.UNICODE_COMPACT_BIT"] = "derived: bit after the 3-bit kind (all versions)"
        a = samples["ascii"]
        self.field("unicode", "ascii_data", one("ascii data", [m.raw(id(a), 128).find(a.encode())]), "bytes")
        lat = samples["latin1"]
        off = m.raw(id(lat), 160).find(lat.encode("latin-1"))
        u2 = samples["ucs2"]
        off2 = m.raw(id(u2), 200).find(u2.encode("utf-16-le"))
        u4 = samples["ucs4"]
        off4 = m.raw(id(u4), 300).find(u4.encode("utf-32-le"))
        self.field("unicode", "compact_data", one("compact data", {off, off2, off4}), "bytes")
        # Legacy (non-compact) strings keep a data pointer right after the compact header.
        self.field("unicode", "legacy_data", self.off("unicode", "compact_data"), "ptr", "derived: sizeof(PyCompactUnicodeObject)")

    # -- numbers -------------------------------------------------------------------------------
    def numbers(self) -> None:
        m = self.m
        f = 1234.5678e-3
        self.field("float", "ob_fval", one("ob_fval", [m.raw(id(f), 32).find(struct.pack("<d", f))]), "f64")
        c = complex(1.25e10, -3.5e-7)
        raw = m.raw(id(c), 48)
        self.field("complex", "real", one("complex.real", [raw.find(struct.pack("<d", c.real))]), "f64")
        self.field("complex", "imag", one("complex.imag", [raw.find(struct.pack("<d", c.imag))]), "f64")
        bits, dsize = sys.int_info.bits_per_digit, sys.int_info.sizeof_digit
        self.constants.update(LONG_BITS_PER_DIGIT=bits, LONG_SIZEOF_DIGIT=dsize)
        big = (1 << (bits * 3)) + (5 << bits) + 7  # digits 7, 5, 0, 1
        neg = -big
        digits = struct.pack("<" + ("I" if dsize == 4 else "H") * 4, 7, 5, 0, 1)
        raw = m.raw(id(big), 64)
        doff = one("long digits", [raw.find(digits)])
        self.field("long", "ob_digit", doff, "digits")
        head = struct.unpack("<q", m.raw(id(big), doff)[16:24])[0]
        nhead = struct.unpack("<q", m.raw(id(neg), doff)[16:24])[0]
        zhead = struct.unpack("<q", m.raw(id(0), doff)[16:24])[0]
        if head == 4 and nhead == -4 and zhead == 0:
            self.constants["LONG_REPR"] = 0  # ob_size: signed digit count
            self.field("long", "ob_size", 16, "i64")
        else:
            # 3.12+: lv_tag = ndigits << shift | sign (0 positive, 1 zero, 2 negative)
            shift = next((s for s in range(1, 8) if head >> s == 4 and nhead >> s == 4), None)
            if shift is None:
                raise CalibrationFailed(f"unknown int representation {head:#x}/{nhead:#x}/{zhead:#x}")
            self.constants.update(LONG_REPR=1, LONG_TAG_SHIFT=shift, LONG_TAG_SIGN_MASK=(1 << shift) - 1,
                                  LONG_TAG_ZERO=zhead & ((1 << shift) - 1), LONG_TAG_NEG=nhead & ((1 << shift) - 1))
            self.field("long", "lv_tag", 16, "u64")
        self.provenance["constants.LONG_REPR"] = "measured"

    # -- bytes, bytearray, tuple, list -------------------------------------------------------
    def sequences(self) -> None:
        m = self.m
        b = b"calibration bytes \x00\x01\x02 payload"
        hash(b)
        raw = m.raw(id(b), 96)
        self.field("bytes", "ob_sval", one("bytes data", [raw.find(b)]), "bytes")
        hs = m.find_word(id(b), 32, hash(b) & 0xFFFFFFFFFFFFFFFF, start=16)
        if hs:
            self.field("bytes", "ob_shash", one("bytes hash", hs), "i64")
        ba = bytearray(b"0123456789abcdefghij")
        del ba[:3]  # ob_start moves past ob_bytes
        addr = ctypes.addressof((ctypes.c_char * len(ba)).from_buffer(ba))
        start = one("bytearray.ob_start", m.find_word(id(ba), 64, addr))
        self.field("bytearray", "ob_start", start, "ptr")
        self.field("bytearray", "ob_bytes", one("bytearray.ob_bytes", m.find_word(id(ba), 64, addr - 3)), "ptr")
        alloc = [o for o in range(16, 64, 8) if o not in (16, start, self.off("bytearray", "ob_bytes"))
                 and m.word(id(ba) + o) >= len(ba) + 3 and m.word(id(ba) + o) < 1 << 20]
        self.field("bytearray", "ob_alloc", one("bytearray.ob_alloc", alloc), "i64")
        t = ("tuple-item-0", "tuple-item-1")
        self.field("tuple", "ob_item", one("tuple.ob_item", m.find_word(id(t), 48, id(t[0]))), "items")
        lst = ["list-item-0", "list-item-1", "list-item-2"]
        lst.append("list-item-3")
        cands = []
        for o in range(16, 48, 8):
            p = m.word(id(lst) + o)
            if m.readable(p, 8) and m.word(p) == id(lst[0]):
                cands.append(o)
        self.field("list", "ob_item", one("list.ob_item", cands), "ptr")
        self.field("list", "allocated", one("list.allocated", [o for o in range(16, 48, 8) if o not in (16, cands[0])
                                                               and len(lst) <= m.word(id(lst) + o) < 64]), "i64")

    # -- dict ----------------------------------------------------------------------------------
    def dicts(self) -> None:
        m = self.m
        small = {f"dk{i}": f"dv{i}" for i in range(5)}
        big = {f"bigkey{i}": i for i in range(300)}
        gen = {10**12 + i: f"gv{i}" for i in range(6)}
        sk = list(small)
        bk = list(big)
        gk = list(gen)
        keys_field = []
        for o in range(16, 64, 8):
            p = m.word(id(small) + o)
            blk = m.try_raw(p, 256) if p else None
            if blk and struct.pack("<QQ", id(sk[0]), id(small[sk[0]])) in blk:
                keys_field.append(o)
        ma_keys = self.field("dict", "ma_keys", one("dict.ma_keys", keys_field), "ptr")
        self.field("dict", "ma_values", ma_keys + 8, "ptr", "derived: the field after ma_keys")
        self.field("dict", "ma_used", common("dict.ma_used", m.find_word(id(small), ma_keys, 5, start=16),
                                             m.find_word(id(big), ma_keys, 300, start=16)), "i64")
        self.size("dict", dict.__basicsize__)

        def entry_pos(d, k, v, general):
            kp = m.word(id(d) + ma_keys)
            blk = m.raw(kp, 4096 + 64 * len(d))
            pat = struct.pack("<QQQ", hash(k) & 0xFFFFFFFFFFFFFFFF, id(k), id(v)) if general else struct.pack("<QQ", id(k), id(v))
            return kp, blk, blk.find(pat)

        k1, b1, p1 = entry_pos(small, sk[0], small[sk[0]], False)
        k2, b2, p2 = entry_pos(big, bk[0], big[bk[0]], False)
        k3, b3, p3 = entry_pos(gen, gk[0], gen[gk[0]], True)
        if min(p1, p2, p3) < 0:
            raise CalibrationFailed("dict entries not found in keys objects")
        # log2_index_bytes: the byte L with entries = indices_start + (1 << L), same start for all.
        found = []
        for o in range(8, 40):
            l1, l2, l3 = b1[o], b2[o], b3[o]
            if l1 > 40 or l2 > 40 or l3 > 40:
                continue
            s1, s2, s3 = p1 - (1 << l1), p2 - (1 << l2), p3 - (1 << l3)
            if s1 == s2 == s3 and s1 > 0 and s1 % 8 == 0:
                found.append((o, s1))
        lib_off, indices = found[0] if len(found) == 1 else (None, None)
        if lib_off is None:
            raise CalibrationFailed(f"dict keys: log2_index_bytes ambiguous {found}")
        self.field("dictkeys", "dk_log2_index_bytes", lib_off, "u8")
        self.field("dictkeys", "dk_indices", indices, "bytes")

        def width(log2size):
            n = 1 << log2size
            return 1 if n <= 0xFF else 2 if n <= 0xFFFF else 4 if n <= 0xFFFFFFFF else 8

        log2 = [o for o in range(8, indices) if o != lib_off and all(
            b[o] < 40 and (1 << b[o]) * width(b[o]) == 1 << b[lib_off] for b in (b1, b2, b3))]
        self.field("dictkeys", "dk_log2_size", one("dk_log2_size", log2), "u8")
        kind = [o for o in range(8, indices) if b1[o] == 1 and b2[o] == 1 and b3[o] == 0 and o not in (lib_off, log2[0])]
        self.field("dictkeys", "dk_kind", one("dk_kind", kind), "u8")
        nent = common("dk_nentries", *[[o for o in range(8, indices, 8) if struct.unpack_from("<q", b, o)[0] == n]
                                       for b, n in ((b1, 5), (b2, 300), (b3, 6))])
        self.field("dictkeys", "dk_nentries", nent, "i64")
        usable = []
        for o in range(8, indices, 8):
            if o == nent:
                continue
            ok = True
            for b in (b1, b2, b3):
                size = 1 << b[log2[0]]
                if struct.unpack_from("<q", b, o)[0] != ((size << 1) // 3) - struct.unpack_from("<q", b, nent)[0]:
                    ok = False
            if ok:
                usable.append(o)
        self.field("dictkeys", "dk_usable", one("dk_usable", usable), "i64")
        self.field("dictkeys", "dk_refcnt", 0, "i64", "derived: first field")
        ks = struct.pack("<QQ", id(sk[1]), id(small[sk[1]]))
        self.size("dictentry_unicode", b1.find(ks) - p1)
        self.size("dictentry_general", b3.find(struct.pack("<Q", id(gk[1]))) - 8 - p3)
        self.field("dictentry_general", "me_hash", 0, "i64")
        self.field("dictentry_general", "me_key", 8, "ptr")
        self.field("dictentry_general", "me_value", 16, "ptr")
        self.field("dictentry_unicode", "me_key", 0, "ptr")
        self.field("dictentry_unicode", "me_value", 8, "ptr")
        self.constants.update(DICT_KEYS_GENERAL=0, DICT_KEYS_UNICODE=1, DICT_KEYS_SPLIT=2)
        self.provenance["constants.DICT_KEYS_GENERAL"] = "measured"
        self.provenance["constants.DICT_KEYS_UNICODE"] = "measured"
        # A deleted key: the combined table keeps the slot (key NULL in 3.11+ unicode tables).
        d = {f"del{i}": i for i in range(4)}
        del d["del1"]
        kp = m.word(id(d) + ma_keys)
        self.check(struct.unpack_from("<q", m.raw(kp, 64), nent)[0] == 4, "dict nentries counts deleted slots")

    # -- instances: managed dicts, inline values, slots -----------------------------------
    def instances(self) -> None:
        m = self.m
        ma_keys, ma_values = self.off("dict", "ma_keys"), self.off("dict", "ma_values")
        first = _Plain()
        first.zz_a = "first-a"
        first.zz_b = "first-b"
        o = _Plain()
        o.zz_b = "val-b"  # inserted in the other order: the values prefix records it
        o.zz_a = "val-a"
        flags = type(o).__flags__
        pre = m.words(id(o) - 4 * PTR, 4)
        managed = bool(flags & (1 << 4))
        if not managed:
            raise CalibrationFailed(f"instances do not use a managed dict (flags {flags:#x}); unsupported layout")
        self.constants["TPFLAGS_MANAGED_DICT"] = 1 << 4
        self.provenance["constants.TPFLAGS_MANAGED_DICT"] = "header, verified on a plain class"
        values_slot = None
        for i, p in enumerate(pre):
            if p and m.readable(p, 16) and m.words(p, 2) == (id(o.zz_a), id(o.zz_b)):
                values_slot = i
        if values_slot is None:
            # 3.13+: values live inline after the object header.
            base = type(o).__basicsize__
            blk = m.raw(id(o), base + 64)
            pos = blk.find(struct.pack("<QQ", id(o.zz_a), id(o.zz_b)))
            if pos < 0:
                raise CalibrationFailed("instance attribute values not found (managed dict layout unknown)")
            self.field("instance", "inline_values", pos, "ptr")
        else:
            self.field("instance", "values_ptr", (values_slot - 4) * PTR, "ptr")
            vp = pre[values_slot]
            prefix = m.raw(vp - 8, 8)
            # 3.11/3.12: values[-1] = prefix size, values[-2] = count, order bytes before that.
            if prefix[7] % 8 == 0 and prefix[6] == 2 and list(prefix[5:3:-1]) == [1, 0]:
                self.constants["DICT_VALUES_ORDER"] = 1  # order bytes precede the values array
                self.provenance["constants.DICT_VALUES_ORDER"] = "measured"
            else:
                raise CalibrationFailed(f"unknown split-values prefix {prefix.hex()}")
        # materialise the dict
        dct = o.__dict__
        pre2 = m.words(id(o) - 4 * PTR, 4)
        slot = one("managed dict pointer", [i for i, p in enumerate(pre2) if p == id(dct)])
        self.field("instance", "dict_ptr", (slot - 4) * PTR, "ptr")
        self.check(m.word(id(dct) + ma_values) != 0, "materialised instance dict is split")
        self.keys_of_plain = m.word(id(dct) + ma_keys)
        kind = m.raw(self.keys_of_plain + self.off("dictkeys", "dk_kind"), 1)[0]
        self.check(kind == 2, "instance dict keys have the split kind")
        self.constants["DICT_KEYS_SPLIT"] = 2
        self.provenance["constants.DICT_KEYS_SPLIT"] = "measured"
        # GC header just before the object (after the managed-dict pre-header).
        lst = []
        gc_next, gc_prev = m.words(id(lst) - 16, 2)
        self.gc_head_next_of_new = gc_next
        self.size("gc_head", 16, "derived: two pointers before the object")
        self.field("gc_head", "gc_next", 0, "ptr")
        self.field("gc_head", "gc_prev", 8, "ptr")
        self.constants["GC_PREV_MASK"] = ~3 & 0xFFFFFFFFFFFFFFFF
        self.provenance["constants.GC_PREV_MASK"] = "header: low two bits of _gc_prev are flags"
        # slots
        s = _Slotted()
        sentinel = "slot-sentinel-value"
        s.beta = sentinel
        slot_off = one("slot offset", m.find_word(id(s), type(s).__basicsize__, id(sentinel)))
        desc = _Slotted.__dict__["beta"]
        self.field("memberdescr", "d_type", one("d_type", m.find_word(id(desc), 64, id(_Slotted))), "ptr")
        self.field("memberdescr", "d_name", one("d_name", m.find_word(id(desc), 64, id(desc.__name__))), "ptr")
        cands = []
        for off in range(16, 80, 8):
            p = m.word(id(desc) + off)
            if m.readable(p, 40):
                namep = m.word(p)
                if m.readable(namep, 4) and m.cstring(namep) == b"beta":
                    cands.append(off)
        self.field("memberdescr", "d_member", one("d_member", cands), "ptr")
        md = m.word(id(desc) + cands[0])
        mdsize = type.__itemsize__
        self.size("memberdef", mdsize)
        self.field("memberdef", "name", 0, "ptr")
        self.field("memberdef", "offset", one("memberdef.offset", m.find_word(md, mdsize, slot_off)), "i64")
        self.field("memberdef", "type", one("memberdef.type", [o for o in m.find_int(md, mdsize, 16) if o != self.off("memberdef", "offset")]), "i32")
        self.constants["T_OBJECT_EX"] = 16
        self.provenance["constants.T_OBJECT_EX"] = "header, verified on a __slots__ member"

    # -- types ---------------------------------------------------------------------------------
    def types(self) -> None:
        m = self.m
        import collections

        heap = [_Plain, _Plain2, _Slotted, _Props]
        static = [int, tuple, dict, str, float, collections.OrderedDict]
        size = type.__basicsize__
        ascii_data = self.off("unicode", "ascii_data")
        self.field("type", "tp_name", common("tp_name", *[m.find_word(id(t), size, id(t.__name__) + ascii_data) for t in heap]), "ptr")
        for t in static:
            name = m.cstring(m.word(id(t) + self.off("type", "tp_name")))
            self.check(name is not None and name.decode().rsplit(".", 1)[-1] == t.__name__, f"tp_name of {t.__name__}")
        samples = heap + static
        self.field("type", "tp_basicsize", common("tp_basicsize", *[m.find_word(id(t), 64, t.__basicsize__, 16) for t in samples]), "i64")
        self.field("type", "tp_itemsize", common("tp_itemsize", *[m.find_word(id(t), 64, t.__itemsize__, 16) for t in samples]), "i64")
        self.field("type", "tp_flags", common("tp_flags", *[m.find_word(id(t), size, t.__flags__) for t in samples]), "u64")
        self.field("type", "tp_base", common("tp_base", *[m.find_word(id(t), size, id(t.__base__)) for t in samples]), "ptr")
        self.field("type", "tp_bases", common("tp_bases", *[m.find_word(id(t), size, id(t.__bases__)) for t in samples]), "ptr")
        self.field("type", "tp_mro", common("tp_mro", *[m.find_word(id(t), size, id(t.__mro__)) for t in samples]), "ptr")
        self.field("type", "tp_dictoffset", common("tp_dictoffset", *[
            m.find_word(id(t), size, t.__dictoffset__ & 0xFFFFFFFFFFFFFFFF, 16) for t in samples if t.__dictoffset__]), "i64")
        self.field("type", "tp_weaklistoffset", common("tp_weaklistoffset", *[
            m.find_word(id(t), size, t.__weakrefoffset__, 16) for t in samples if t.__weakrefoffset__]), "i64")
        dicts = []
        for t in heap:
            real = [d for d in gc.get_referents(t) if type(d) is dict and set(d) == set(t.__dict__)]
            dicts.append(m.find_word(id(t), size, id(real[0])) if real else [])
        self.field("type", "tp_dict", common("tp_dict", *dicts), "ptr")
        self.size("type", size, "measured: type.__basicsize__ (sizeof PyHeapTypeObject)")
        _Plain2.__qualname__ = "calibration.Plain2.qualname"  # so that name and qualname differ
        self.field("heaptype", "ht_name", one("ht_name", m.find_word(id(_Plain2), size, id(_Plain2.__name__))), "ptr")
        self.field("heaptype", "ht_qualname", one("ht_qualname", m.find_word(id(_Plain2), size, id(_Plain2.__qualname__))), "ptr")
        self.field("heaptype", "ht_cached_keys", one("ht_cached_keys", m.find_word(id(_Plain), size, self.keys_of_plain)), "ptr")
        slots = []
        for off in range(self.off("heaptype", "ht_name"), size, 8):
            p = m.word(id(_Slotted) + off)
            if p and m.readable(p, 40) and m.word(p + 8) == id(tuple) and m.word(p + 16) == 2:
                items = m.words(p + self.off("tuple", "ob_item"), 2)
                if set(items) == {id("alpha"), id("beta")}:
                    slots.append(off)
        self.field("heaptype", "ht_slots", one("ht_slots", slots), "ptr")
        flags = {
            "TPFLAGS_HEAPTYPE": 1 << 9, "TPFLAGS_BASETYPE": 1 << 10, "TPFLAGS_HAVE_GC": 1 << 14,
            "TPFLAGS_LONG_SUBCLASS": 1 << 24, "TPFLAGS_LIST_SUBCLASS": 1 << 25, "TPFLAGS_TUPLE_SUBCLASS": 1 << 26,
            "TPFLAGS_BYTES_SUBCLASS": 1 << 27, "TPFLAGS_UNICODE_SUBCLASS": 1 << 28, "TPFLAGS_DICT_SUBCLASS": 1 << 29,
            "TPFLAGS_BASE_EXC_SUBCLASS": 1 << 30, "TPFLAGS_TYPE_SUBCLASS": 1 << 31,
        }
        owners = {"TPFLAGS_HEAPTYPE": _Plain, "TPFLAGS_BASETYPE": int, "TPFLAGS_HAVE_GC": list,
                  "TPFLAGS_LONG_SUBCLASS": bool, "TPFLAGS_LIST_SUBCLASS": list, "TPFLAGS_TUPLE_SUBCLASS": tuple,
                  "TPFLAGS_BYTES_SUBCLASS": bytes, "TPFLAGS_UNICODE_SUBCLASS": str, "TPFLAGS_DICT_SUBCLASS": dict,
                  "TPFLAGS_BASE_EXC_SUBCLASS": ValueError, "TPFLAGS_TYPE_SUBCLASS": type}
        for name, bit in flags.items():
            self.check(bool(owners[name].__flags__ & bit), f"{name} set on {owners[name].__name__}")
            self.check(not (object.__flags__ & bit) or name in ("TPFLAGS_BASETYPE",), f"{name} clear on object")
            self.constants[name] = bit
            self.provenance[f"constants.{name}"] = "header, verified on real types"

    # -- functions and friends -----------------------------------------------------------------
    def functions(self) -> None:
        m = self.m

        def fn(a, b=1, *, c=2) -> "ann":  # noqa: F821 - a string annotation is the sample
            """doc of fn"""
            return a + b + c + outer_cell

        outer_cell = 5
        fn.__dict__["x"] = 1
        fn.__annotations__  # noqa: B018 - materialise
        size = type(fn).__basicsize__
        self.size("function", size)
        pairs = {
            "func_globals": fn.__globals__, "func_builtins": fn.__builtins__, "func_name": fn.__name__,
            "func_qualname": fn.__qualname__, "func_code": fn.__code__, "func_defaults": fn.__defaults__,
            "func_kwdefaults": fn.__kwdefaults__, "func_closure": fn.__closure__, "func_doc": fn.__doc__,
            "func_dict": fn.__dict__, "func_module": fn.__module__, "func_annotations": fn.__annotations__,
        }
        for field, val in pairs.items():
            hits = m.find_word(id(fn), size, id(val), start=16)
            if field == "func_name":
                hits = [h for h in hits if h != self.off("function", "func_qualname")] if "func_qualname" in self.structs.get("function", {}).get("fields", {}) else hits
            self.field("function", field, one(f"function.{field}", hits), "ptr")
        cell = fn.__closure__[0]
        self.field("cell", "ob_ref", one("cell.ob_ref", m.find_word(id(cell), 24, id(cell.cell_contents), 16)), "ptr")

        class K:
            def meth(self):
                return 1

        k = K()
        bound = k.meth
        self.field("method", "im_func", one("method.im_func", m.find_word(id(bound), 48, id(K.meth), 16)), "ptr")
        self.field("method", "im_self", one("method.im_self", m.find_word(id(bound), 48, id(k), 16)), "ptr")
        for kind, obj in (("staticmethod", _Props.__dict__["st"]), ("classmethod", _Props.__dict__["cl"])):
            obj.__dict__["mark"] = 1
            self.field(kind, "callable", one(f"{kind}.callable", m.find_word(id(obj), 48, id(obj.__func__), 16)), "ptr")
            self.field(kind, "dict", one(f"{kind}.dict", m.find_word(id(obj), 48, id(obj.__dict__), 16)), "ptr")
        prop = _Props.__dict__["prop_attr"]
        self.field("property", "fget", one("property.fget", m.find_word(id(prop), 80, id(prop.fget), 16)), "ptr")
        self.field("property", "doc", one("property.doc", m.find_word(id(prop), 80, id(prop.__doc__), 16)), "ptr")
        fset = self.off("property", "fget") + 8
        self.field("property", "fset", fset, "ptr", "derived: follows fget")
        self.field("property", "fdel", fset + 8, "ptr", "derived: follows fset")
        mod = sys.modules[__name__] if __name__ in sys.modules else sys.modules["__main__"]
        self.field("module", "md_dict", one("module.md_dict", m.find_word(id(mod), 64, id(mod.__dict__), 16)), "ptr")
        self.size("module", type(mod).__basicsize__)

    # -- code objects ---------------------------------------------------------------------------
    def code(self) -> None:
        m = self.m
        c1, c2 = _sample_code()
        size = type(c1).__basicsize__
        self.size("code", size)
        self.constants["CODE_UNIT_SIZE"] = type(c1).__itemsize__ or 2
        for field in ("co_consts", "co_names", "co_exceptiontable", "co_filename", "co_name", "co_qualname", "co_linetable"):
            if not hasattr(c1, field):
                continue
            hits = common(f"code.{field}", m.find_word(id(c1), size, id(getattr(c1, field)), 16),
                          m.find_word(id(c2), size, id(getattr(c2, field)), 16))
            self.field("code", field, hits, "ptr")

        def lp_names(c):
            return c.co_varnames + tuple(n for n in c.co_cellvars if n not in c.co_varnames) + c.co_freevars

        names, kinds = [], []
        for off in range(16, size - 7, 8):
            p1, p2 = m.word(id(c1) + off), m.word(id(c2) + off)
            if m.readable(p1, 32) and m.readable(p2, 32):
                item0 = p1 + self.off("tuple", "ob_item")
                if m.word(p1 + 8) == id(tuple) and m.word(p1 + 16) == len(lp_names(c1)) and m.word(item0) == id(lp_names(c1)[0]):
                    names.append(off)
                if m.word(p1 + 8) == id(bytes) and m.word(p1 + 16) == len(lp_names(c1)) and m.word(p2 + 8) == id(bytes):
                    kinds.append(off)
        self.field("code", "co_localsplusnames", one("co_localsplusnames", names), "ptr")
        self.field("code", "co_localspluskinds", one("co_localspluskinds", kinds), "ptr")
        ints = {
            "co_argcount": (c1.co_argcount, c2.co_argcount),
            "co_posonlyargcount": (c1.co_posonlyargcount, c2.co_posonlyargcount),
            "co_kwonlyargcount": (c1.co_kwonlyargcount, c2.co_kwonlyargcount),
            "co_stacksize": (77, 55),
            "co_firstlineno": (4321, 8765),
            "co_flags": (c1.co_flags, c2.co_flags),
            "co_nlocals": (c1.co_nlocals, c2.co_nlocals),
            "co_nlocalsplus": (len(lp_names(c1)), len(lp_names(c2))),
            "co_ncellvars": (len(c1.co_cellvars), len(c2.co_cellvars)),
            "co_nplaincellvars": (len(c1.co_cellvars), 0),
            "co_nfreevars": (len(c1.co_freevars), len(c2.co_freevars)),
        }
        code_start = None
        raw1 = m.raw(id(c1), size + len(c1.co_code))
        pos = raw1.find(c1.co_code, 16)
        if pos < 0:
            raise CalibrationFailed("code bytes not found inline in the code object")
        code_start = pos
        self.field("code", "co_code_adaptive", code_start, "bytes")
        self.check(m.word(id(c1) + 16) == len(c1.co_code) // 2, "code ob_size counts code units")
        taken = {f[0] for f in self.structs["code"]["fields"].values()}
        for field, (v1, v2) in ints.items():
            h1 = [o for o in m.find_int(id(c1), code_start, v1, start=16) if not any(o - 8 < t < o + 4 for t in taken if t % 8 == 0)]
            h2 = m.find_int(id(c2), code_start, v2, start=16)
            cand = sorted(set(h1) & set(h2))
            if len(cand) != 1:
                # Disambiguate with a third sample where counts differ (replace keeps others).
                c3 = c1.replace(co_stacksize=91, co_firstlineno=2222)
                cand = [o for o in cand if struct.unpack_from("<i", m.raw(id(c3) + o, 4))[0] == {"co_stacksize": 91, "co_firstlineno": 2222}.get(field, v1)]
            self.field("code", field, one(f"code.{field}", cand), "i32")
        self.constants.update(CO_FAST_LOCAL=0x20, CO_FAST_CELL=0x40, CO_FAST_FREE=0x80)
        kp = m.word(id(c1) + self.off("code", "co_localspluskinds"))
        kb = m.raw(kp + self.off("bytes", "ob_sval"), len(lp_names(c1)))
        self.check(kb[lp_names(c1).index("cellA")] == 0x40 and kb[lp_names(c1).index("l1")] == 0x20, "CO_FAST_* kinds on sample")
        for flag in ("CO_OPTIMIZED", "CO_NEWLOCALS", "CO_VARARGS", "CO_VARKEYWORDS", "CO_NESTED", "CO_GENERATOR",
                     "CO_NOFREE", "CO_COROUTINE", "CO_ITERABLE_COROUTINE", "CO_ASYNC_GENERATOR"):
            if hasattr(inspect, flag):
                self.constants[flag] = getattr(inspect, flag)
                self.provenance[f"constants.{flag}"] = "inspect module"

    # -- sets --------------------------------------------------------------------------------
    def sets(self) -> None:
        m = self.m
        small = {"set-a", "set-b", "set-c", "set-x"}
        small.discard("set-x")  # used 3, fill 4: tells the two counters apart
        big = {f"set-item-{i}" for i in range(100)}
        self.field("set", "used", common("set.used", m.find_word(id(small), 64, 3, 16), m.find_word(id(big), 64, 100, 16)), "i64")
        tables = []
        for o in range(16, 80, 8):
            p = m.word(id(big) + o)
            if m.readable(p, 16 * 1024):
                blk = m.raw(p, 16 * 1024)
                keys = {struct.unpack_from("<Q", blk, i)[0] for i in range(0, len(blk), 16)}
                if all(id(x) in keys for x in big):  # the real table holds every member
                    tables.append(o)
        table = self.field("set", "table", one("set.table", tables), "ptr")
        self.field("set", "mask", common("set.mask", [o for o in range(16, table, 8) if m.word(id(big) + o) in (255, 127, 511)],
                                         [o for o in range(16, table, 8) if m.word(id(small) + o) == 7]), "i64")
        self.field("set", "fill", common("set.fill", m.find_word(id(big), table, 100, 16), m.find_word(id(small), table, 4, 16)), "i64")
        p = m.word(id(small) + table)
        self.check(m.readable(p, 16 * 8), "small set table readable")
        self.size("setentry", 16)
        blk = m.raw(p, 16 * 8)
        item = "set-a"
        pos = blk.find(struct.pack("<Q", id(item)))
        self.check(pos >= 0 and struct.unpack_from("<q", blk, pos + 8)[0] == hash(item), "set entry is (key, hash)")
        self.field("setentry", "key", 0, "ptr")
        self.field("setentry", "hash", 8, "i64")
        s = {"gone-1", "gone-2", "stay"}
        s.discard("gone-1")
        tp = m.word(id(s) + table)
        keys = [m.word(tp + 16 * i) for i in range(8)]
        dummy = [k for k in keys if k and k not in (id("gone-2"), id("stay"))]
        self.check(len(dummy) == 1, "one dummy key after a discard")
        dname = m.cstring(m.word(m.word(dummy[0] + 8) + self.off("type", "tp_name")))
        self.dummy_type_name = dname.decode() if dname else ""
        self.size("set", set.__basicsize__)

    # -- interpreter state ------------------------------------------------------------------
    def interpreter(self) -> dict:
        m = self.m
        api = ctypes.pythonapi
        runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
        api.PyInterpreterState_Get.restype = ctypes.c_void_p
        api.PyThreadState_Get.restype = ctypes.c_void_p
        interp = api.PyInterpreterState_Get()
        tstate = api.PyThreadState_Get()
        hits = m.find_word(runtime, 4096, interp)
        if not hits:
            raise CalibrationFailed("interpreter pointer not found in _PyRuntime")
        self.field("runtime", "interpreters_head", hits[0], "ptr", "measured (first pointer to the main interpreter)")
        if len(hits) > 1:
            self.field("runtime", "interpreters_main", hits[1], "ptr")
        span = 256 * 1024
        while not m.readable(interp, span):
            span //= 2
        self.field("interp", "threads_head", one("interp.threads_head", m.find_word(interp, 256, tstate)), "ptr")
        self.field("interp", "runtime", one("interp.runtime", m.find_word(interp, 512, runtime)), "ptr")
        self.field("interp", "modules", one("interp.modules", m.find_word(interp, span, id(sys.modules))), "ptr")
        self.field("interp", "sysdict", one("interp.sysdict", m.find_word(interp, span, id(sys.__dict__))), "ptr")
        bh = m.find_word(interp, span, id(builtins.__dict__))
        self.field("interp", "builtins", bh[0], "ptr", "measured (first pointer to builtins.__dict__)")
        # GC generations: a new tracked object is the tail of generation 0, so its gc_next is the
        # address of that generation's list head inside the interpreter state.
        gc.collect()
        probe = []
        # Objects made after `probe` follow it in the list; the head is the first node that lies
        # inside the interpreter state.
        gen0 = m.word(id(probe) - 16)
        for _ in range(10000):
            if interp <= gen0 < interp + span or not m.readable(gen0, 16):
                break
            gen0 = m.word(gen0)
        thresholds = gc.get_threshold()
        gens = []
        if interp <= gen0 < interp + span:
            base = gen0 - interp
            stride = None
            for cand in (24, 32, 40, 48):
                if struct.unpack("<i", m.raw(gen0 + cand + 16, 4))[0] == thresholds[1]:
                    stride = cand
                    break
            self.check(struct.unpack("<i", m.raw(gen0 + 16, 4))[0] == thresholds[0], "gc gen0 threshold follows its head")
            if stride is None:
                raise CalibrationFailed("gc generation stride not found")
            self.field("interp", "gc_generations", base, "bytes")
            self.size("gc_generation", stride)
            self.field("gc_generation", "head", 0, "bytes")
            self.field("gc_generation", "threshold", 16, "i32")
            self.field("gc_generation", "count", 20, "i32")
            self.constants["GC_NUM_GENERATIONS"] = len(thresholds)
            gens = [gen0 + i * stride for i in range(len(thresholds))]
            # gc.freeze() moves every tracked object to the permanent generation: find its head
            # the same way as generation 0's, then move everything back.
            if hasattr(gc, "freeze"):
                frozen_probe = []
                gc.freeze()
                try:
                    perm = m.word(id(frozen_probe) - 16)
                    for _ in range(10_000_000):
                        if interp <= perm < interp + span or not m.readable(perm, 16):
                            break
                        perm = m.word(perm)
                finally:
                    gc.unfreeze()
                if not interp <= perm < interp + span:
                    raise CalibrationFailed("permanent GC generation not found")
                self.field("interp", "gc_permanent", perm - interp, "bytes")
        del probe
        # thread state
        self.field("tstate", "interp", one("tstate.interp", m.find_word(tstate, 128, interp)), "ptr")
        self.field("tstate", "thread_id", one("tstate.thread_id", m.find_word(tstate, 512, threading.get_ident())), "u64")
        nid = m.find_word(tstate, 512, threading.get_native_id())
        if nid:
            self.field("tstate", "native_thread_id", nid[0], "u64")
        ev = threading.Event()
        started = threading.Event()
        other = {}

        def worker():
            other["t"] = api.PyThreadState_Get()
            started.set()
            ev.wait(10)

        th = threading.Thread(target=worker)
        th.start()
        started.wait(10)
        try:
            head = m.word(interp + self.off("interp", "threads_head"))
            self.check(head == other["t"], "newest thread state is the list head")
            self.field("tstate", "next", one("tstate.next", m.find_word(head, 64, tstate)), "ptr")
            self.field("tstate", "prev", one("tstate.prev", m.find_word(tstate, 64, head)), "ptr")
        finally:
            ev.set()
            th.join()
        self.frames(tstate)
        return {"gens": gens}

    def frames(self, tstate: int) -> None:
        m = self.m
        frame = sys._getframe()
        code = frame.f_code
        fsize = type(frame).__basicsize__
        interp_frame = None
        for off in range(16, fsize, 8):
            p = m.word(id(frame) + off)
            if m.readable(p, 64) and id(code) in m.words(p, 8) and id(frame.f_globals) in m.words(p, 8):
                interp_frame = p
                self.field("frameobject", "f_frame", off, "ptr")
                break
        if interp_frame is None:
            raise CalibrationFailed("frame object does not point to an interpreter frame")
        w = m.words(interp_frame, 10)
        self.field("iframe", "f_code", one("iframe.f_code", [i * 8 for i, v in enumerate(w) if v == id(code)]), "ptr")
        self.field("iframe", "f_globals", one("iframe.f_globals", [i * 8 for i, v in enumerate(w) if v == id(frame.f_globals)]), "ptr")
        self.field("iframe", "f_builtins", one("iframe.f_builtins", [i * 8 for i, v in enumerate(w) if v == id(frame.f_builtins)]), "ptr")
        self.field("iframe", "frame_obj", one("iframe.frame_obj", [i * 8 for i, v in enumerate(w) if v == id(frame)]), "ptr")
        caller = frame.f_back
        prev = m.word(id(caller) + self.off("frameobject", "f_frame"))
        self.field("iframe", "previous", one("iframe.previous", [i * 8 for i, v in enumerate(w) if v == prev]), "ptr")
        # The currently executing frame is reachable from the thread state, directly (3.13+) or
        # through the C-stack frame record (3.11/3.12 `cframe`). While we read, the executing
        # frame is one of our own helpers below this one, so follow `previous` a few steps.
        prev_off = self.off("iframe", "previous")

        def reaches(v: int) -> bool:
            for _ in range(8):
                if v == interp_frame:
                    return True
                if not m.readable(v + prev_off, 8):
                    return False
                v = m.word(v + prev_off)
            return False

        tw = m.words(tstate, 64)
        direct = [i * 8 for i, v in enumerate(tw) if v and reaches(v)]
        if direct:
            self.field("tstate", "current_frame", direct[0], "ptr")
        else:
            via = []
            for i, p in enumerate(tw):
                if p and m.readable(p, 32):
                    for j, v in enumerate(m.words(p, 4)):
                        if v and reaches(v):
                            via.append((i * 8, j * 8))
            if not via:
                raise CalibrationFailed("current frame not reachable from the thread state")
            self.field("tstate", "cframe", via[0][0], "ptr")
            self.field("cframe", "current_frame", via[0][1], "ptr")
        # localsplus: the frame's first local is this method's `self` (a plain loop: a
        # comprehension mentioning `self` would turn it into a cell variable).
        lp = []
        for i, v in enumerate(m.words(interp_frame, 16)):
            if v == id(self):
                lp.append(i * 8)
        self.field("iframe", "localsplus", one("iframe.localsplus", lp), "items")
        fn = Calibrator.__dict__["frames"]
        self.field("iframe", "f_func", one("iframe.f_func", [i * 8 for i, v in enumerate(w) if v == id(fn)]), "ptr")
        code_addr = id(code) + self.off("code", "co_code_adaptive")
        pi = [i * 8 for i, v in enumerate(w) if code_addr <= v < code_addr + len(code.co_code)]
        if pi:
            self.field("iframe", "prev_instr", pi[0], "ptr")

    # -- opcodes -------------------------------------------------------------------------------
    @staticmethod
    def opcodes() -> dict:
        ops = {
            "opname": list(opcode.opname),
            "opmap": dict(opcode.opmap),
            "have_argument": opcode.HAVE_ARGUMENT,
            "extended_arg": opcode.EXTENDED_ARG,
            "hasjrel": list(getattr(opcode, "hasjrel", [])),
            "hasjabs": list(getattr(opcode, "hasjabs", [])),
            "hasconst": list(opcode.hasconst),
            "hasname": list(opcode.hasname),
            "haslocal": list(opcode.haslocal),
            "hasfree": list(opcode.hasfree),
            "hascompare": list(opcode.hascompare),
        }
        specs = getattr(opcode, "_specializations", None)
        if specs is None:
            try:
                from _opcode_metadata import _specializations as specs  # type: ignore  # 3.13+
            except ImportError:
                specs = {}
        specialized = {}
        import dis

        specialized.update(getattr(dis, "_all_opmap", {}))  # 3.11/3.12: specialised ops fill free slots
        try:
            import _opcode_metadata  # type: ignore

            specialized.update(getattr(_opcode_metadata, "_specialized_opmap", {}))
        except ImportError:
            pass
        name_to_op = dict(opcode.opmap)
        name_to_op.update(specialized)
        if hasattr(opcode, "_specialized_instructions"):
            for i, name in enumerate(opcode._specialized_instructions):
                name_to_op.setdefault(name, None)
        names = list(opcode.opname)
        for op, name in enumerate(names):
            name_to_op.setdefault(name, op)
        deopt = {}
        for base, variants in specs.items():
            for v in variants:
                if name_to_op.get(v) is not None and base in name_to_op:
                    deopt[name_to_op[v]] = name_to_op[base]
        ops["deopt"] = {str(k): v for k, v in sorted(deopt.items())}
        ops["opname_full"] = {str(op): name for name, op in name_to_op.items() if op is not None}
        cache = getattr(opcode, "_inline_cache_entries", None)
        if isinstance(cache, dict):
            ops["cache_entries"] = {str(name_to_op[n]): c for n, c in cache.items() if n in name_to_op}
        elif cache is not None:
            ops["cache_entries"] = {str(i): c for i, c in enumerate(cache) if c}
        else:
            ops["cache_entries"] = {}
        return ops

    # -- all -------------------------------------------------------------------------------------
    def run(self) -> dict:
        gc.disable()
        try:
            self.object_header()
            self.unicode()
            self.numbers()
            self.sequences()
            self.dicts()
            self.instances()
            self.types()
            self.functions()
            self.code()
            self.sets()
            extra = self.interpreter()
        finally:
            gc.enable()
        vi = sys.version_info
        return {
            "format": FORMAT,
            "kind": "cpython-layout",
            "python": {
                "version": platform.python_version(),
                "minor": f"{vi.major}.{vi.minor}",
                "hexversion": sys.hexversion,
                "implementation": sys.implementation.name,
                "abiflags": getattr(sys, "abiflags", ""),
                "debug_build": hasattr(sys, "gettotalrefcount"),
                "free_threaded": bool(getattr(sys, "_is_gil_enabled", lambda: True)() is False),
                "pointer_size": struct.calcsize("P"),
                "byteorder": sys.byteorder,
                "machine": platform.machine(),
                "system": platform.system(),
            },
            "structs": {k: self.structs[k] for k in sorted(self.structs)},
            "constants": dict(sorted(self.constants.items())),
            "set_dummy_type_name": self.dummy_type_name,
            "opcodes": self.opcodes(),
            "provenance": dict(sorted(self.provenance.items())),
            "self_checks": len(self.checks),
            "gc_generations_found": len(extra["gens"]),
        }


def calibrate() -> dict:
    if sys.implementation.name != "cpython":
        raise CalibrationFailed(f"only CPython can be calibrated, not {sys.implementation.name}")
    if struct.calcsize("P") != 8 or sys.byteorder != "little":
        raise CalibrationFailed("only 64-bit little-endian interpreters are supported")
    if not sys.platform.startswith("linux"):
        raise CalibrationFailed("calibration reads /proc/self/maps and needs Linux")
    return Calibrator().run()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Measure this interpreter's CPython struct layouts for zen.")
    ap.add_argument("-o", "--output", help="write the profile here (default: stdout)")
    args = ap.parse_args(argv)
    try:
        prof = calibrate()
    except CalibrationFailed as exc:
        print(f"calibration failed: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(prof, indent=1, sort_keys=False) + "\n"
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
