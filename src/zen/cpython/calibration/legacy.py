"""Calibration of the layouts CPython 3.10 and earlier used before 3.11 rebuilt them.

What differs, and so is measured here instead of by the 3.11+ methods:

* dict keys: `dk_size` (a slot count, not its log2), a lookup-function pointer, one entry layout
  (hash, key, value) for every table, split values in the shared keys' entry order (no prefix);
* instances: no managed dict; the `__dict__` pointer lives at `tp_dictoffset`;
* code objects: `co_code` is a bytes object, the local tables are `co_varnames`/`co_cellvars`/
  `co_freevars`, no `co_qualname`, no exception table; the line table is `co_linetable` (3.10)
  or `co_lnotab` (3.8/3.9);
* frames: the frame *object* is the frame; the thread state points at the executing one.

What the 3.11+ methods measure unchanged here (strings with their `wstr` pointer, numbers,
sequences, types, functions, sets, the interpreter and thread states, 3.8's GC lists in
`_PyRuntime`) is measured by them.

Standard library only, and syntax every supported target interpreter accepts: this module runs
inside the interpreter being measured.
"""

from __future__ import annotations

import struct
import sys

from zen.cpython.calibration.base import CalibrationFailed, common, one
from zen.cpython.calibration.samples import _Plain, _sample_code


def _index_width(size: int) -> int:
    return 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4 if size <= 0xFFFFFFFF else 8


class LegacyMixin:
    # -- dict ----------------------------------------------------------------------------------
    def dicts(self) -> None:
        m = self.m
        small = {f"dk{i}": f"dv{i}" for i in range(5)}
        big = {f"bigkey{i}": i for i in range(300)}
        gen = {10**12 + i: f"gv{i}" for i in range(6)}
        keys_field = []
        for o in range(16, dict.__basicsize__, 8):
            p = m.word(id(small) + o)
            blk = m.try_raw(p, 512) if p else None
            k0 = next(iter(small))
            if blk and struct.pack("<QQ", id(k0), id(small[k0])) in blk:
                keys_field.append(o)
        ma_keys = self.field("dict", "ma_keys", one("dict.ma_keys", keys_field), "ptr")
        self.field("dict", "ma_values", ma_keys + 8, "ptr", "derived: the field after ma_keys")
        self.field(
            "dict",
            "ma_used",
            common("dict.ma_used", m.find_word(id(small), ma_keys, 5, start=16), m.find_word(id(big), ma_keys, 300, start=16)),
            "i64",
        )
        self.size("dict", dict.__basicsize__)
        samples = []
        for d in (small, big, gen):
            k = next(iter(d))
            kp = m.word(id(d) + ma_keys)
            blk = m.raw(kp, 8192 + 24 * len(d) * 2)
            pos = blk.find(struct.pack("<QQQ", hash(k) & 0xFFFFFFFFFFFFFFFF, id(k), id(d[k])))
            if pos < 0:
                raise CalibrationFailed("dict entries (hash, key, value) not found in a keys object")
            samples.append((blk, pos, len(d)))
        # dk_size: the slot count S with entries = indices start + S * index width, for every sample
        found = []
        for o in range(8, 64, 8):
            starts = set()
            for blk, pos, _n in samples:
                size = struct.unpack_from("<q", blk, o)[0]
                if size < 8 or size & (size - 1) or size > 1 << 30:
                    break
                starts.add(pos - size * _index_width(size))
            else:
                if len(starts) == 1 and min(starts) > o:
                    found.append((o, starts.pop()))
        if len(found) != 1:
            raise CalibrationFailed(f"dict keys: dk_size ambiguous {found}")
        size_off, indices = found[0]
        self.field("dictkeys", "dk_size", size_off, "i64")
        self.field("dictkeys", "dk_indices", indices, "bytes")
        nent = common(
            "dk_nentries", *[[o for o in range(8, indices, 8) if struct.unpack_from("<q", b, o)[0] == n] for b, _p, n in samples]
        )
        self.field("dictkeys", "dk_nentries", nent, "i64")
        usable = []
        for o in range(8, indices, 8):
            if o in (nent, size_off):
                continue
            if all(
                struct.unpack_from("<q", b, o)[0] == (struct.unpack_from("<q", b, size_off)[0] << 1) // 3 - n
                for b, _p, n in samples
            ):
                usable.append(o)
        self.field("dictkeys", "dk_usable", one("dk_usable", usable), "i64")
        self.field("dictkeys", "dk_refcnt", 0, "i64", "derived: first field")
        step = samples[2][0].find(struct.pack("<Q", id(list(gen)[1]))) - 8 - samples[2][1]
        self.check(step == 24, "dict entries are (hash, key, value), 24 bytes")
        self.size("dictentry_general", step)
        self.field("dictentry_general", "me_hash", 0, "i64")
        self.field("dictentry_general", "me_key", 8, "ptr")
        self.field("dictentry_general", "me_value", 16, "ptr")
        d = {f"del{i}": i for i in range(4)}
        del d["del1"]
        kp = m.word(id(d) + ma_keys)
        self.check(struct.unpack_from("<q", m.raw(kp, 64), nent)[0] == 4, "dict nentries counts deleted slots")

    # -- instances -----------------------------------------------------------------------------
    def instances(self) -> None:
        m = self.m
        ma_keys, ma_values = self.off("dict", "ma_keys"), self.off("dict", "ma_values")
        first = _Plain()
        first.zz_a = "first-a"
        first.zz_b = "first-b"
        o = _Plain()
        o.zz_a = "val-a"
        o.zz_b = "val-b"
        off = type(o).__dictoffset__
        self.check(off > 0 and not type(o).__flags__ & (1 << 4), "instance __dict__ at tp_dictoffset (no managed dict)")
        dct = m.word(id(o) + off)
        self.check(dct == id(o.__dict__), "tp_dictoffset holds the instance dict")
        values = m.word(dct + ma_values)
        self.check(values != 0, "instance dict is split")
        self.check(m.words(values, 2) == (id(o.zz_a), id(o.zz_b)), "split values in the shared keys' entry order")
        self.constants["DICT_VALUES_ORDER"] = 0
        self.provenance["constants.DICT_VALUES_ORDER"] = "measured: values array in the shared keys' entry order, no prefix"
        self.keys_of_plain = m.word(dct + ma_keys)
        self.instances_common()

    # -- code objects ---------------------------------------------------------------------------
    def code(self) -> None:
        m = self.m
        c1, c2 = _sample_code()
        size = type(c1).__basicsize__
        self.size("code", size)
        self.constants["CODE_UNIT_SIZE"] = 2
        self.provenance["constants.CODE_UNIT_SIZE"] = "header: 16-bit code units"
        ptrs = ("co_code", "co_consts", "co_names", "co_varnames", "co_cellvars", "co_freevars", "co_filename", "co_name")
        line = "co_linetable" if hasattr(c1, "co_linetable") else "co_lnotab"
        for field in (*ptrs, line):
            hits = common(
                f"code.{field}",
                m.find_word(id(c1), size, id(getattr(c1, field)), 16),
                m.find_word(id(c2), size, id(getattr(c2, field)), 16),
            )
            self.field("code", field, hits, "ptr")
        ints = {
            "co_argcount": (c1.co_argcount, c2.co_argcount),
            "co_posonlyargcount": (c1.co_posonlyargcount, c2.co_posonlyargcount),
            "co_kwonlyargcount": (c1.co_kwonlyargcount, c2.co_kwonlyargcount),
            "co_stacksize": (77, 55),
            "co_firstlineno": (4321, 8765),
            "co_flags": (c1.co_flags, c2.co_flags),
            "co_nlocals": (c1.co_nlocals, c2.co_nlocals),
        }
        taken = {f[0] for f in self.structs["code"]["fields"].values()}
        c3 = c1.replace(co_stacksize=91, co_firstlineno=2222)
        for field, (v1, v2) in ints.items():
            h1 = [o for o in m.find_int(id(c1), size, v1, start=16) if not any(t <= o < t + 8 for t in taken)]
            cand = sorted(set(h1) & set(m.find_int(id(c2), size, v2, start=16)))
            if len(cand) != 1:
                want = {"co_stacksize": 91, "co_firstlineno": 2222}.get(field, v1)
                cand = [o for o in cand if struct.unpack_from("<i", m.raw(id(c3) + o, 4))[0] == want]
            self.field("code", field, one(f"code.{field}", cand), "i32")
        # 3.10 has no local kinds: readers derive them from the three name tuples and mark them
        # with the 3.11 kind bits, so that every later stage sees one representation.
        self.constants.update(CO_FAST_LOCAL=0x20, CO_FAST_CELL=0x40, CO_FAST_FREE=0x80)
        for k in ("CO_FAST_LOCAL", "CO_FAST_CELL", "CO_FAST_FREE"):
            self.provenance[f"constants.{k}"] = "zen convention: kinds derived from co_varnames/co_cellvars/co_freevars"
        self.code_flags()

    # -- frames --------------------------------------------------------------------------------
    def frames(self, tstate: int) -> None:
        """Frame objects are the frames: `f_back` links them, the thread state's `frame` points
        at the executing one. Recorded under the `iframe` struct names readers use for 3.11+
        interpreter frames (previous = f_back, localsplus = f_localsplus)."""
        m = self.m
        none_local = None  # noqa: F841 - read back from the frame's locals below
        frame = sys._getframe()
        code = frame.f_code
        fsize = type(frame).__basicsize__
        fid = id(frame)
        self.field("iframe", "f_code", one("frame.f_code", m.find_word(fid, fsize, id(code), 16)), "ptr")
        self.field("iframe", "previous", one("frame.f_back", m.find_word(fid, fsize, id(frame.f_back), 16)), "ptr")
        self.field("iframe", "f_globals", one("frame.f_globals", m.find_word(fid, fsize, id(frame.f_globals), 16)), "ptr")
        self.field("iframe", "f_builtins", one("frame.f_builtins", m.find_word(fid, fsize, id(frame.f_builtins), 16)), "ptr")
        lp = m.find_word(fid, fsize + 8 * 8, id(self), 16)
        # locals come before the value stack, which may hold `self` too
        self.field("iframe", "localsplus", min([o for o in lp if o >= fsize - 8] or [-1]), "items")
        self.check(self.off("iframe", "localsplus") > 0, "frame locals follow the frame object")
        slot = self.off("iframe", "localsplus") + 8 * code.co_varnames.index("none_local")
        self.check(m.word(fid + slot) == id(None), "local variable holding None found in the frame")
        prev_off = self.off("iframe", "previous")

        def reaches(v: int) -> bool:
            for _ in range(8):
                if v == fid:
                    return True
                if not m.readable(v + prev_off, 8):
                    return False
                v = m.word(v + prev_off)
            return False

        direct = [i * 8 for i, v in enumerate(m.words(tstate, 32)) if v and reaches(v)]
        if not direct:
            raise CalibrationFailed("current frame not reachable from the thread state")
        self.field("tstate", "current_frame", direct[0], "ptr", "measured (tstate->frame)")
