"""Call-level data-flow edges of a TorchScript model, read from each module's `forward` graph (never run).

The eager path reads them from `forward`'s bytecode (`frontends.pytorch.dataflow`); a scripted, traced or loaded
model has a graph instead, which says the same thing more plainly: `prim::GetAttr[name="fc1"](%self)` is the child,
`prim::CallMethod[name="forward"](%fc1, %x)` calls it, and every other node passes on what its inputs carry. So
the edges have the eager path's form and meaning, and the MR of a TorchScript deployment compares with its eager
base's: `PATH:in:ARG -> child` (a parameter's name without TorchScript's `.N` suffix; a traced graph's unnamed
parameters `arg1`, `arg2`, ...), `child -> child`,
`child -> PATH:out`; a container's calls are its children's, in the order the graph makes them.

Layout from `zen profile torch` (`graph_calibration.py`); every walk is bounded, a graph that cannot be read is
named in `dataflow_skipped`, and its module keeps only its hierarchy edges.
"""

from __future__ import annotations

import re
import struct

from zen.frontends.pytorch.torchscript.ir_types import SymbolTable, has_type_layout
from zen.frontends.pytorch.torchscript.reader import JitNode, JitReader
from zen.runtime.errors import ZenError

GRAPH_FIELDS = {"jitnode": ("kind", "inputs", "outputs", "attributes", "next", "blocks"), "jitvalue": ("node", "name"),
                "jitattr": ("name", "text"), "classtype": ("methods",), "graphfunction": ("name", "graph"),
                "jitgraph": ("block",), "jitblock": ("input", "output")}  # fmt: skip
METHOD = ("TorchScript graphs of each module's forward: edges from the producers of a call's inputs to the called "
          "child (prim::CallMethod on a prim::GetAttr of self), path-insensitive through every other node")  # fmt: skip
MAX_METHODS = 4096
MAX_GRAPH_NODES = 200_000
MAX_EDGES_IN = 4096  # inputs or outputs of one node
MAX_DEPTH = 64  # blocks nested in blocks (prim::If, prim::Loop)
SUFFIX = re.compile(r"\.\d+$")


def has_graph_layout(jr: JitReader) -> bool:
    need = all(c in jr.tp.constants for c in ("SYM_GETATTR", "SYM_CALLMETHOD", "SYM_RETURN", "SYM_ATTR_NAME"))
    return need and all(s in jr.tp.structs and all(f in jr.tp.structs[s]._fields for f in fs) for s, fs in GRAPH_FIELDS.items())


class GraphReader:
    def __init__(self, jr: JitReader) -> None:  # noqa: D107
        self.jr, self.ip, self.tp, self.c = jr, jr.ip, jr.tp, jr.tp.constants

    def _vector(self, at: int, most: int = MAX_EDGES_IN) -> list[int]:
        b, e = self.ip.space.u64(at), self.ip.space.u64(at + 8)
        n, rest = divmod(e - b, 8)
        if rest or not 0 <= n <= most:
            raise ZenError(f"implausible vector at {at:#x} ({e - b:,} bytes)")
        return list(struct.unpack(f"<{n}Q", self.ip.space.read(b, 8 * n))) if n else []

    def forward(self, obj: int, name: str = "forward") -> int:
        """The graph of a module's method (`forward`, or another a trace made: `forward1`); 0: it has none."""
        ct = self.ip.ptr(obj + self.tp.jitobject.type)
        for fn in self._vector(ct + self.tp.classtype.methods, MAX_METHODS):
            if fn and self.jr.string(fn + self.tp.graphfunction.name, 256) == name:
                return self.ip.ptr(fn + self.tp.graphfunction.graph)
        return 0

    def _name(self, node: int) -> str | None:
        for av in self._vector(node + self.tp.jitnode.attributes, 64):
            if av and self.ip.space.u32(av + self.tp.jitattr.name) == self.c["SYM_ATTR_NAME"]:
                return self.jr.string(av + self.tp.jitattr.text, 4096)
        return None

    def edges(self, graph: int, path: str, children: dict[str, str], kinds: dict[int, int] | None = None) -> set[tuple[str, str]]:
        """One module's edges from its forward graph (`children`: attribute name -> child path); `kinds` counts the
        op symbols of its nodes."""
        T = self.tp
        base = path or "<root>"
        block = self.ip.ptr(graph + T.jitgraph.block)
        param = self.ip.ptr(block + T.jitblock.input)
        inputs = self._vector(param + T.jitnode.outputs)
        if not inputs:
            raise ZenError("a forward graph without self")
        # a traced graph's parameters may have no names: then their position (arg1 is the first after self)
        src: dict[int, frozenset[str]] = {v: frozenset({f"{base}:in:{SUFFIX.sub('', self._value_name(v)) or f'arg{i}'}"})
                                          for i, v in enumerate(inputs[1:], 1)}  # fmt: skip
        attr: dict[int, str] = {}  # value -> child attribute name (GetAttr on self)
        out: set[tuple[str, str]] = set()
        self.kinds = kinds if kinds is not None else {}
        budget = [MAX_GRAPH_NODES]
        self._block(block, inputs[0], src, attr, children, out, base, budget, top=True)
        return out

    def _value_name(self, v: int) -> str:
        return self.jr.string(v + self.tp.jitvalue.name, 4096)

    def _block(self, block: int, this: int, src: dict, attr: dict, children: dict, out: set, base: str, budget: list,
               top: bool, depth: int = 0) -> frozenset[str]:  # fmt: skip
        """Walk a block's nodes in order; returns what its returned values carry."""
        T = self.tp
        if depth > MAX_DEPTH:
            raise ZenError(f"graph blocks nested more than {MAX_DEPTH} deep")
        node, last = self.ip.ptr(self.ip.ptr(block + T.jitblock.input) + T.jitnode.next), self.ip.ptr(block + T.jitblock.output)
        seen: set[int] = set()
        while node and node not in seen:
            budget[0] -= 1
            if budget[0] < 0:
                raise ZenError(f"more than {MAX_GRAPH_NODES:,} graph nodes")
            seen.add(node)
            kind = self.ip.space.u32(node + T.jitnode.kind)
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            ins = self._vector(node + T.jitnode.inputs)
            carried = frozenset().union(*(src.get(v, frozenset()) for v in ins))
            if node == last:  # the block's return: prim::Return at the top, the block's outputs inside
                if top:
                    out.update((s, f"{base}:out") for s in carried)
                return carried
            for inner in self._vector(node + T.jitnode.blocks, 64):
                carried |= self._block(inner, this, src, attr, children, out, base, budget, False, depth + 1)
            outs = self._vector(node + T.jitnode.outputs)
            if kind == self.c["SYM_GETATTR"] and ins and ins[0] == this:
                name = self._name(node)
                if name in children and outs:
                    attr[outs[0]] = name
            elif kind == self.c["SYM_CALLMETHOD"] and ins and ins[0] in attr and self._name(node) == "forward":
                child = children[attr[ins[0]]]
                carried = frozenset().union(*(src.get(v, frozenset()) for v in ins[1:]))
                out.update((s, child) for s in carried)
                carried = frozenset({child})
            for v in outs:
                src[v] = carried
            node = self.ip.ptr(node + T.jitnode.next)
        raise ZenError("a graph block whose nodes do not reach its return")


def script_dataflow(jr: JitReader, walk: dict) -> dict:
    """Graph additions for a TorchScript MR: {"dataflow": [[src, dst], ...], "dataflow_method", "dataflow_skipped",
    "operators": {module path: {op: count}} of each forward graph (prim:: bookkeeping left out)}."""
    gr = GraphReader(jr)
    kinds: dict[str, dict[int, int]] = {}
    paths = {n.addr: p for p, n in walk.items() if isinstance(n, JitNode)}
    edges: set[tuple[str, str]] = set()
    skipped: dict[str, str] = {}
    for path, node in walk.items():
        if not isinstance(node, JitNode):
            continue
        children = {name: paths[c] for name, c in node.children if c in paths}
        try:
            graph = gr.forward(node.addr)
            if not graph:
                skipped[path] = "no forward"
                continue
            kinds[path] = {}
            edges |= gr.edges(graph, path, children, kinds[path])
        except ZenError as exc:
            skipped[path] = str(exc)
    out = {"dataflow": sorted([list(e) for e in edges]), "dataflow_method": METHOD, "dataflow_skipped": skipped}
    return {**out, **_operators(jr, kinds)}


def _operators(jr: JitReader, kinds: dict[str, dict[int, int]]) -> dict:
    """Op names of the counted symbols, from libtorch_cpu's symbol table (`ir_types`), when the profile has it."""
    if not has_type_layout(jr):
        return {"operators_skipped": "the torch layout profile has no symbol table: recalibrate with `zen profile torch`"}
    try:
        table = SymbolTable(jr)
        named = {p: {table.name(k): n for k, n in ks.items()} for p, ks in kinds.items()}
    except ZenError as exc:
        return {"operators_skipped": str(exc)}
    return {"operators": {p: dict(sorted((k, n) for k, n in ops.items() if not k.startswith("prim::")))
                          for p, ops in sorted(named.items())}}  # fmt: skip
