"""Which Python classes a TorchScript model was compiled from, proven by the process's own bookkeeping.

`torch.jit.script(model)` compiles each module's class from its Python source and records the result in
`torch.jit._recursive.concrete_type_store.type_store`: Python class -> the `ConcreteModuleType`s made from it. Every
scripted module's Python wrapper keeps its own in `_concrete_type`. So a wrapper whose `_concrete_type` is in that
store was compiled, in this process, from that class: its code (recovered by the code stage) is the code the C++
module runs, and a package rebuilt from it with the C++ module's values is the deployed model.

Nothing else links them. A `torch.jit.load`ed module was compiled from TorchScript code in an archive (its wrapper's
`_concrete_type` is made from the C++ type, never stored), and a traced one from a recording of one call
(`torch.jit.trace` does not share types through the store): a Python class of the same name in the image may run
other code, so those stay unlinked: `zen reuse` rebuilds them as a TorchScript archive from their own code
(`reuse.torchscript_archive`) where the image holds it, and refuses otherwise.
"""

from __future__ import annotations

from zen.cpython.interp import Interpreter
from zen.cpython.readers.containers import read_list
from zen.cpython.readers.dicts import dict_get, read_dict
from zen.cpython.readers.instances import read_instance
from zen.cpython.readers.modules import read_module
from zen.runtime.errors import ZenError

STORE_MODULE = "torch.jit._recursive"
MAX_TYPES = 100_000  # ConcreteModuleTypes in the store


def concrete_type_classes(ip: Interpreter, sys_modules: dict[str, int]) -> tuple[dict[int, int], str]:
    """(ConcreteModuleType address -> Python class address, why empty). Bounded: the store's classes and each
    class's list are read with the readers' own item limits, at most MAX_TYPES in all."""
    mod = sys_modules.get(STORE_MODULE)
    if mod is None:
        return {}, f"{STORE_MODULE} is not imported (nothing was scripted in this process)"
    try:
        store = dict_get(ip, read_module(ip, mod).dict, "concrete_type_store")
        if store is None:
            return {}, f"{STORE_MODULE} has no concrete_type_store"
        types = read_instance(ip, store).attrs.get("type_store")
        if types is None:
            return {}, "concrete_type_store has no type_store"
        out: dict[int, int] = {}
        for cls, lst in read_dict(ip, types):
            if ip.kind(cls) != "type" or ip.kind(lst) != "list":
                continue
            for ct in read_list(ip, lst):
                out[ct] = cls
                if len(out) >= MAX_TYPES:
                    return out, ""
        return out, ""
    except ZenError as exc:
        return {}, f"torch's store of scripted classes could not be read: {exc}"


def link_classes(ip: Interpreter, wrappers: dict[int, int], objects: dict[str, int],
                 store: dict[int, int]) -> dict[str, int]:  # fmt: skip
    """Module path -> the Python class its C++ module was scripted from, for the paths whose wrapper's
    `_concrete_type` is in the store (`objects`: path -> C++ Object; `wrappers`: C++ Object -> Python wrapper)."""
    out = {}
    for path, obj in objects.items():
        w = wrappers.get(obj)
        if w is None:
            continue
        try:
            ct = read_instance(ip, w).attrs.get("_concrete_type")
        except ZenError:
            continue
        cls = store.get(ct) if ct is not None else None
        if cls is not None:
            out[path] = cls
    return out


def eager_link(ip: Interpreter, wrappers: dict[int, int], objects: dict[str, int], sys_modules: dict[str, int],
               mr) -> dict[str, int]:  # fmt: skip
    """Link every module of a TorchScript MR to the Python class it was scripted from; record in
    `mr.deployment["eager"]` what was linked and, when not every module was, why; rename linked records to their
    classes' true names. Returns path -> class address (the code stage's seeds)."""
    store, why = concrete_type_classes(ip, sys_modules)
    links = link_classes(ip, wrappers, objects, store) if store else {}
    names = {}
    for rec in mr.modules:
        cls = links.get(rec.path)
        if cls is None:
            continue
        t = ip.type_info(cls)
        rec.cls_module, rec.cls_qualname = t.module, t.qualname
        names[rec.path] = f"{t.module}:{t.qualname}"
    missing = [rec.path for rec in mr.modules if rec.path not in links]
    if missing and not why:
        why = ("not scripted in this process from a Python class (jit.load'ed or traced): it is rebuilt from its "
               "TorchScript code where the image holds it (deployment.torchscript)")  # fmt: skip
    mr.deployment["eager"] = {
        "complete": not missing and bool(mr.modules),
        "how": "each module's wrapper `_concrete_type` found in torch.jit._recursive.concrete_type_store",
        "classes": dict(sorted(names.items())[:1000]),
        "missing": missing[:200], "missing_count": len(missing), "why": why if missing else "",
    }  # fmt: skip
    return links
