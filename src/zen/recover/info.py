"""`zen info`: what an image is, which interpreter it holds, and what lives in its heap.

Everything here is read-only analysis; the result is a JSON-able dict the CLI renders. Parts that
fail (e.g. a broken GC list) are reported inside the result instead of aborting, so a damaged
image still yields everything that can soundly be said about it.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from zen.memory.regions import Source
from zen.memory.space import AddressSpace
from zen.runtime.errors import ZenError


def region_summary(space: AddressSpace) -> dict[str, Any]:
    by_source: Counter = Counter()
    count: Counter = Counter()
    for r in space.regions:
        by_source[r.source.value] += r.size
        count[r.source.value] += 1
    return {
        "regions": len(space.regions),
        "mapped_bytes": sum(r.size for r in space.regions),
        "captured_bytes": space.captured_bytes,
        "bytes_by_source": dict(by_source),
        "regions_by_source": dict(count),
        "missing_regions": count.get(Source.MISSING.value, 0),
    }


def image_info(space: AddressSpace, *, top: int = 25, census: bool = True, threads: bool = True) -> dict[str, Any]:
    """Versions, regions, interpreter, heap census and threads of one image."""
    from zen.cpython.heap import Heap
    from zen.cpython.interp import Interpreter

    t0 = time.perf_counter()
    out: dict[str, Any] = {"source": space.description, "problems": list(space.problems), "notes": list(space.notes)}
    out["memory"] = region_summary(space)
    core = getattr(space, "info", None)
    if core is not None:
        out["process"] = {
            "pid": core.pid,
            "command": core.command,
            "threads_in_notes": len(core.threads),
            "producer": core.producer,
            "acquisition": core.acquisition,
            "mapped_files": len(core.files),
        }
    system = getattr(space, "system", None)
    if system is not None:
        out["system"] = system
    ip = Interpreter.open(space)
    out["interpreter"] = ip.info.to_json()
    out["interpreter"]["profile"] = ip.P.source
    out["interpreter"]["profile_why"] = ip.P.why
    out["interpreter"]["well_known_types"] = ip.wk.how
    heap = Heap(ip)
    try:
        mods = heap.sys_modules()
        out["sys_modules"] = len(mods)
        versions = {}
        for name in ("torch", "numpy", "transformers"):
            if name in mods:
                versions[name] = _module_version(ip, mods[name])
        out["packages"] = versions
    except ZenError as exc:
        out["sys_modules_error"] = str(exc)
    if census:
        t1 = time.perf_counter()
        types = heap.all_types()
        counts = heap.census(types)
        rows = []
        for taddr, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: max(top, 0)]:
            try:
                name = ip.type_info(taddr).full_name
            except ZenError:
                name = f"<type at {taddr:#x}>"
            rows.append({"type": name, "addr": f"{taddr:#x}", "count": n})
        out["census"] = {
            "types": len(types),
            "objects": int(sum(counts.values())),
            "top": rows,
            "seconds": round(time.perf_counter() - t1, 3),
        }
        try:
            gens = heap.gc_generations()
            out["gc"] = {"generations": [len(g) for g in gens]}
        except ZenError as exc:
            out["gc"] = {"error": str(exc)}
    if threads:
        try:
            recs = heap.threads()
            out["threads"] = [
                {
                    "thread_id": t.thread_id,
                    "native_id": t.native_id,
                    "stack": [
                        f"{f.get('qualname', '?')} ({f.get('filename', '?')})" if "error" not in f else f["error"]
                        for f in t.frames
                    ],
                }
                for t in recs
            ]
        except ZenError as exc:
            out["threads_error"] = str(exc)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def _module_version(ip, mod_addr: int) -> str | None:
    from zen.cpython.readers.dicts import dict_get
    from zen.cpython.readers.modules import read_module

    try:
        m = read_module(ip, mod_addr)
        v = dict_get(ip, m.dict, "__version__")
        if v is None:
            return None
        if ip.kind(v) == "str":
            return ip.str(v)
        # torch.__version__ is a str subclass (TorchVersion)
        return str(ip.value(v))
    except ZenError:
        return None
