"""Build the programmatic representation (PR) and the mapping ϕ (UR) from a model's classes.

Input: the classes implementing each node of a model tree (from a framework front end). Output:
`represent.pr` records. Code objects are described from memory only (never run): function ID
(module:qualname(signature)), attributes, constants as stable display strings, bytecode hash,
normalised listing, and the calls the interpreter had counted before specialising them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from zen.cpython.code.instructions import with_consts
from zen.cpython.code.listing import LISTING_VERSION, listing_sha256, normalise
from zen.cpython.code.listing_legacy import as_311, prologue
from zen.cpython.program.closure import Closure, ClosureResult
from zen.cpython.program.system_table import system_table
from zen.cpython.readers.code import CodeInfo
from zen.cpython.runtime import Runtime
from zen.represent.pr import (
    ClassRecord,
    CodeRecord,
    EncodedRecords,
    NodeMapping,
    ProgrammaticRepresentation,
    Signature,
    UnifiedRepresentation,
)
from zen.runtime.collector import paused as gc_paused
from zen.runtime.errors import ZenError

MAX_CONST = 200


def const_display(rt: Runtime, addr: int) -> str:
    """A constant as it should appear in a listing: stable across processes (sets sorted, code by name).
    Made once per object (`Runtime.const_displays`)."""
    text = rt.const_displays.get(addr)
    if text is None:
        text = rt.const_displays[addr] = _const_display(rt, addr)
    return text


def _const_display(rt: Runtime, addr: int) -> str:
    kind = rt.kind(addr)
    try:
        if kind == "code":
            ci = rt.code(addr)
            return f"<code {ci.qualname}>" if ci else "<code ?>"
        if kind in ("frozenset", "set"):
            from zen.cpython.readers.containers import read_set

            return "frozenset({" + ", ".join(sorted(const_display(rt, a) for a in read_set(rt.ip, addr))) + "})"
        if kind == "tuple":
            from zen.cpython.readers.containers import read_tuple

            items = [const_display(rt, a) for a in read_tuple(rt.ip, addr)]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        text = repr(rt.ip.value(addr, 2))
    except ZenError as exc:
        return f"<unreadable constant: {exc.reason if hasattr(exc, 'reason') else exc}>"
    return text if len(text) <= MAX_CONST else text[: MAX_CONST - 3] + "..."


def listing_of(rt: Runtime, ci: CodeInfo, consts: list[str] | None = None) -> list[str]:
    """The normalised listing; `consts`: the constants' displays when the caller has them."""
    if consts is None:
        consts = [const_display(rt, a) for a in ci.consts]
    if not rt.ip.P.code.has("co_code"):
        return normalise(rt.instructions(ci), consts)
    # before 3.11: first into the shape 3.11 compiles the source to
    instructions = with_consts(rt.instructions(ci), consts)
    c = rt.ip.P.constants
    gen = bool(ci.flags & (c.get("CO_GENERATOR", 0) | c.get("CO_COROUTINE", 0) | c.get("CO_ASYNC_GENERATOR", 0)))
    first = instructions[0].name if instructions else ""
    return normalise(as_311(prologue(ci.cellvars, ci.varnames, ci.freevars, gen, first) + instructions))


def _signature(rt: Runtime, ci: CodeInfo, f) -> Signature:
    c = rt.ip.P.constants
    n, k = ci.argcount, ci.kwonlyargcount
    names = list(ci.varnames)
    i = n + k
    varargs = names[i] if ci.flags & c.get("CO_VARARGS", 4) else None
    i += bool(varargs)
    varkw = names[i] if ci.flags & c.get("CO_VARKEYWORDS", 8) else None
    defaults = 0
    kwdefaults: list[str] = []
    if f is not None:
        try:
            if f.defaults and rt.kind(f.defaults) == "tuple":
                from zen.cpython.readers.containers import read_tuple

                defaults = len(read_tuple(rt.ip, f.defaults))
            if f.kwdefaults and rt.kind(f.kwdefaults) == "dict":
                kwdefaults = sorted(rt.namespace(f.kwdefaults))
        except ZenError:
            pass
    return Signature(names[:n], ci.posonlyargcount, names[n : n + k], varargs, varkw, defaults, kwdefaults)


def _calls(rt: Runtime, addr: int, ci: CodeInfo) -> dict:
    """How often the interpreter saw this code run before specialising it (3.11: co_warmup)."""
    C = rt.ip.P.code
    out = {"specialised": ci.adaptive != ci.code}
    if C.has("co_warmup"):
        start = rt.ip.P.constants.get("CODE_WARMUP_INITIAL", -8)
        w = int.from_bytes(rt.ip.space.read(addr + C.co_warmup, 2), "little", signed=True)
        out["observed"] = max(0, w - start)
        out["saturated"] = w >= 0
    return out


def _repr_plain(rt: Runtime, addr: int) -> str | None:
    if not addr or rt.ip.is_none(addr):
        return None
    try:
        return repr(rt.ip.value(addr, 3))
    except ZenError:
        return "<unreadable>"


def _enc(rt: Runtime, addr: int) -> dict | None:
    if not addr or rt.ip.is_none(addr):
        return None
    from zen.cpython.encode.snapshot import Encoder

    return Encoder(rt.ip).encode(addr)


def _closure_enc(rt: Runtime, f) -> list[dict]:
    """Contents of the function's closure cells, encoded ({"empty": True} for an empty cell)."""
    if not f.closure or rt.ip.is_none(f.closure):
        return []
    from zen.cpython.encode.snapshot import Encoder
    from zen.cpython.readers.containers import read_tuple
    from zen.cpython.readers.functions import read_cell

    enc = Encoder(rt.ip)
    out = []
    try:
        for cell in read_tuple(rt.ip, f.closure):
            v = read_cell(rt.ip, cell)
            out.append(enc.encode(v) if v else {"empty": True})
    except ZenError as exc:
        return [{"unsupported": f"closure unreadable: {exc}"}]
    return out


def code_record(rt: Runtime, code_addr: int, function: int | None, parent: int | None, children: list[int]) -> CodeRecord | None:
    ci = rt.code(code_addr)
    if ci is None:
        return None
    f = rt.function(function) if function else None
    module = rt.module_name(f) if f else None
    holders = rt.holders(function) if function else []
    owner = attr = binding = None
    if holders:
        t = rt.type(holders[0][0])
        owner = t.full_name if t else None
        attr, binding = holders[0][1], holders[0][2]
    sig = _signature(rt, ci, f) if f else None
    consts = [const_display(rt, a) for a in ci.consts]
    lines = listing_of(rt, ci, consts)
    closure = []
    if f is not None and f.closure:
        from zen.cpython.describe import describe
        from zen.cpython.readers.containers import read_tuple
        from zen.cpython.readers.functions import read_cell

        try:
            for cell in read_tuple(rt.ip, f.closure):
                v = read_cell(rt.ip, cell)
                d = describe(rt.ip, v) if v else {}
                closure.append(d.get("value") or d.get("qualname") or d.get("name") or d.get("type", "?") if v else "<empty>")
        except ZenError:
            closure.append("<unreadable>")
    return CodeRecord(
        address=f"{code_addr:#x}",
        function=f"{function:#x}" if function else None,
        fid=f"{module or '?'}:{ci.qualname}{sig.text() if sig else ''}",
        module=module or "?",
        qualname=ci.qualname,
        owner_class=owner,
        signature=sig,
        argcount=ci.argcount, posonlyargcount=ci.posonlyargcount, kwonlyargcount=ci.kwonlyargcount,
        nlocals=ci.nlocals, stacksize=ci.stacksize, flags=ci.flags,
        varnames=list(ci.varnames), cellvars=list(ci.cellvars), freevars=list(ci.freevars), names=list(ci.names),
        consts=consts,
        filename=ci.filename, firstlineno=ci.firstlineno, calls=_calls(rt, code_addr, ci),
        bytecode_sha256=hashlib.sha256(ci.code).hexdigest(), listing_sha256=listing_sha256(lines), listing=lines,
        parent=f"{parent:#x}" if parent else None, children=[f"{c:#x}" for c in children],
        defaults=_repr_plain(rt, f.defaults) if f else None, kwdefaults=_repr_plain(rt, f.kwdefaults) if f else None,
        closure=closure, attr=attr, binding=binding,
        defaults_enc=_enc(rt, f.defaults) if f else None, kwdefaults_enc=_enc(rt, f.kwdefaults) if f else None,
        closure_enc=_closure_enc(rt, f) if f else [], dict_enc=_enc(rt, f.dict) if f and f.dict else None,
        globals_module=_globals_module(rt, f),
    )  # fmt: skip


def _globals_module(rt: Runtime, f) -> str | None:
    if f is None:
        return None
    g = rt.globals_name(f)
    return g if g != rt.module_name(f) else None


def other_function(rt: Runtime, function: int) -> dict:
    """Where and with what state one more function object using a shared code object lives."""
    f = rt.function(function)
    holders = rt.holders(function)
    owner = attr = binding = None
    if holders:
        t = rt.type(holders[0][0])
        owner = t.full_name if t else None
        attr, binding = holders[0][1], holders[0][2]
    return {"function": f"{function:#x}", "qualname": f.qualname if f else None, "module": rt.module_name(f) if f else None,
            "globals_module": _globals_module(rt, f),
            "owner": owner, "attr": attr, "binding": binding,
            "defaults_enc": _enc(rt, f.defaults) if f else None, "kwdefaults_enc": _enc(rt, f.kwdefaults) if f else None,
            "closure_enc": _closure_enc(rt, f) if f else [], "dict_enc": _enc(rt, f.dict) if f and f.dict else None}  # fmt: skip


def class_record(rt: Runtime, taddr: int, model: bool) -> ClassRecord | None:
    t = rt.type(taddr)
    if t is None:
        return None

    def name(a: int) -> str:
        bt = rt.type(a)
        return bt.full_name if bt else f"<type {a:#x}>"

    from zen.cpython.encode.snapshot import Encoder

    enc = Encoder(rt.ip)
    # interpreter bookkeeping, not the class's own attributes (3.13 adds the last two to every class)
    skip = {"__module__", "__qualname__", "__dict__", "__weakref__", "__firstlineno__", "__static_attributes__"}
    attributes = {}
    for key, v in rt.namespace(t.dict_addr).items():
        if key in skip or rt.functions_in(v):
            continue
        attributes[key] = enc.encode(v)
    meta = rt.type(t.metatype)
    metaclass = None if meta is None or meta.full_name == "type" else f"{meta.module}:{meta.qualname}"
    return ClassRecord(f"{taddr:#x}", t.full_name, t.module, t.qualname, [name(b) for b in t.bases],
                       [name(b) for b in t.mro_addrs], sorted({n for n, _ in rt.methods(t)}), model,
                       dict(sorted(attributes.items())), metaclass)  # fmt: skip


def build_pr(rt: Runtime, result: ClosureResult, context: dict, *, system: bool = True,
             records: list[CodeRecord] | None = None, classes: list[ClassRecord] | None = None,
             encoded: EncodedRecords | None = None) -> ProgrammaticRepresentation:  # fmt: skip
    """The PR of a closure. `records`, `classes`: its code and class records when made already
    (`code_records`, in parts: recovery makes some in a forked child; `class_records`); `encoded`:
    the code records after `records`, as the child encoded them (`EncodedRecords`): counted here
    (modules, counts) but not decoded into the PR's `codes`: its file is then
    `pr.dump_bytes(more_codes=encoded)`."""
    with gc_paused():
        return _build_pr(rt, result, context, system, records, classes, encoded)


def class_records(rt: Runtime, result: ClosureResult) -> list[ClassRecord]:
    """The records of the closure's classes, in address order."""
    with gc_paused():
        return [r for r in (class_record(rt, t, True) for t in sorted(result.classes)) if r]


def code_records(rt: Runtime, result: ClosureResult, addrs: list[int] | None = None) -> list[CodeRecord]:
    """The records of the closure's code objects `addrs` (default: all), in address order; one
    record per readable code object (`rt.code`), each independent of the others."""
    fns_of_code = functions_of_codes(rt, result, sorted(result.codes) if addrs is None else addrs)
    children: dict[int, list[int]] = {}
    for c, parent in result.codes.items():
        if parent:
            children.setdefault(parent, []).append(c)
    codes = []
    with gc_paused():
        for c in sorted(result.codes) if addrs is None else addrs:
            fns = fns_of_code.get(c, [])
            rec = code_record(rt, c, fns[0] if fns else None, result.codes[c], sorted(children.get(c, [])))
            if rec is not None:
                rec.functions = [f"{f:#x}" for f in fns]
                rec.others = [other_function(rt, f) for f in fns[1:]]
                codes.append(rec)
    return codes


def functions_of_codes(rt: Runtime, result: ClosureResult, addrs: list[int]) -> dict[int, list[int]]:
    """The functions running each code object; for `addrs` (only: ranking costs), the one a record
    describes first (`_instance_rank`). Decorators make many functions share one code object."""
    fns_of_code: dict[int, list[int]] = {}
    for f, c in sorted(result.code_of_function.items()):
        fns_of_code.setdefault(c, []).append(f)
    for c in addrs:
        fns = fns_of_code.get(c)
        if fns is not None and len(fns) > 1:
            fns.sort(key=lambda f: _instance_rank(rt, f, result.seeds))
    return fns_of_code


def _instance_rank(rt: Runtime, f: int, seeds: set[int]) -> tuple:
    """Which of the functions sharing a code object its record describes (the first; the others
    go to `others`): one held by a model class, else by any class, else none, then by names. Not by
    address: the lowest address changes from one image of a program to the next, and with it the
    record's owner class and module (transformers' `deprecate_kwarg` wrapper runs both
    `Qwen2Attention.forward` and `Qwen2ForCausalLM.forward`), and so the diff's class votes."""
    held = rt.holders(f)
    t = rt.type(held[0][0]) if held else None
    fi = rt.function(f)
    rank = 2 if t is None else 0 if t.addr in seeds else 1
    names = (t.full_name if t else "", held[0][1] if held else "", (rt.module_name(fi) or "") if fi else "",
             fi.qualname if fi else "")  # fmt: skip
    return rank, names, f


def _build_pr(rt: Runtime, result: ClosureResult, context: dict, system: bool, records: list[CodeRecord] | None,
              classes: list[ClassRecord] | None, encoded: EncodedRecords | None) -> ProgrammaticRepresentation:  # fmt: skip
    codes = code_records(rt, result) if records is None else records
    classes = class_records(rt, result) if classes is None else classes
    code_modules = [c.module for c in codes] + (encoded.modules if encoded else [])
    modules = {}
    for name in sorted({m for m in code_modules if m != "?"} | {c.module for c in classes}):
        addr = rt.modules.get(name)
        file = None
        if addr is not None:
            v = rt.module_namespace(addr).get("__file__")
            file = rt.ip.str(v) if v and rt.kind(v) == "str" else None
        modules[name] = file
    heap_types = sum(1 for t in rt.type_addrs if (ti := rt.type(t)) is not None and ti.is_heap)
    counts = {
        "system": {"functions": len(rt.function_addrs), "code_objects": len(rt.code_addrs), "classes": heap_types,
                   "types": len(rt.type_addrs), "modules": len(rt.modules)},
        "model": {"functions": len(result.functions), "code_objects": len(code_modules), "classes": len(classes),
                  "modules": len(modules)},
    }  # fmt: skip
    return ProgrammaticRepresentation(
        codes=codes, classes=classes, modules=modules, dependencies=dict(sorted(result.dependencies.items())),
        counts=counts, context=context, system_codes=system_table(rt) if system else [],
        exclusion=["torch.*", "numpy.*", "builtins", "the standard library"], listing_version=LISTING_VERSION,
    )  # fmt: skip


def build_ur(rt: Runtime, nodes: list[tuple[str, int]], codes: Iterable[str], full: ClosureResult) -> UnifiedRepresentation:
    """ϕ for (path, class address) nodes in module-tree order; `codes`: the addresses of the PR's
    code records (`[c.address for c in pr.codes]`).

    Ownership, in two passes: a node first claims the methods of its own model-specific classes
    (the first node of a class claims them); then each remaining code object of a node's closure
    goes to the first node, in tree order, that reaches it.
    """
    known = set(codes)
    per_class: dict[int, ClosureResult] = {}
    rows = []
    for path, taddr in nodes:
        if taddr not in per_class:
            per_class[taddr] = full.reach([("class", taddr)])
        res = per_class[taddr]
        t = rt.type(taddr)
        model_classes = [a for a in (t.mro_addrs if t else []) if a in res.classes]
        methods = set()
        for a in model_classes:
            ct = rt.type(a)
            for _, f in rt.methods(ct) if ct else []:
                code = res.code_of_function.get(f)
                if code is not None and f"{code:#x}" in known:
                    methods.add(f"{code:#x}")
        closure = sorted(f"{c:#x}" for c in res.codes if f"{c:#x}" in known)
        rows.append((path, t, model_classes, methods, closure))
    owner: dict[str, str] = {}
    for path, _, _, methods, _ in rows:
        for c in sorted(methods):
            owner.setdefault(c, path)
    for path, _, _, _, closure in rows:
        for c in closure:
            owner.setdefault(c, path)
    out = []
    for path, t, model_classes, methods, closure in rows:
        owned = [c for c in closure if owner.get(c) == path]
        used = [c for c in closure if owner.get(c) != path]
        out.append(NodeMapping(path, t.full_name if t else "?", [rt.type(a).full_name for a in model_classes],
                               sorted(methods), owned, used))  # fmt: skip
    shared = len({c for n in out for c in n.used})
    return UnifiedRepresentation(out, shared)


def model_closure(rt: Runtime, class_addrs: list[int]) -> ClosureResult:
    cl = Closure(rt)
    for t in class_addrs:
        cl.add_class(t)
    with gc_paused():
        result = cl.run()
    result.seeds = set(class_addrs)
    return result
