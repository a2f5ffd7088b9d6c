"""Measure what zen reads of a TorchScript graph's nodes (`zen profile torch`): enough to follow data between calls.

A module's `forward` graph says which submodule is called on what: `prim::GetAttr[name="fc1"](%self)` gives the
child, `prim::CallMethod[name="forward"](%child, %x)` calls it, and each node's inputs are values another node (or
the graph's parameters) produced. Measured here on a scripted module: a node's kind (a `c10::Symbol`; the builtin
ones zen needs, `prim::GetAttr`, `prim::CallMethod` and `attr::name`, are compile-time numbers of a torch build, so
their values are data in the profile), its input and output value vectors, a value's producing node and debug name,
a node's attribute vector (each attribute: its name symbol and, for a string attribute, the text), a ClassType's
methods and a function's bare name. Every offset is found by a known value and checked on every node of the graph.

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import struct

from zen.cpython.calibration.base import one

MAX_SCAN = 512


def _module(torch):
    class CalibGraphSub(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, data):
            return self.lin(data)

        @torch.jit.export
        def helper(self, data) -> int:
            return 1

    class CalibGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = CalibGraphSub()
            self.second = CalibGraphSub()

        def forward(self, zen_input):
            return self.second(torch.relu(self.first(zen_input)))

    return torch.jit.script(CalibGraph())


def measure_jit_graph(cal) -> None:
    torch, m = cal.torch, cal.m
    sm = _module(torch)
    sm(torch.ones(1, 2))
    value = cal.off("pybind", "value")

    def ptr(o) -> int:
        return m.word(id(o) + value)

    graph = sm.forward.graph
    nodes = list(graph.nodes()) + [graph.return_node()]
    addrs = [ptr(n) for n in nodes]
    kinds = [n.kind() for n in nodes]
    cal.check({"prim::GetAttr", "prim::CallMethod", "prim::Return"} <= set(kinds), "the graph holds calls")

    def u32(at: int) -> int:
        return struct.unpack("<I", m.raw(at, 4))[0]

    cands = [o for o in range(8, 64, 4) if all((u32(a + o) == u32(b + o)) == (ka == kb)
                                               for a, ka in zip(addrs, kinds) for b, kb in zip(addrs, kinds))]  # fmt: skip
    kind = cal.field("jitnode", "kind", one("Node.kind_", cands[:1]), "u32")
    for label, name in (("GETATTR", "prim::GetAttr"), ("CALLMETHOD", "prim::CallMethod"), ("RETURN", "prim::Return")):
        cal.constants[f"SYM_{label}"] = u32(addrs[kinds.index(name)] + kind)
        cal.provenance[f"constants.SYM_{label}"] = f"measured: the kind of a {name} node (a builtin c10::Symbol)"

    def vec(at: int) -> list[int] | None:
        b, e, cap = m.words(at, 3)
        if b == e == cap == 0:  # an empty vector that never allocated
            return []
        if not (b and b <= e <= cap and e - b <= 8 * 64 and (e - b) % 8 == 0 and m.readable(b, max(e - b, 8))):
            return None
        return list(m.words(b, (e - b) // 8)) if e > b else []

    def field_of(what: str, want) -> int:
        return one(what, [o for o in range(0, MAX_SCAN, 8) if all(
            m.readable(a + o, 24) and vec(a + o) == w for a, w in zip(addrs, want))])  # fmt: skip

    cal.field("jitnode", "inputs", field_of("Node.inputs_", [[ptr(v) for v in n.inputs()] for n in nodes]), "ptr")
    cal.field("jitnode", "outputs", field_of("Node.outputs_", [[ptr(v) for v in n.outputs()] for n in nodes]), "ptr")
    values = [(ptr(v), ptr(v.node()), v.debugName()) for n in nodes for v in n.outputs()]
    values += [(ptr(v), ptr(graph.param_node()), v.debugName()) for v in graph.inputs()]
    cal.field("jitvalue", "node", one("Value.node_", [o for o in range(0, 64, 8)
                                                      if all(m.word(v + o) == n for v, n, _ in values)]), "ptr")  # fmt: skip

    def name_at(v: int, o: int, want: str) -> bool:
        p, n = m.words(v + o, 2)
        return n == len(want) and m.readable(p, max(n, 1)) and m.raw(p, n) == want.encode()

    named = [(v, d) for v, _, d in values if d and not d.isdigit()]
    cal.check(any(d.startswith("zen_input") for _, d in named), "the graph parameter keeps its debug name")
    cal.field("jitvalue", "name", one("Value.unique_name_", [o for o in range(0, 128, 8)
                                                            if all(name_at(v, o, d) for v, d in named)]), "ptr")  # fmt: skip
    # attributes: a GetAttr's and a CallMethod's `name`, a string attribute
    with_name = [(a, n.s("name")) for a, n in zip(addrs, nodes) if n.kind() in ("prim::GetAttr", "prim::CallMethod")]

    def attr_cands(a: int, text: str) -> set[tuple[int, int]]:
        out = set()
        for o in range(0, MAX_SCAN, 8):
            avs = vec(a + o)
            if not avs or not m.readable(a + o, 24):
                continue
            for av in avs:
                if av and m.readable(av, 64):
                    out |= {(o, k) for k in range(8, 64, 8) if name_at(av, k, text)}
        return out

    o, k = one("Node.values_ / StringAttr value", set.intersection(*[attr_cands(a, t) for a, t in with_name]))
    cal.field("jitnode", "attributes", o, "ptr")
    cal.field("jitattr", "text", k, "ptr")
    sym = [u32(vec(a + o)[0] + 8) for a, _ in with_name]  # type: ignore[index]
    cal.check(len(set(sym)) == 1, "every call's name attribute has one symbol")
    cal.field("jitattr", "name", 8, "u32", "measured: the attribute's name symbol follows its vtable (checked below)")
    cal.constants["SYM_ATTR_NAME"] = sym[0]
    cal.provenance["constants.SYM_ATTR_NAME"] = "measured: the name symbol of GetAttr's and CallMethod's attribute"
    # ClassType -> methods; a function's bare name
    ct = m.word(m.word(ptr(sm.first._c) + cal.off("jitmodule", "object")) + cal.off("jitobject", "type"))
    fwd = ptr(sm.first.forward.graph)
    gfn = cal.off("graphfunction", "graph")
    meth = [o for o in range(0, MAX_SCAN, 8) if (fs := vec(ct + o)) and len(fs) == 2
            and any(m.readable(f + gfn, 8) and m.word(f + gfn) == fwd for f in fs)]  # fmt: skip
    methods = cal.field("classtype", "methods", one("ClassType.methods_", meth), "ptr")
    fns = vec(ct + methods) or []
    fname = [o for o in range(8, 256, 8) if sorted(n for f in fns if (n := _text(m, f + o))) == ["forward", "helper"]]
    cal.field("graphfunction", "name", one("GraphFunction name (bare)", fname[:1]), "ptr")


def _text(m, at: int) -> str | None:
    p, n = m.words(at, 2)
    if not (0 < n < 64 and m.readable(p, n)):
        return None
    raw = m.raw(p, n)
    return raw.decode() if raw.isascii() else None
