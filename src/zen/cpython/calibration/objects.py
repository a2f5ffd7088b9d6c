"""Calibration of objects with behaviour: instances (managed dicts, slots), types, functions, code."""

from __future__ import annotations

import gc
import inspect
import struct
import sys

from zen.cpython.calibration.base import PTR, CalibrationFailed, common, one
from zen.cpython.calibration.samples import _Plain, _Plain2, _Props, _sample_code, _Slotted


class ObjectsMixin:
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
        self.inline_values_layout(o, pre)
        # materialise the dict
        dct = o.__dict__
        pre2 = m.words(id(o) - 4 * PTR, 4)
        slot = one("managed dict pointer", [i for i, p in enumerate(pre2) if p == id(dct)])
        self.field("instance", "dict_ptr", (slot - 4) * PTR, "ptr")
        self.check(m.word(id(dct) + ma_values) != 0, "materialised instance dict is split")
        if self.constants["DICT_VALUES_ORDER"] == 2:
            # 3.13+: the materialised dict shares the inline values (ma_values -> header).
            self.check(m.word(id(dct) + ma_values) == id(o) + self.off("instance", "inline_values"), "dict shares inline values")
        self.keys_of_plain = m.word(id(dct) + ma_keys)
        kind = m.raw(self.keys_of_plain + self.off("dictkeys", "dk_kind"), 1)[0]
        self.check(kind == 2, "instance dict keys have the split kind")
        self.constants["DICT_KEYS_SPLIT"] = 2
        self.provenance["constants.DICT_KEYS_SPLIT"] = "measured"
        self.instances_common()

    def instances_common(self) -> None:
        """GC header and `__slots__` members: the same in every supported version."""
        m = self.m
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
        self.field(
            "memberdef",
            "type",
            one("memberdef.type", [o for o in m.find_int(md, mdsize, 16) if o != self.off("memberdef", "offset")]),
            "i32",
        )
        self.constants["T_OBJECT_EX"] = 16
        self.provenance["constants.T_OBJECT_EX"] = "header, verified on a __slots__ member"

    def inline_values_layout(self, o: object, pre: tuple[int, ...]) -> None:
        """Where a never-materialised instance `__dict__` keeps its values, and in what order.

        3.11: a values pointer of its own at obj-4 words, insertion order in a prefix before the
        values. 3.12: one pointer at obj-3 words is either the dict or (values - 1), tagged by
        its low bit. 3.13+: the values are inline after the object header, behind a 4-byte
        header (capacity, size, embedded, valid), insertion order after values[capacity].
        """
        m = self.m
        va, vb = id(o.zz_a), id(o.zz_b)
        values_slot, tagged = None, False
        for i, p in enumerate(pre):
            for cand, tag in ((p, False), (p + 1, True)):
                if p and m.readable(cand, 16) and m.words(cand, 2) == (va, vb):
                    values_slot, tagged = i, tag
        if values_slot is not None:
            self.field("instance", "values_ptr", (values_slot - 4) * PTR, "ptr")
            if tagged:
                self.constants["INSTANCE_VALUES_TAGGED"] = 1
                self.provenance["constants.INSTANCE_VALUES_TAGGED"] = "measured: pointer to values - 1, low bit set"
            vp = pre[values_slot] + (1 if tagged else 0)
            prefix = m.raw(vp - 8, 8)
            # values[-1] = prefix size, values[-2] = count, order bytes before that.
            if prefix[7] % 8 == 0 and prefix[6] == 2 and list(prefix[5:3:-1]) == [1, 0]:
                self.constants["DICT_VALUES_ORDER"] = 1
                self.provenance["constants.DICT_VALUES_ORDER"] = "measured: order prefix before the values"
                return
            raise CalibrationFailed(f"unknown split-values prefix {prefix.hex()}")
        blk = m.raw(id(o), type(o).__basicsize__ + 64)
        pos = blk.find(struct.pack("<QQ", va, vb))
        if pos < 8:
            raise CalibrationFailed("instance attribute values not found (managed dict layout unknown)")
        head = blk[pos - 8 : pos]
        capacity, size, embedded, valid = head[:4]
        if not (size == 2 and embedded == 1 and valid == 1 and capacity >= 2):
            raise CalibrationFailed(f"unknown inline values header {head.hex()}")
        order = m.raw(id(o) + pos + 8 * capacity, 2)
        self.check(list(order) == [1, 0], "inline values insertion order follows values[capacity]")
        self.field("instance", "inline_values", pos - 8, "bytes")
        self.field("dictvalues", "capacity", 0, "u8", "header, verified on an instance")
        self.field("dictvalues", "size", 1, "u8", "header, verified on an instance")
        self.field("dictvalues", "embedded", 2, "u8", "header, verified on an instance")
        self.field("dictvalues", "valid", 3, "u8", "header, verified on an instance")
        self.field("dictvalues", "values", 8, "items", "measured")
        self.constants["DICT_VALUES_ORDER"] = 2
        self.provenance["constants.DICT_VALUES_ORDER"] = "measured: header + values, order after values[capacity]"
        flag = 1 << 2
        self.check(bool(type(o).__flags__ & flag) and not object.__flags__ & flag, "Py_TPFLAGS_INLINE_VALUES on a plain class")
        self.constants["TPFLAGS_INLINE_VALUES"] = flag
        self.provenance["constants.TPFLAGS_INLINE_VALUES"] = "header, verified on a plain class"

    # -- types ---------------------------------------------------------------------------------
    def types(self) -> None:
        m = self.m
        import collections

        heap = [_Plain, _Plain2, _Slotted, _Props]
        static = [int, tuple, dict, str, float, collections.OrderedDict]
        size = type.__basicsize__
        ascii_data = self.off("unicode", "ascii_data")
        self.field(
            "type", "tp_name", common("tp_name", *[m.find_word(id(t), size, id(t.__name__) + ascii_data) for t in heap]), "ptr"
        )
        for t in static:
            name = m.cstring(m.word(id(t) + self.off("type", "tp_name")))
            self.check(name is not None and name.decode().rsplit(".", 1)[-1] == t.__name__, f"tp_name of {t.__name__}")
        samples = heap + static
        self.field(
            "type", "tp_basicsize", common("tp_basicsize", *[m.find_word(id(t), 64, t.__basicsize__, 16) for t in samples]), "i64"
        )
        self.field(
            "type", "tp_itemsize", common("tp_itemsize", *[m.find_word(id(t), 64, t.__itemsize__, 16) for t in samples]), "i64"
        )
        self.field("type", "tp_flags", common("tp_flags", *[m.find_word(id(t), size, t.__flags__) for t in samples]), "u64")
        self.field("type", "tp_base", common("tp_base", *[m.find_word(id(t), size, id(t.__base__)) for t in samples]), "ptr")
        self.field("type", "tp_bases", common("tp_bases", *[m.find_word(id(t), size, id(t.__bases__)) for t in samples]), "ptr")
        self.field("type", "tp_mro", common("tp_mro", *[m.find_word(id(t), size, id(t.__mro__)) for t in samples]), "ptr")
        self.field(
            "type",
            "tp_dictoffset",
            common(
                "tp_dictoffset",
                *[m.find_word(id(t), size, t.__dictoffset__ & 0xFFFFFFFFFFFFFFFF, 16) for t in samples if t.__dictoffset__],
            ),
            "i64",
        )
        self.field(
            "type",
            "tp_weaklistoffset",
            common(
                "tp_weaklistoffset",
                *[m.find_word(id(t), size, t.__weakrefoffset__ & 0xFFFFFFFFFFFFFFFF, 16) for t in samples if t.__weakrefoffset__],
            ),
            "i64",
        )
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
            "TPFLAGS_HEAPTYPE": 1 << 9,
            "TPFLAGS_BASETYPE": 1 << 10,
            "TPFLAGS_HAVE_GC": 1 << 14,
            "TPFLAGS_LONG_SUBCLASS": 1 << 24,
            "TPFLAGS_LIST_SUBCLASS": 1 << 25,
            "TPFLAGS_TUPLE_SUBCLASS": 1 << 26,
            "TPFLAGS_BYTES_SUBCLASS": 1 << 27,
            "TPFLAGS_UNICODE_SUBCLASS": 1 << 28,
            "TPFLAGS_DICT_SUBCLASS": 1 << 29,
            "TPFLAGS_BASE_EXC_SUBCLASS": 1 << 30,
            "TPFLAGS_TYPE_SUBCLASS": 1 << 31,
        }
        owners = {
            "TPFLAGS_HEAPTYPE": _Plain,
            "TPFLAGS_BASETYPE": int,
            "TPFLAGS_HAVE_GC": list,
            "TPFLAGS_LONG_SUBCLASS": bool,
            "TPFLAGS_LIST_SUBCLASS": list,
            "TPFLAGS_TUPLE_SUBCLASS": tuple,
            "TPFLAGS_BYTES_SUBCLASS": bytes,
            "TPFLAGS_UNICODE_SUBCLASS": str,
            "TPFLAGS_DICT_SUBCLASS": dict,
            "TPFLAGS_BASE_EXC_SUBCLASS": ValueError,
            "TPFLAGS_TYPE_SUBCLASS": type,
        }
        for name, bit in flags.items():
            self.check(bool(owners[name].__flags__ & bit), f"{name} set on {owners[name].__name__}")
            self.check(not (object.__flags__ & bit) or name in ("TPFLAGS_BASETYPE",), f"{name} clear on object")
            self.constants[name] = bit
            self.provenance[f"constants.{name}"] = "header, verified on real types"

    # -- functions and friends -----------------------------------------------------------------
    def functions(self) -> None:
        m = self.m

        def fn(a, b=1, *, c=2) -> ann:  # noqa: F821 - a string annotation is the sample
            """doc of fn"""
            return a + b + c + outer_cell

        outer_cell = 5
        fn.__dict__["x"] = 1
        fn.__annotations__  # noqa: B018 - materialise
        size = type(fn).__basicsize__
        self.size("function", size)
        pairs = {
            "func_globals": fn.__globals__,
            "func_builtins": getattr(fn, "__builtins__", None),  # 3.10+
            "func_name": fn.__name__,
            "func_qualname": fn.__qualname__,
            "func_code": fn.__code__,
            "func_defaults": fn.__defaults__,
            "func_kwdefaults": fn.__kwdefaults__,
            "func_closure": fn.__closure__,
            "func_doc": fn.__doc__,
            "func_dict": fn.__dict__,
            "func_module": fn.__module__,
            "func_annotations": fn.__annotations__,
        }
        for field, val in pairs.items():
            if field == "func_builtins" and not hasattr(fn, "__builtins__"):
                continue
            hits = m.find_word(id(fn), size, id(val), start=16)
            if field == "func_name":
                hits = (
                    [h for h in hits if h != self.off("function", "func_qualname")]
                    if "func_qualname" in self.structs.get("function", {}).get("fields", {})
                    else hits
                )
            self.field("function", field, one(f"function.{field}", hits), "ptr")
        cell = fn.__closure__[0]
        self.field(
            "cell",
            "ob_ref",
            one("cell.ob_ref", m.find_word(id(cell), type(cell).__basicsize__, id(cell.cell_contents), 16)),
            "ptr",
        )

        class K:
            def meth(self):
                return 1

        k = K()
        bound = k.meth
        self.field(
            "method", "im_func", one("method.im_func", m.find_word(id(bound), type(bound).__basicsize__, id(K.meth), 16)), "ptr"
        )
        self.field(
            "method", "im_self", one("method.im_self", m.find_word(id(bound), type(bound).__basicsize__, id(k), 16)), "ptr"
        )
        for kind, obj in (("staticmethod", _Props.__dict__["st"]), ("classmethod", _Props.__dict__["cl"])):
            obj.__dict__["mark"] = 1
            self.field(
                kind,
                "callable",
                one(f"{kind}.callable", m.find_word(id(obj), type(obj).__basicsize__, id(obj.__func__), 16)),
                "ptr",
            )
            self.field(
                kind, "dict", one(f"{kind}.dict", m.find_word(id(obj), type(obj).__basicsize__, id(obj.__dict__), 16)), "ptr"
            )
        prop = _Props.__dict__["prop_attr"]
        self.field(
            "property", "fget", one("property.fget", m.find_word(id(prop), type(prop).__basicsize__, id(prop.fget), 16)), "ptr"
        )
        self.field(
            "property", "doc", one("property.doc", m.find_word(id(prop), type(prop).__basicsize__, id(prop.__doc__), 16)), "ptr"
        )
        fset = self.off("property", "fget") + 8
        self.field("property", "fset", fset, "ptr", "derived: follows fget")
        self.field("property", "fdel", fset + 8, "ptr", "derived: follows fset")
        mod = sys.modules[__name__] if __name__ in sys.modules else sys.modules["__main__"]
        self.field(
            "module", "md_dict", one("module.md_dict", m.find_word(id(mod), type(mod).__basicsize__, id(mod.__dict__), 16)), "ptr"
        )
        self.size("module", type(mod).__basicsize__)
        # builtin functions (PyCFunctionObject): the PyMethodDef (whose first field is the C name)
        # and the module the function belongs to (m_module: a str or module object)
        import math as _math

        b = _math.gcd
        bsize = type(b).__basicsize__
        mdefs = []
        for off in range(16, bsize, 8):
            p = m.word(id(b) + off)
            if m.readable(p, 8) and m.readable(m.word(p), 4) and m.cstring(m.word(p)) == b"gcd":
                mdefs.append(off)
        self.field("cfunction", "m_ml", one("cfunction.m_ml", mdefs), "ptr")
        self.field("cfunction", "m_self", one("cfunction.m_self", m.find_word(id(b), bsize, id(b.__self__), 16)), "ptr")
        known = (self.off("cfunction", "m_ml"), self.off("cfunction", "m_self"))
        targets = (id(b.__module__), id(sys.modules[b.__module__]))
        modname = [off for off in range(16, bsize, 8) if off not in known and m.word(id(b) + off) in targets]
        self.field("cfunction", "m_module", one("cfunction.m_module", modname), "ptr")
        self.field("methoddef", "ml_name", 0, "ptr", "derived: first field of PyMethodDef")

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
            hits = common(
                f"code.{field}",
                m.find_word(id(c1), size, id(getattr(c1, field)), 16),
                m.find_word(id(c2), size, id(getattr(c2, field)), 16),
            )
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
        code_start = self._code_start(c1, size)
        self.field("code", "co_code_adaptive", code_start, "bytes")
        self.check(m.word(id(c1) + 16) == len(c1.co_code) // 2, "code ob_size counts code units")
        taken = {f[0] for f in self.structs["code"]["fields"].values()}
        for field, (v1, v2) in ints.items():
            h1 = [
                o for o in m.find_int(id(c1), code_start, v1, start=16) if not any(o - 8 < t < o + 4 for t in taken if t % 8 == 0)
            ]
            h2 = m.find_int(id(c2), code_start, v2, start=16)
            cand = sorted(set(h1) & set(h2))
            if len(cand) != 1:
                # Disambiguate with a third sample where counts differ (replace keeps others).
                c3 = c1.replace(co_stacksize=91, co_firstlineno=2222)
                cand = [
                    o
                    for o in cand
                    if struct.unpack_from("<i", m.raw(id(c3) + o, 4))[0]
                    == {"co_stacksize": 91, "co_firstlineno": 2222}.get(field, v1)
                ]
            if not cand and field in self.OPTIONAL_CODE_INTS:
                self.provenance[f"code.{field}"] = "absent in this version"
                continue
            self.field("code", field, one(f"code.{field}", cand), "i32")
        self.constants.update(CO_FAST_LOCAL=0x20, CO_FAST_CELL=0x40, CO_FAST_FREE=0x80)
        kp = m.word(id(c1) + self.off("code", "co_localspluskinds"))
        kb = m.raw(kp + self.off("bytes", "ob_sval"), len(lp_names(c1)))
        self.check(kb[lp_names(c1).index("cellA")] == 0x40 and kb[lp_names(c1).index("l1")] == 0x20, "CO_FAST_* kinds on sample")
        self._warmup(size)
        self.code_flags()

    def code_flags(self) -> None:
        for flag in (
            "CO_OPTIMIZED",
            "CO_NEWLOCALS",
            "CO_VARARGS",
            "CO_VARKEYWORDS",
            "CO_NESTED",
            "CO_GENERATOR",
            "CO_NOFREE",
            "CO_COROUTINE",
            "CO_ITERABLE_COROUTINE",
            "CO_ASYNC_GENERATOR",
        ):
            if hasattr(inspect, flag):
                self.constants[flag] = getattr(inspect, flag)
                self.provenance[f"constants.{flag}"] = "inspect module"

    OPTIONAL_CODE_INTS = ("co_nplaincellvars",)  # gone in 3.13

    def _code_start(self, c, size: int) -> int:
        """Offset of the inline bytecode. From 3.12 code objects are quickened when created, so
        inline cache entries already hold counters: compare only the instruction units."""
        import opcode

        m = self.m
        code = c.co_code
        raw = m.raw(id(c), size + len(code))
        pos = raw.find(code, 16)
        if pos >= 0:
            return pos
        caches = getattr(opcode, "_inline_cache_entries", None)
        units = []
        i = 0
        while i < len(code):
            op = code[i]
            n = caches.get(opcode.opname[op], 0) if isinstance(caches, dict) else (caches[op] if caches else 0)
            units.append(i)
            i += 2 + 2 * n
        # Quickening may also have replaced opcodes with (super)instruction variants: compare
        # through the version's de-specialisation map, arguments as they are.
        deopt = {int(k): v for k, v in self.opcodes()["deopt"].items()}

        def same(s: int, u: int) -> bool:
            return deopt.get(raw[s + u], raw[s + u]) == code[u] and raw[s + u + 1] == code[u + 1]

        cands = [s for s in range(16, size + 8, 2) if all(same(s, u) for u in units)]
        return one("inline bytecode", cands)

    # -- sets --------------------------------------------------------------------------------

    def _warmup(self, size: int) -> None:
        """3.11 counts a code object's first calls in `co_warmup` (from a negative start to 0, then
        quickens it): find the 16-bit field that moves by one per call. Later versions differ; the
        field is then simply absent from the profile."""
        m = self.m
        ns: dict = {}
        exec(compile("def warm(x):\n    return x\n", "<zen-calibration>", "exec"), ns)  # our own sample
        fn = ns["warm"]
        before = m.raw(id(fn.__code__), size)
        fn(1)
        after = m.raw(id(fn.__code__), size)
        fn(2)
        later = m.raw(id(fn.__code__), size)
        cands = []
        for off in range(16, size - 1, 2):
            a, b, c = (struct.unpack_from("<h", x, off)[0] for x in (before, after, later))
            if a < 0 and b == a + 1 and c == a + 2:
                cands.append((off, a))
        if len(cands) == 1:
            self.field("code", "co_warmup", cands[0][0], "i16")
            self.constants["CODE_WARMUP_INITIAL"] = cands[0][1]
            self.provenance["constants.CODE_WARMUP_INITIAL"] = "measured"
