"""Call-level data-flow edges of a PyTorch model, recovered from each module's `forward` bytecode (never run).

The walk itself is framework-neutral (`zen.frontends.dataflow`); this module says what it means for torch: the
method is `forward`, a module's children are its `_modules` (attribute name = child name = path component), and
every child is also a container of its own children (`nn.Sequential` / `nn.ModuleList` iterated or indexed), as is
the module itself (`nn.Sequential.forward` iterates over `self`). Edges are per module:
`PATH:in:ARG -> child`, `child -> child`, `child -> PATH:out`.
"""

from __future__ import annotations

from typing import Any

from zen.cpython.interp import Interpreter
from zen.frontends.dataflow import Code, layer_edges, method_code
from zen.frontends.pytorch.modules import ModuleIndex
from zen.runtime.errors import ZenError

METHOD = (
    "static, path-insensitive walk of each module's forward bytecode: edges from the producers of call "
    "arguments to the called child; containers iterated in registration order"
)


def dataflow_edges(ip: Interpreter, index: ModuleIndex, mr) -> dict[str, Any]:
    """Graph additions for the MR: {"dataflow": [[src, dst], ...], "dataflow_method", "dataflow_skipped"}."""
    edges: set[tuple[str, str]] = set()
    skipped: dict[str, str] = {}
    cache: dict[int, Code | None] = {}
    by_path = {m.path: m for m in mr.modules}
    for path, node in index.walk(int(mr.root.address, 16)):
        if path not in by_path:
            continue
        try:
            code = method_code(ip, node.type.addr, "forward", cache)
        except ZenError as exc:
            skipped[path] = str(exc)
            continue
        if code is None:
            skipped[path] = "no forward"
            continue
        names = [n for n, c in node.children if c]
        children = {n: f"{path}.{n}" if path else n for n in names}
        containers = {"self": list(children.values())}
        for n, c in node.children:
            if c and c in index.nodes:
                containers[n] = [f"{children[n]}.{k}" for k, kc in index.nodes[c].children if kc]
        edges |= layer_edges(code, ip.P.opcodes, path, children, containers)
    return {"dataflow": sorted([list(e) for e in edges]), "dataflow_method": METHOD, "dataflow_skipped": skipped}
