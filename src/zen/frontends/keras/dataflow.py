"""Data flow of subclassed Keras models and layers, recovered from their `call` bytecode (never run).

A functional model or Sequential keeps its graph as objects (`graph.py` reads it exactly); a subclassed model or
layer has only its `call` method, so its data flow is recovered the way the PyTorch front end recovers `forward`'s,
by the shared walker of `zen.frontends.dataflow`. What differs is the child lookup: `call` names a sublayer by the
attribute that holds it (`self.emb`, `self._query_dense`), while the MR's paths use the layer's name (`emb`,
`mha.query`), so each attribute of the layer whose value is one of its tracked sublayers maps to that sublayer's
path, and each list/tuple attribute holding only tracked sublayers (`self.blocks = [...]`, which Keras keeps as a
tracked list) is a container, chained in list order when `call` iterates or indexes it.

Walked: every layer of the tree without a functional graph that has sublayers or whose class is not Keras's own.
A built-in leaf layer's `call` only says its input reaches its output, and a functional model's recorded graph is
exact already, so neither is walked (which keeps the functional models' data flow exactly Keras's own edges).
"""

from __future__ import annotations

from typing import Any

from zen.cpython.interp import Interpreter
from zen.frontends.dataflow import Code, layer_edges, method_code
from zen.frontends.keras.layers import LayerIndex, LayerNode, _items
from zen.runtime.errors import ZenError

METHOD = (
    "static, path-insensitive walk of each subclassed layer's call bytecode: edges from the producers of call "
    "arguments to the called sublayer (by the attribute holding it); lists of sublayers iterated in list order"
)
MAX_CONTAINER = 10_000  # items of one list attribute considered: image data is untrusted


def _walked(node: LayerNode) -> bool:
    if node.functional or "_operations" in node.attrs:
        return False
    return bool(node.children) or not node.type.module.startswith("keras.")


def child_lookup(ip: Interpreter, node: LayerNode, path: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(attribute -> sublayer path, attribute -> sublayer paths in order) for one layer's instance attributes."""
    paths = {c: f"{path}.{n}" if path else n for n, c in node.children}
    children: dict[str, str] = {}
    containers: dict[str, list[str]] = {}
    for attr, v in node.attrs.items():
        if v in paths:
            children[attr] = paths[v]
            continue
        try:
            if ip.kind(v) not in ("list", "tuple"):
                continue
            items = _items(ip, v)
        except ZenError:
            continue
        if items and len(items) <= MAX_CONTAINER and all(i in paths for i in items):
            containers[attr] = [paths[i] for i in items]
    return children, containers


def call_dataflow(ip: Interpreter, index: LayerIndex, root: int) -> dict[str, Any]:
    """Graph additions for the MR: {"dataflow", "dataflow_method", "dataflow_skipped"} from the walked layers'
    `call` (empty when no layer is walked, e.g. a purely functional model)."""
    edges: set[tuple[str, str]] = set()
    skipped: dict[str, str] = {}
    cache: dict[int, Code | None] = {}
    walked = 0
    for path, node in index.walk(root):
        if not _walked(node):
            continue
        try:
            code = method_code(ip, node.type.addr, "call", cache)
            if code is None:
                skipped[path] = "its call is not a plain Python function (e.g. wrapped by tf.function): no bytecode to walk"
                continue
            children, containers = child_lookup(ip, node, path)
        except ZenError as exc:
            skipped[path] = str(exc)
            continue
        edges |= layer_edges(code, ip.P.opcodes, path, children, containers)
        walked += 1
    if not walked and not skipped:
        return {}
    return {"dataflow": sorted([list(e) for e in edges]), "dataflow_method": METHOD, "dataflow_skipped": skipped}


def merge(graph: dict[str, Any], more: dict[str, Any]) -> None:
    """Add `more`'s data-flow edges, method and skipped layers to an MR graph that may hold functional ones."""
    if not more:
        return
    if "dataflow" not in graph:
        graph.update(more)
        return
    graph["dataflow"] = sorted({tuple(e) for e in graph["dataflow"]} | {tuple(e) for e in more["dataflow"]})
    graph["dataflow"] = [list(e) for e in graph["dataflow"]]
    graph["dataflow_method"] = f"{graph['dataflow_method']}; {more['dataflow_method']}"
    graph["dataflow_skipped"] = {**graph.get("dataflow_skipped", {}), **more["dataflow_skipped"]}
