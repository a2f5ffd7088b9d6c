"""Ground truth for model-specific code, computed in the live process from real objects.

Implements the closure rules documented in zen.cpython.program.closure independently: with `dis` on live
code objects, real `__globals__`/`__builtins__`/`__closure__`, `vars()` of modules and classes and
`gc` to find every class. zen computes the same sets from memory alone; tests compare them.
"""

from __future__ import annotations

import dis
import gc
import sys
import types


def _stdlib_names() -> frozenset:
    """sys.stdlib_module_names (3.10+); before 3.10, the top-level names in the stdlib directory."""
    if hasattr(sys, "stdlib_module_names"):
        return frozenset(sys.stdlib_module_names)
    import os
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    names = set(sys.builtin_module_names)
    for d in (stdlib, os.path.join(stdlib, "lib-dynload")):
        for entry in os.listdir(d):
            if entry != "site-packages":
                names.add(entry.split(".", 1)[0])
    return frozenset(names)


EXCLUDED = frozenset({"torch", "numpy", "builtins", "__future__"}) | _stdlib_names()
CHAIN = ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_ATTR", "LOAD_METHOD")


def excluded(module) -> bool:
    return not module or module.split(".", 1)[0] in EXCLUDED


def functions_in(v) -> list:
    if isinstance(v, types.FunctionType):
        return [v]
    if isinstance(v, (staticmethod, classmethod)):
        return [v.__func__] if isinstance(v.__func__, types.FunctionType) else []
    if isinstance(v, property):
        return [f for f in (v.fget, v.fset, v.fdel) if isinstance(f, types.FunctionType)]
    if isinstance(v, types.MethodType):
        return [v.__func__] if isinstance(v.__func__, types.FunctionType) else []
    return []


def lookup_attr(obj, name):
    if isinstance(obj, types.ModuleType):
        return vars(obj).get(name)
    if isinstance(obj, type):
        for k in obj.__mro__:
            d = vars(k)
            if name in d:
                return d[name]
    return None


def _builtins_of(f) -> dict:
    """f.__builtins__ (3.10+); before, what the function's globals name as __builtins__, as the
    interpreter itself resolves it (a module in __main__, its dict elsewhere)."""
    if hasattr(f, "__builtins__"):
        return f.__builtins__
    b = f.__globals__.get("__builtins__", {})
    return vars(b) if isinstance(b, types.ModuleType) else b


class Truth:
    def __init__(self) -> None:
        self.owners: dict[int, list] = {}
        for cls in gc.get_objects():
            if isinstance(cls, type):
                try:
                    items = list(vars(cls).values())
                except TypeError:
                    continue
                for v in items:
                    for f in functions_in(v):
                        self.owners.setdefault(id(f), []).append(cls)
        for lst in self.owners.values():
            lst.sort(key=id)

    def closure(self, classes) -> dict:
        funcs, klasses, codes, deps = {}, {}, {}, set()
        work = [("class", c) for c in classes]
        seen = set()

        def push(kind, obj):
            if (kind, id(obj)) not in seen:
                seen.add((kind, id(obj)))
                work.append((kind, obj))

        def resolved(v):
            if v is None:
                return
            if isinstance(v, types.FunctionType):
                push("function", v)
            elif isinstance(v, type):
                push("class", v)
            elif "<locals>" in type(v).__qualname__:  # an instance of a class made inside a function: its methods
                for x in list(vars(type(v)).values()):
                    for f in functions_in(x):
                        push("function", f)
            else:
                for f in functions_in(v):
                    push("function", f)

        while work:
            kind, obj = work.pop()
            if kind == "class":
                if excluded(obj.__module__):
                    deps.add(obj.__module__)
                    continue
                klasses[id(obj)] = obj
                for base in obj.__mro__[1:]:
                    push("class", base)
                for v in list(vars(obj).values()):
                    for f in functions_in(v):
                        push("function", f)
                continue
            f = obj
            module = f.__module__ or f.__globals__.get("__name__")
            if excluded(module):
                deps.add(module or "<unknown>")
                continue
            funcs[id(f)] = f
            cells = {}
            for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
                try:
                    cells[name] = cell.cell_contents
                except ValueError:
                    pass
            for v in cells.values():
                resolved(v)
            owners = self.owners.get(id(f), [])
            stack = [(f.__code__, True)]
            while stack:
                code, own = stack.pop()
                if id(code) in codes:
                    continue
                codes[id(code)] = code
                cur = None
                for ins in dis.get_instructions(code):
                    if ins.opname == "EXTENDED_ARG":
                        continue
                    if ins.opname == "LOAD_GLOBAL":
                        g, b = f.__globals__, _builtins_of(f)
                        cur = g[ins.argval] if ins.argval in g else b.get(ins.argval)
                    elif ins.opname == "LOAD_DEREF":
                        cur = cells.get(ins.argval) if own else None
                    elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                        if cur is not None:
                            cur = lookup_attr(cur, ins.argval)
                        else:
                            cur = next((v for o in owners if (v := lookup_attr(o, ins.argval)) is not None), None)
                    else:
                        cur = None
                        continue
                    resolved(cur)
                for c in code.co_consts:
                    if isinstance(c, types.CodeType):
                        stack.append((c, False))
        return {"functions": funcs, "classes": klasses, "codes": codes, "dependencies": sorted(deps)}


def model_truth(truth: Truth, model) -> dict:
    """Ids of the model's model-specific functions, classes and code objects, plus extras."""
    res = truth.closure({type(m) for m in model.modules()})
    return {
        "functions": sorted(res["functions"]),
        "classes": sorted(res["classes"]),
        "codes": sorted(res["codes"]),
        "dependencies": res["dependencies"],
        "defaults": {str(i): repr(f.__defaults__) for i, f in res["functions"].items() if f.__defaults__ is not None},
        "kwdefaults": {str(i): repr(f.__kwdefaults__) for i, f in res["functions"].items() if f.__kwdefaults__ is not None},
        "qualnames": {str(i): f.__qualname__ for i, f in res["functions"].items()},
    }, res["codes"]
