"""What the objects target (objects_target.py) records about its code objects and functions, as plain data.

Kept apart from the target's object definitions: these helpers describe code, the target's own code is what is
described. Runs under every CPython the tests image (3.8-3.14).
"""

from __future__ import annotations

import sys
import types


def _cell_full(c) -> bool:
    try:
        _ = c.cell_contents
        return True
    except ValueError:
        return False


def instrument(functions) -> list:
    """3.12+: instrument these functions' code for line and instruction events, as a debugger or
    coverage tool would (sys.monitoring rewrites their bytecode in place); the ids of their code."""
    mon = getattr(sys, "monitoring", None)
    if mon is None:
        return []
    tool = mon.DEBUGGER_ID
    mon.use_tool_id(tool, "zen-objects-target")
    for event in (mon.events.LINE, mon.events.INSTRUCTION):
        mon.register_callback(tool, event, lambda *args: None)
    for f in functions:
        mon.set_local_events(tool, f.__code__, mon.events.LINE | mon.events.INSTRUCTION | mon.events.CALL)
    return [id(f.__code__) for f in functions]


def code_fields(code) -> dict:
    """A code object as plain data: what a reader of this image must recover, field by field.
    Nested code objects among the constants are described the same way."""

    def const(c):
        if isinstance(c, types.CodeType):
            return {"code": code_fields(c)}
        if isinstance(c, (tuple, frozenset)):
            items = [const(x) for x in c]
            return {type(c).__name__: items if isinstance(c, tuple) else sorted(items, key=repr)}
        return {"repr": repr(c)}

    return {
        "co_code": code.co_code.hex(),
        "consts": [const(c) for c in code.co_consts],
        **{
            k: getattr(code, k)
            for k in (
                "co_names",
                "co_varnames",
                "co_cellvars",
                "co_freevars",
                "co_argcount",
                "co_posonlyargcount",
                "co_kwonlyargcount",
                "co_stacksize",
                "co_firstlineno",
                "co_flags",
                "co_nlocals",
                "co_name",
                "co_qualname",  # 3.11+
                "co_filename",
            )  # fmt: skip
            if hasattr(code, k)
        },
        # 3.10 has co_linetable, 3.8/3.9 co_lnotab; no exception table before 3.11
        "co_linetable": (code.co_linetable if hasattr(code, "co_linetable") else code.co_lnotab).hex(),
        **({"co_exceptiontable": code.co_exceptiontable.hex()} if hasattr(code, "co_exceptiontable") else {}),
    }


def collect_functions() -> list:
    """(function, where) for every function reachable from module dicts and class dicts."""
    seen: set[int] = set()
    out = []
    seen_cls: set[int] = set()

    def add(f, where):
        if isinstance(f, types.FunctionType) and id(f) not in seen:
            seen.add(id(f))
            out.append((f, where))

    def visit_class(cls, where, depth=0):
        if id(cls) in seen_cls or depth > 10:
            return
        seen_cls.add(id(cls))
        try:
            items = list(vars(cls).items())
        except TypeError:
            return
        for name, v in items:
            w = f"{where}.{name}"
            if isinstance(v, (staticmethod, classmethod)):
                add(v.__func__, w)
            elif isinstance(v, property):
                for acc in (v.fget, v.fset, v.fdel):
                    add(acc, w)
            elif isinstance(v, type):
                visit_class(v, w, depth + 1)
            else:
                add(v, w)

    for mname, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for name, v in items:
            if isinstance(v, type):
                visit_class(v, f"{mname}.{name}")
            else:
                add(v, f"{mname}.{name}")
    return out
