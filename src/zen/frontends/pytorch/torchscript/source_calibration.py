"""Measure where a `torch.jit.load`ed module keeps its TorchScript code (`zen profile torch`).

`torch.jit.load` compiles the archive's `code/**.py` files; each file's text stays alive as a `torch::jit::Source`
(a cord of string pieces, and the file name) that every graph node compiled from it points to through its source
range. The chain measured here: a module's `ClassType` -> its `CompilationUnit` (every function and method the
archive defined) -> each function's `Graph` -> its top `Block` -> the nodes (a ring from the block's input node to its
output node, and the blocks nested in `prim::If`/`prim::Loop` nodes) -> each node's optional source range -> the
`Source` -> its file name and text pieces. Measured on a module saved and loaded again here, whose files' texts
are known (read from the archive), and checked against those texts.

Standard library + torch only: runs in the calibration child of `../calibration.py`.
"""

from __future__ import annotations

import io
import zipfile

from zen.cpython.calibration.base import one

MAX_SCAN = 512  # bytes of a C++ object searched for one field


def _module(torch):
    """A module whose code spans three files (the root class, a library Linear, a free function) and a nested block."""

    class CalibSrc(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.flag = True

        def forward(self, x):
            if self.flag:
                x = torch.nn.functional.relu(self.lin(x))
            return x * 2.0

    return torch.jit.script(CalibSrc())


def _vector(m, addr: int, elem: int = 8, most: int = 1 << 16) -> list[int] | None:
    b, e, cap = m.words(addr, 3)
    if not (b and b <= e <= cap and 0 < e - b <= most * elem and (e - b) % elem == 0 and m.readable(b, e - b)):
        return None
    return list(m.words(b, (e - b) // elem)) if elem == 8 else [b + i for i in range(0, e - b, elem)]


def measure_jit_source(cal) -> None:
    torch, m = cal.torch, cal.m
    buf = io.BytesIO()
    torch.jit.save(_module(torch), buf)
    files = {}
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        for name in z.namelist():
            rel = name.split("/", 1)[1]
            if rel.startswith("code/") and rel.endswith(".py"):
                files[rel] = z.read(name)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    loaded(torch.ones(2, 3))  # compiles the graphs the source ranges hang from
    value = cal.off("pybind", "value")

    def ptr(o) -> int:
        return m.word(id(o) + value)

    graph = loaded.forward.graph
    gp, lin_gp = ptr(graph), ptr(loaded.lin.forward.graph)
    obj_off, type_off = cal.off("jitmodule", "object"), cal.off("jitobject", "type")
    cts = [m.word(m.word(ptr(s._c) + obj_off) + type_off) for s in (loaded, loaded.lin)]

    # ClassType -> CompilationUnit (both modules share it) -> functions, one of which has the forward graph
    def cu_cands(ct: int) -> set[tuple[int, int, int]]:
        out = set()
        for o in range(0, MAX_SCAN, 8):
            cu = m.word(ct + o)
            if not (cu and m.readable(cu, 256)):
                continue
            for k in range(0, 256, 8):
                fns = _vector(m, cu + k)
                if not fns or not 3 <= len(fns) <= 64 or not all(f and m.readable(f, 256) for f in fns):
                    continue
                at = [{j for f in fns for j in m.find_word(f, 256, g)} for g in (gp, lin_gp)]  # both forwards
                out |= {(o, k, j) for j in at[0] & at[1]}
        return out

    # a weak_ptr is {element, control block}, and make_shared puts the element 16 bytes into its control block:
    # the same vector is found through both words; the element pointer is the first
    cands = sorted(set.intersection(*[cu_cands(ct) for ct in cts]))
    if len(cands) == 2 and cands[1] == (cands[0][0] + 8, cands[0][1] + 16, cands[0][2]):
        cands = cands[:1]
    o, k, j = one("ClassType.compilation_unit_ / CompilationUnit.functions_ / GraphFunction.graph_", cands)
    cal.field("classtype", "compilation_unit", o, "ptr")
    cal.field("compilationunit", "functions", k, "ptr")
    cal.field("graphfunction", "graph", j, "ptr")
    fns = _vector(m, m.word(cts[0] + o) + k) or []
    # Graph -> Block (input and output nodes) -> the ring of nodes
    param, ret = ptr(graph.param_node()), ptr(graph.return_node())
    cands = [(a, i, r) for a in range(0, MAX_SCAN, 8) if m.readable(blk := m.word(gp + a), 64)
             for i in m.find_word(blk, 64, param) for r in m.find_word(blk, 64, ret)]  # fmt: skip
    a, i, r = one("Graph.block_ / Block.input_ / Block.output_", cands)
    cal.field("jitgraph", "block", a, "ptr")
    cal.field("jitblock", "input", i, "ptr")
    cal.field("jitblock", "output", r, "ptr")
    nodes = [ptr(n) for n in graph.nodes()]
    ring = [param, *nodes, ret]
    nxt = one("Node.next_in_graph", [x for x in range(0, MAX_SCAN, 8)
                                     if all(m.word(p + x) == q for p, q in zip(ring, ring[1:]))])  # fmt: skip
    cal.field("jitnode", "next", nxt, "ptr")
    ifs = [n for n in graph.nodes() if n.kind() == "prim::If"]
    cal.check(bool(ifs), "the calibration forward compiles to a prim::If")
    blocks = [ptr(b) for b in list(ifs[0].blocks())]
    at = [x for x in range(0, MAX_SCAN, 8) if _vector(m, ptr(ifs[0]) + x) == blocks]
    cal.field("jitnode", "blocks", one("Node.blocks_", at), "ptr")

    # node -> Source (pieces: {size, data} string views; the file name), checked against the archive's texts
    def source_of(node: int, x: int) -> tuple[str, bytes] | None:
        src = m.word(node + x)
        if not (src and m.readable(src, 128)):
            return None
        pieces = _vector(m, src, 16, 4096)
        if not pieces:
            return None
        text = b""
        for p in pieces:
            n, data = m.words(p, 2)
            if not (0 < n < 1 << 24 and m.readable(data, n)):
                return None
            text += m.raw(data, n)
        for f in range(8, 160, 8):
            fp, fn = m.words(src + f, 2)
            if 0 < fn < 256 and m.readable(fp, fn) and files.get(name := m.raw(fp, fn).decode("ascii", "replace")) == text:
                return name, text
        return None

    offs = (a, i, r, nxt, cal.off("jitnode", "blocks"))
    every = list(dict.fromkeys(n for f in fns for n in _nodes(m, m.word(f + j), *offs)))
    inner = [ptr(n) for n in list(ifs[0].blocks())[0].nodes()]
    cal.check(bool(inner) and set(ring) | set(inner) <= set(every), "the walk reaches the top block and nested blocks")
    with_src = {x: [n for n in every if source_of(n, x)] for x in range(0, MAX_SCAN, 8)}
    # the range's shared_ptr<Source> is {Source, control block}; a cord iterator after it points to the Source too
    # the range's shared_ptr<Source> is {Source, control block}; a cord iterator after it points to the Source too,
    # and stale words elsewhere in a few nodes can: the field is the offset that holds it in the most nodes
    shared = {x: sum(1 for n in got if m.word(n + x + 8) not in (0, m.word(n + x)) and m.readable(m.word(n + x + 8), 16))
              for x, got in with_src.items()}  # fmt: skip
    shared = {x: c for x, c in shared.items() if c >= 3}
    x = one("Node.source_range_ (its Source)", [x for x, c in shared.items() if c == max(shared.values(), default=0)])
    cal.field("jitnode", "source", x, "ptr")
    src = m.word(with_src[x][0] + x)
    cal.field("jitsource", "pieces", 0, "ptr", "measured: the text pieces {size, data} a Source starts with")

    def named(f: int) -> bool:
        fp, fn = m.words(src + f, 2)
        return 0 < fn < 256 and m.readable(fp, fn) and m.raw(fp, fn).decode("ascii", "replace") in files

    names = [f for f in range(8, 160, 8) if named(f)]
    cal.field("jitsource", "filename", one("Source.filename_", names), "ptr")
    # no engaged flag was found beside the range, and a node without one may hold a stale word there: the reader
    # takes a Source only when its pieces, text and file name all check, and refuses two texts for one file
    have = set(with_src[x])
    found = {source_of(n, x)[0] for n in have}  # type: ignore[index]
    cal.check(found == set(files), f"every code file of the archive is reached from the graphs ({sorted(found)})")
    cal.constants["PIECE_SIZE"] = 16
    cal.provenance["constants.PIECE_SIZE"] = "measured: a Source's pieces are {size, data} string views"


def _nodes(m, holder: int, block_off: int, input_off: int, output_off: int, next_off: int, blocks_off: int,
           limit: int = 10_000) -> list[int]:  # fmt: skip
    """Every node of a graph's top block (`holder` + block_off; a block itself when block_off is 0 and holder is
    the block) and of the blocks nested in its nodes, through the measured ring (bounded)."""
    if not (holder and m.readable(holder + block_off, 8)):
        return []
    out: list[int] = []
    stack = [m.word(holder + block_off) if block_off else holder]
    while stack and len(out) < limit:
        blk = stack.pop()
        if not (blk and m.readable(blk, 64)):
            continue
        n, last = m.word(blk + input_off), m.word(blk + output_off)
        while n and m.readable(n, 64) and len(out) < limit:
            out.append(n)
            stack += _vector(m, n + blocks_off, 8, 64) or []
            if n == last:
                break
            n = m.word(n + next_off)
    return out
