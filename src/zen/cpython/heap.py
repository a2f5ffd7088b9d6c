"""Heap census: find objects by type, all type objects, GC lists, sys.modules, threads and frames.

Two independent ways to find objects, used together:

* a **pointer scan**: every object starts with (refcount, type pointer), so the objects of type T
  are where the aligned word T appears in writable memory, one word after a plausible refcount.
  numpy does this over the whole image in one pass; a per-type check (e.g. a function's code
  pointer must point to a code object) removes stale or coincidental hits, also vectorised.
  It finds untracked objects (str, int, code) and objects the GC lists cannot reach;
* the interpreter's own **GC generation lists** (every container object is on one), walked with a
  step bound. They confirm the scan and give what the interpreter itself considered alive.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from zen.cpython.interp import Interpreter
from zen.cpython.readers.types import TypeInfo, read_type
from zen.memory.allocations import chunk_interiors, without
from zen.memory.prefetch import prefetch
from zen.memory.scan import find_u64_in, find_u64_in_mapped, find_u64_in_ranges, gather_u64, writable_chunks
from zen.runtime.errors import MemoryReadError, ObjectError, ZenError

MAX_GC_WALK = 50_000_000
MAX_META_ROUNDS = 8


@dataclass
class ThreadRecord:
    addr: int
    thread_id: int
    native_id: int | None
    frames: list[dict] = field(default_factory=list)


class Heap:
    """Census queries over one interpreter's memory."""

    def __init__(self, ip: Interpreter) -> None:
        self.ip = ip
        self.space = ip.space
        self._memo = ip.census_memo  # shared by every Heap of this interpreter (an image does not change)
        chunks = self._memo.get("writable_chunks")
        if chunks is None:
            chunks = self._memo["writable_chunks"] = writable_chunks(self.space)
        self._chunks: list = chunks  # type: ignore[assignment]
        self.problems: list[str] = []  # entries skipped as unreadable, each naming what and why

    # -- pointer scans ------------------------------------------------------------------------
    def _find(self, values: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """Aligned words equal to any of `values` in writable memory (`find_u64_in`).

        The first search also maps where user-space pointers are at all (`find_u64_in_mapped`);
        later searches for values inside that span read only those ranges, which leaves out tensor
        data: a census of a multi-GB model process then costs one pass over the image, not one
        pass per question. That first pass itself reads only the start of each large glibc
        allocation (`zen.memory.allocations`): the bulk of the tensor data is never read for it."""
        vals = sorted(set(values))
        span = self._pointer_span()
        fits = span is not None and all(span[0] <= v <= span[1] for v in vals)
        ranges = self._memo.get("pointer_map")
        if fits and ranges is not None:
            return find_u64_in_ranges(self.space, vals, ranges)  # type: ignore[arg-type]
        if fits and ranges is None:
            # inside large malloc'd blocks (tensor storages) only their first bytes (`allocations`)
            pieces = without(self._chunks, chunk_interiors(self.space, self.space.regions))
            hits, found, ranges = find_u64_in_mapped(self.space, vals, pieces, span[0], span[1])  # type: ignore[index]
            self._memo["pointer_map"] = ranges
            return hits, found
        return find_u64_in(self.space, vals, self._chunks)

    def _pointer_span(self) -> tuple[int, int] | None:
        """[lowest, highest] user-space address of writable memory, where every type object lives;
        None when the chunks are not views of a file or buffer (live processes: no pointer map)."""
        if "pointer_span" not in self._memo:
            user = [c for c in self._chunks if c.end <= 1 << 47]
            ok = user and all(hasattr(c, "backing") for c in self._chunks)
            self._memo["pointer_span"] = (min(c.start for c in user), max(c.end for c in user) - 1) if ok else None
        return self._memo["pointer_span"]  # type: ignore[return-value]

    def _plausible(self, cands: np.ndarray, gc_types: np.ndarray | None = None) -> np.ndarray:
        """Mask of candidate object addresses that look like real, live objects (vectorised).

        * the refcount word is plausible;
        * the candidate is not the `ob_size` slot of a tuple whose first item is a type (MRO and
          bases tuples otherwise look exactly like objects of their first class);
        * for types with GC support (`gc_types[i]` True): the GC header before the object is
          either untracked (next == 0) or linked both ways with its predecessor.
        """
        if cands.size == 0:
            return np.zeros(0, dtype=bool)
        aligned = (cands & np.uint64(7)) == 0
        rc, ok = gather_u64(self.space, cands)
        rc &= np.uint64(self.ip.refcnt_mask)
        keep = aligned & ok & (rc > 0) & (rc <= np.uint64(self.ip.limits.max_refcnt))
        before, ok_b = gather_u64(self.space, cands - np.uint64(8))
        keep &= ~(ok_b & (before == np.uint64(self.ip.wk.types["tuple"])))
        if gc_types is not None and gc_types.any():
            hsize = np.uint64(self.ip.P.gc_head.size)
            node = cands - hsize
            nxt, ok_n = gather_u64(self.space, node)
            prev, ok_p = gather_u64(self.space, node + np.uint64(8))
            prev &= np.uint64(self.ip.P.c("GC_PREV_MASK"))
            back, ok_bk = gather_u64(self.space, prev)
            linked = ok_n & ok_p & ok_bk & (back == node) & ((nxt & np.uint64(7)) == 0)
            untracked = ok_n & (nxt == 0)
            keep &= ~gc_types | linked | untracked
        return keep

    def _is_gc_type(self, type_addrs: np.ndarray) -> np.ndarray:
        flags, ok = gather_u64(self.space, type_addrs + np.uint64(self.ip.P.type.tp_flags))
        return ok & ((flags & np.uint64(self.ip.P.c("TPFLAGS_HAVE_GC"))) != 0)

    def _points_to_type(self, addrs: np.ndarray, field_off: int, type_addr: int, allow_null: bool = False) -> np.ndarray:
        """Mask: the pointer at addr+field_off is an object whose ob_type is `type_addr`."""
        ptrs, ok = gather_u64(self.space, addrs + np.uint64(field_off))
        types, ok2 = gather_u64(self.space, ptrs + np.uint64(self.ip.P.object.ob_type))
        good = ok & ok2 & (types == np.uint64(type_addr))
        if allow_null:
            good |= ok & (ptrs == 0)
        return good

    def instances(self, type_addr: int) -> np.ndarray:
        """Addresses of objects whose ob_type is exactly `type_addr` (sorted, validated)."""
        hits, _ = self._find([type_addr])
        cands = hits - np.uint64(self.ip.P.object.ob_type)
        gc_flag = self._is_gc_type(np.array([type_addr], dtype=np.uint64))
        cands = cands[self._plausible(cands, np.repeat(gc_flag, cands.size))]
        return self._type_specific(type_addr, cands)

    def instances_of_types(self, type_addrs: Iterable[int]) -> dict[int, np.ndarray]:
        """Objects of each of many types, found in one pass over memory (validated as `instances`)."""
        tlist = sorted(set(type_addrs))
        if not tlist:
            return {}
        hits, vals = self._find(tlist)
        cands = hits - np.uint64(self.ip.P.object.ob_type)
        keep = self._plausible(cands, self._is_gc_type(vals))
        cands, vals = cands[keep], vals[keep]
        order = np.lexsort((cands, vals))  # group by type, addresses ascending within a type
        cands, vals = cands[order], vals[order]
        uniq, starts = np.unique(vals, return_index=True)
        bounds = dict(zip(uniq.tolist(), zip(starts.tolist(), [*starts[1:].tolist(), len(vals)])))
        out = {}
        for t in tlist:
            lo, hi = bounds.get(t, (0, 0))
            out[t] = self._type_specific(t, cands[lo:hi])
        return out

    def _type_specific(self, type_addr: int, cands: np.ndarray) -> np.ndarray:
        ip, P = self.ip, self.ip.P
        kind = ip.wk.kind_by_type.get(type_addr)
        if cands.size == 0 or kind is None:
            return cands
        if kind == "function":
            return cands[self._points_to_type(cands, P.function.func_code, ip.wk.types["code"])]
        if kind == "code":
            str_t = ip.wk.types["str"]
            m = self._points_to_type(cands, P.code.co_name, str_t) & self._points_to_type(cands, P.code.co_filename, str_t)
            return cands[m]
        if kind == "module":
            return cands[self._points_to_type(cands, P.module.md_dict, ip.wk.types["dict"])]
        if kind == "type":
            return cands
        if kind == "str":
            length, ok = gather_u64(self.space, cands + np.uint64(P.unicode.length))
            return cands[ok & (length <= np.uint64(ip.limits.max_str))]
        return cands

    def all_types(self) -> list[int]:
        """Every type object: instances of `type` and, iteratively, of every metaclass found."""
        cached = self._memo.get("all_types")
        if cached is not None:
            return cached  # type: ignore[return-value]
        ip = self.ip
        flag = np.uint64(ip.P.c("TPFLAGS_TYPE_SUBCLASS"))
        found: set[int] = set()
        metas = {ip.wk.types["type"]}
        seen_metas: set[int] = set()
        for _ in range(MAX_META_ROUNDS):
            new_metas = metas - seen_metas
            if not new_metas:
                break
            seen_metas |= new_metas
            hits, _vals = self._find(new_metas)
            cands = hits - np.uint64(ip.P.object.ob_type)
            # Only heap types have a GC header: static types are plain C data, and what precedes
            # them is whatever the linker put there.
            flags, ok = gather_u64(self.space, cands + np.uint64(ip.P.type.tp_flags))
            heap_type = ok & ((flags & np.uint64(ip.P.c("TPFLAGS_HEAPTYPE"))) != 0)
            cands = cands[ok & self._plausible(cands, heap_type)]
            sizes, ok = gather_u64(self.space, cands + np.uint64(ip.P.type.tp_basicsize))
            cands = cands[ok & (sizes > 0) & (sizes < np.uint64(1 << 24))]
            flags, ok = gather_u64(self.space, cands + np.uint64(ip.P.type.tp_flags))
            found.update(cands.tolist())
            metas |= set(cands[ok & ((flags & flag) != 0)].tolist())
        types = self._memo["all_types"] = sorted(found)
        return types

    def types_named(self, name: str) -> list[int]:
        """Type objects whose full name (module.qualname) or bare name is `name`."""
        out = []
        for t in self.all_types():
            try:
                ti = read_type(self.ip, t)
            except ZenError:
                continue
            if name in (ti.full_name, ti.qualname) or (ti.module == "builtins" and name == f"builtins.{ti.qualname}"):
                out.append(t)
        return out

    def subclasses_of(self, full_name: str) -> list[TypeInfo]:
        """Readable type objects that have a class named `full_name` in their MRO."""
        return [ti for ti, names in self._mro_names() if full_name in names]

    def _mro_names(self) -> list[tuple[TypeInfo, frozenset[str]]]:
        """Every readable type with the full names of its MRO, read once per interpreter
        (front ends ask for the subclasses of several bases; each question is then a filter)."""
        cached = self._memo.get("mro_names")
        if cached is not None:
            return cached  # type: ignore[return-value]
        from zen.cpython import bulk

        bulk.types(self.ip, self.all_types())  # into the type cache, as read_type reads them
        out = []
        names: dict[int, str] = {}  # full name by type address, each built once
        for t in self.all_types():
            try:
                ti = read_type(self.ip, t)
                mro = frozenset(names.get(a) or names.setdefault(a, read_type(self.ip, a).full_name) for a in ti.mro_addrs)
            except ZenError:
                continue
            out.append((ti, mro))
        self._memo["mro_names"] = out
        return out

    def census(self, types: Iterable[int] | None = None) -> dict[int, int]:
        """Number of plausible objects per type address (pointer scan + refcount check)."""
        tset = list(types) if types is not None else self.all_types()
        hits, vals = self._find(tset)
        objs = hits - np.uint64(self.ip.P.object.ob_type)
        keep = self._plausible(objs, self._is_gc_type(vals))
        uniq, counts = np.unique(vals[keep], return_counts=True)
        return dict(zip(uniq.tolist(), counts.tolist()))

    # -- interpreter state --------------------------------------------------------------------
    def interpreter_state(self) -> int:
        ip = self.ip
        if ip.info.runtime is None:
            raise ZenError("_PyRuntime was not located: interpreter state unavailable")
        try:
            interp = ip.ptr(ip.info.runtime + ip.P.runtime.interpreters_head)
        except MemoryReadError as exc:
            raise ZenError(f"interpreter list unreadable: {exc}") from None
        if not interp:
            raise ZenError("the interpreter list in _PyRuntime is empty (process not initialised or finalising)")
        return interp

    def sys_modules(self) -> dict[str, int]:
        """`sys.modules` of the main interpreter: module name -> module object address."""
        from zen.cpython.readers.dicts import read_dict

        cached = self._memo.get("sys_modules")
        if cached is not None:
            out, problems = cached  # type: ignore[misc]
            self.problems += [p for p in problems if p not in self.problems]
            return dict(out)
        ip = self.ip
        d = ip.ptr(self.interpreter_state() + ip.P.interp.modules)
        out = {}
        problems = []
        items = read_dict(ip, d)
        prefetch(ip.space, [k for k, _ in items])  # ~3,000 names scattered over the heap: their reads queued at once
        for k, v in items:
            # one corrupt entry must not hide the others (the model's modules among them)
            try:
                if ip.kind(k) == "str":
                    out[ip.str(k)] = v
            except ZenError as exc:
                problems.append(f"sys.modules entry with key at {k:#x} skipped: {exc}")
        self._memo["sys_modules"] = (out, problems)
        self.problems += problems
        return dict(out)

    def sys_module(self, name: str) -> int | None:
        """`sys_modules().get(name)` without copying the table (encoders ask once per function they meet)."""
        if self._memo.get("sys_modules") is None:
            self.sys_modules()
        return self._memo["sys_modules"][0].get(name)  # type: ignore[index]

    def gc_generations(self) -> list[list[int]]:
        """Objects on each GC generation list (young to old, then the permanent generation)."""
        ip = self.ip
        G = ip.P.gc_generation
        if ip.P.runtime.has("gc_generations"):  # 3.8: one GC state in _PyRuntime
            owner, S = ip.info.runtime, ip.P.runtime
        else:
            owner, S = self.interpreter_state(), ip.P.interp
        base = owner + S.gc_generations
        heads = [base + i * G.size for i in range(ip.P.c("GC_NUM_GENERATIONS"))]
        heads.append(owner + S.gc_permanent)
        hsize = ip.P.gc_head.size
        return [self._walk(h, hsize) for h in heads]

    def _walk(self, head: int, hsize: int) -> list[int]:
        """Objects on one GC list. Each node's prev pointer must name the node before it, so a
        corrupt or stale link is caught at the first step instead of looping."""
        out = []
        mask = self.ip.P.c("GC_PREV_MASK")
        # 3.14.0-3.14.4 (incremental GC) keep a flag in bit 0 of _gc_next; other releases none
        next_mask = self.ip.P.constants.get("GC_NEXT_MASK", (1 << 64) - 1)
        prev, node = head, self.space.u64(head) & next_mask
        steps = 0
        while node != head:
            if node == 0 or node & 7 or steps >= MAX_GC_WALK:
                raise ObjectError(head, f"GC list broken after {steps} objects (next {node:#x})")
            try:
                nxt, back = struct.unpack("<QQ", self.space.read(node, 16))
            except MemoryReadError:
                raise ObjectError(head, f"GC list leaves the image after {steps} objects") from None
            if back & mask != prev:
                raise ObjectError(head, f"GC list inconsistent at {node:#x} after {steps} objects")
            out.append(node + hsize)
            prev, node = node, nxt & next_mask
            steps += 1
        return out

    def threads(self, max_frames: int = 256) -> list[ThreadRecord]:
        """Thread states of the main interpreter with their Python call stacks (innermost first)."""
        ip = self.ip
        T = ip.P.tstate
        out = []
        ts = ip.ptr(self.interpreter_state() + ip.P.interp.threads_head)
        seen = set()
        while ts and ts not in seen and len(out) < 4096:
            seen.add(ts)
            native = ip.space.u64(ts + T.native_thread_id) if T.has("native_thread_id") else None
            rec = ThreadRecord(ts, ip.space.u64(ts + T.thread_id), native)
            try:
                rec.frames = self._frames(ts, max_frames)
            except ZenError as exc:
                rec.frames = [{"error": str(exc)}]
            out.append(rec)
            ts = ip.ptr(ts + T.next)
        return out

    def frame_locals(self, frame: dict) -> dict[str, int]:
        """Local variables of one frame (as listed by `threads()`): name -> value address.

        Cell and free variables are resolved to their contents. Unset locals are left out.
        """
        from zen.cpython.readers.code import read_code
        from zen.cpython.readers.functions import read_cell

        ip = self.ip
        if "code" not in frame or "frame" not in frame:  # a thread whose frames could not be read
            return {}
        ci = read_code(ip, frame["code"])
        n = len(ci.localsplusnames)
        raw = ip.read_within(frame["frame"] + ip.P.iframe.localsplus, 8 * n, frame["frame"], "frame locals")
        untag = ~ip.P.constants.get("STACKREF_TAG_MASK", 0) & 0xFFFFFFFFFFFFFFFF
        vals = [v & untag for v in struct.unpack(f"<{n}Q", raw)]
        c = ip.P.constants
        cellish = c["CO_FAST_CELL"] | c["CO_FAST_FREE"]
        out = {}
        for name, kind, v in zip(ci.localsplusnames, ci.localspluskinds, vals):
            if not v:
                continue
            try:
                if kind & cellish and ip.kind(v) == "cell":
                    v = read_cell(ip, v)
                    if not v:
                        continue
            except ZenError:
                continue
            out[name] = v
        return out

    def _frames(self, ts: int, max_frames: int) -> list[dict]:
        ip = self.ip
        T, F = ip.P.tstate, ip.P.iframe
        if T.has("current_frame"):
            frame = ip.ptr(ts + T.current_frame)
        else:
            cframe = ip.ptr(ts + T.cframe)
            frame = ip.ptr(cframe + ip.P.cframe.current_frame) if cframe else 0
        out = []
        from zen.cpython.readers.code import read_code

        untag = ~ip.P.constants.get("STACKREF_TAG_MASK", 0) & 0xFFFFFFFFFFFFFFFF
        none = ip.wk.singletons.get("None")
        steps = 0
        while frame and len(out) < max_frames and steps < 4 * max_frames:
            steps += 1
            code = ip.ptr(frame + F.f_code) & untag  # 3.14: a tagged stack reference
            if code == none:  # 3.12+: the C stack's entry shim frame runs no code object
                frame = ip.ptr(frame + F.previous)
                continue
            entry = {"frame": frame, "code": code}
            try:
                ci = read_code(ip, code)
                entry.update(qualname=ci.qualname, filename=ci.filename, firstlineno=ci.firstlineno)
                if F.has("f_func"):  # 3.11+: the frame knows its function (3.10 frames do not)
                    entry["function"] = ip.ptr(frame + F.f_func)
            except ZenError as exc:
                entry["error"] = str(exc)
            out.append(entry)
            frame = ip.ptr(frame + F.previous)
        return out
