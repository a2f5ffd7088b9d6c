"""Calibration of interpreter state: _PyRuntime, interpreter, threads, frames, GC generations; opcodes."""

from __future__ import annotations

import builtins
import ctypes
import gc
import struct
import sys
import threading

from zen.cpython.calibration.base import CalibrationFailed, one


class StateMixin:
    def interpreter(self) -> dict:
        m = self.m
        api = ctypes.pythonapi
        runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
        get_interp = getattr(api, "PyInterpreterState_Get", None) or api._PyInterpreterState_Get  # 3.8: private
        get_interp.restype = ctypes.c_void_p
        api.PyThreadState_Get.restype = ctypes.c_void_p
        interp = get_interp()
        tstate = api.PyThreadState_Get()
        rspan = 4096  # 3.10's _PyRuntime can end its mapping sooner
        while rspan > 256 and not m.readable(runtime, rspan):
            rspan -= 256
        hits = m.find_word(runtime, rspan, interp)
        if not hits:
            raise CalibrationFailed("interpreter pointer not found in _PyRuntime")
        self.field("runtime", "interpreters_head", hits[0], "ptr", "measured (first pointer to the main interpreter)")
        if len(hits) > 1:
            self.field("runtime", "interpreters_main", hits[1], "ptr")
        span = 256 * 1024
        while not m.readable(interp, span):
            span //= 2
        # 3.13 put the eval-loop state (~7 KiB) before these fields: look further, take the first.
        th = m.find_word(interp, min(span, 64 * 1024), tstate)
        if not th:
            raise CalibrationFailed("interp.threads_head: the current thread state is not in the interpreter state")
        self.field("interp", "threads_head", th[0], "ptr", "measured (first pointer to the only thread state)")
        rt_hits = m.find_word(interp, min(span, 64 * 1024), runtime)
        if rt_hits or sys.version_info >= (3, 9):  # 3.8's interpreter state has no runtime pointer
            self.field("interp", "runtime", one("interp.runtime", rt_hits), "ptr")
        # The state struct is under 64 KiB in every version; 3.10 allocates it on the heap, where
        # other objects holding the same pointers follow it.
        near = min(span, 64 * 1024)
        self.field("interp", "modules", one("interp.modules", m.find_word(interp, near, id(sys.modules))), "ptr")
        self.field("interp", "sysdict", one("interp.sysdict", m.find_word(interp, near, id(sys.__dict__))), "ptr")
        bh = m.find_word(interp, span, id(builtins.__dict__))
        self.field("interp", "builtins", bh[0], "ptr", "measured (first pointer to builtins.__dict__)")
        # GC generations: a new tracked object is the tail of generation 0, so its gc_next is the
        # address of that generation's list head inside the interpreter state.
        gc.collect()
        probe = []
        # Objects made after `probe` follow it in the list; the head is the first node that lies
        # inside the interpreter state.
        # 3.8 keeps the GC state in _PyRuntime, later versions in the interpreter state.
        gen0 = m.word(id(probe) - 16)
        owner = None
        for _ in range(10000):
            if interp <= gen0 < interp + span:
                owner = ("interp", interp)
            elif runtime <= gen0 < runtime + rspan:
                owner = ("runtime", runtime)
            if owner or not m.readable(gen0, 16):
                break
            gen0 = m.word(gen0)
        thresholds = gc.get_threshold()
        gens = []
        if owner is not None:
            base = gen0 - owner[1]
            stride = None
            for cand in (24, 32, 40, 48):
                if struct.unpack("<i", m.raw(gen0 + cand + 16, 4))[0] == thresholds[1]:
                    stride = cand
                    break
            self.check(struct.unpack("<i", m.raw(gen0 + 16, 4))[0] == thresholds[0], "gc gen0 threshold follows its head")
            if stride is None:
                raise CalibrationFailed("gc generation stride not found")
            self.field(owner[0], "gc_generations", base, "bytes")
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
                    # The permanent head follows the generations array (within a few words in
                    # every version); a heap-allocated state (3.10) has GC objects nearby too.
                    lo, hi = gen0 + stride * len(thresholds), gen0 + stride * len(thresholds) + 256
                    perm = m.word(id(frozen_probe) - 16)
                    for _ in range(10_000_000):
                        if lo <= perm < hi or not m.readable(perm, 16):
                            break
                        perm = m.word(perm)
                finally:
                    gc.unfreeze()
                if not lo <= perm < hi:
                    raise CalibrationFailed("permanent GC generation not found")
                self.field(owner[0], "gc_permanent", perm - owner[1], "bytes")
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
        none_local = None  # noqa: F841 - read back from the frame's locals below
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
        # 3.14: the executable, function and locals are _PyStackRef, pointers with tag bits in
        # the low two bits (1 = deferred/immortal reference, 3 = tagged int). Object pointers
        # are 8-aligned, so searching with those bits cleared finds tagged and plain ones alike.
        untag = ~3
        w = [v & untag for v in m.words(interp_frame, 10)]
        self.field("iframe", "f_code", one("iframe.f_code", [i * 8 for i, v in enumerate(w) if v == id(code)]), "ptr")
        self.field(
            "iframe", "f_globals", one("iframe.f_globals", [i * 8 for i, v in enumerate(w) if v == id(frame.f_globals)]), "ptr"
        )
        self.field(
            "iframe", "f_builtins", one("iframe.f_builtins", [i * 8 for i, v in enumerate(w) if v == id(frame.f_builtins)]), "ptr"
        )
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
            if v & untag == id(self):
                lp.append(i * 8)
        self.field("iframe", "localsplus", one("iframe.localsplus", lp), "items")
        # A local holding an immortal object (None) shows whether stack references are tagged.
        none_slot = m.word(interp_frame + lp[0] + 8 * frame.f_code.co_varnames.index("none_local"))
        self.check(none_slot & untag == id(None), "local variable holding None found in the frame")
        if none_slot != id(None):
            self.constants["STACKREF_TAG_MASK"] = 3
            self.provenance["constants.STACKREF_TAG_MASK"] = "measured: a local holding None carries tag bits"
        fn = StateMixin.__dict__["frames"]
        self.field("iframe", "f_func", one("iframe.f_func", [i * 8 for i, v in enumerate(w) if v == id(fn)]), "ptr")
        code_addr = id(code) + self.off("code", "co_code_adaptive")
        pi = [i * 8 for i, v in enumerate(w) if code_addr <= v < code_addr + len(code.co_code)]
        if pi:
            self.field("iframe", "prev_instr", pi[0], "ptr")

    # -- opcodes -------------------------------------------------------------------------------
    # -- all -------------------------------------------------------------------------------------
