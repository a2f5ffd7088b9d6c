"""The globals a model's code loads, per module, encoded so that `reuse` can set them again.

Made from the closure (its code objects, their instructions and the functions running them), not
from the PR's records: recovery makes it while a forked child still makes the last code records,
instead of after waiting for them (on two cores the parent waited ~0.24 s there, and this took
~0.23 s after). What a module holds is decided in address order of the code objects, as the PR
lists them: a name goes to the first code object loading it whose globals hold it. The values are
then encoded in sorted name order, the order the PR stores them and `reuse` decodes them, so that a
shared object's full encoding always comes before the references to it.
"""

from __future__ import annotations

from zen.cpython.program.closure import ClosureResult
from zen.cpython.program.programmatic import functions_of_codes, gc_paused
from zen.cpython.runtime import Runtime


def module_globals(rt: Runtime, result: ClosureResult, addrs: list[int]) -> dict[str, dict]:
    """{module: {name: encoded value}} for the readable code objects `addrs` (address order) of the
    closure; the module is the one of the function running each code's outermost code object."""
    with gc_paused():
        return _encoded(rt, _loaded(rt, result, addrs))


def _loaded(rt: Runtime, result: ClosureResult, addrs: list[int]) -> dict[str, dict[str, int]]:
    """{module: {name: value address}}: every LOAD_GLOBAL of the code objects that its function's
    globals answer (a name missing there is a builtin, or was never set)."""
    known = set(addrs)
    tops: dict[int, int] = {}
    for c in addrs:
        top = c
        for _ in range(len(known)):  # the closure records each code's parent once: a tree, bounded anyway
            parent = result.codes.get(top)
            if not parent or parent not in known:
                break
            top = parent
        tops[c] = top
    fns_of_code = functions_of_codes(rt, result, sorted(set(tops.values())))
    out: dict[str, dict[str, int]] = {}
    for c in addrs:
        fns = fns_of_code.get(tops[c])
        f = rt.function(fns[0]) if fns else None
        ci = rt.code(c)
        if f is None or ci is None:
            continue
        ns = rt.namespace(f.globals)
        names = out.setdefault(rt.module_name(f) or "?", {})
        for ins in rt.instructions(ci):
            if ins.name == "LOAD_GLOBAL" and ins.argval not in names and ins.argval in ns:
                names[ins.argval] = ns[ins.argval]
    return out


def _encoded(rt: Runtime, loaded: dict[str, dict[str, int]]) -> dict[str, dict]:
    from zen.cpython.encode.snapshot import Encoder

    out: dict[str, dict] = {}
    for module, names in sorted(loaded.items()):
        enc = Encoder(rt.ip, home=module) if names else None  # one per module: references stay within it
        out[module] = {name: enc.encode(names[name]) for name in sorted(names)} if enc else {}
    return out
