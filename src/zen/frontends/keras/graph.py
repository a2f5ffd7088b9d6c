"""The functional graph of Keras models, from the node objects Keras keeps (no bytecode needed).

A functional model (and a Sequential, through its `_functional` twin) lists its operations in `_operations` and its
nodes in `_nodes_by_depth`; each node knows its operation and its argument tensors, and each argument's
`_keras_history` (operation, node index, tensor index) names the node that produced it, exactly what
`Node.parent_nodes` computes. Only the model's own nodes count: a layer shared with another model has nodes there
too. Edges go from producing to consuming operation, in the MR's module paths when the operation is a layer of the
tree (operations that are not layers, e.g. `keras.ops` calls, appear by their own name).
"""

from __future__ import annotations

from typing import Any

from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import read_dict
from zen.cpython.readers.instances import read_instance
from zen.frontends.keras.construct import node_records
from zen.frontends.keras.layers import LayerIndex, _items
from zen.runtime.errors import ZenError

METHOD = "keras functional nodes (_nodes_by_depth, arguments' _keras_history)"


def _attrs(ip: Interpreter, addr: int) -> dict[str, int]:
    return read_instance(ip, addr).attrs


def _name(ip: Interpreter, op: int) -> str:
    n = _attrs(ip, op).get("name")
    return ip.str(n) if n is not None and ip.kind(n) == "str" else f"{op:#x}"


def model_graph(ip: Interpreter, model: int) -> tuple[list[int], list[tuple[int, int, int]]]:
    """(operations in order, edges (producer op, consumer op, producer's output index)) of one functional model."""
    attrs = _attrs(ip, model)
    ops = _items(ip, attrs.get("_operations"))
    by_depth = attrs.get("_nodes_by_depth")
    if by_depth is None or ip.kind(by_depth) != "dict":
        return ops, []
    nodes = [n for _, lst in read_dict(ip, by_depth) for n in _items(ip, lst)]
    edges: set[tuple[int, int, int]] = set()
    for node in nodes:
        na = _attrs(ip, node)
        op, args = na.get("operation"), na.get("arguments")
        if op is None or args is None or ip.is_none(args):
            continue
        for kt in _items(ip, _attrs(ip, args).get("keras_tensors")):
            hist = _attrs(ip, kt).get("_keras_history")
            if hist is None or ip.kind(hist) != "tuple":
                continue
            parts = _items(ip, hist)
            if len(parts) >= 3 and not ip.is_none(parts[0]):
                index = ip.value(parts[2]) if ip.kind(parts[2]) == "int" else 0
                edges.add((parts[0], op, int(index)))
    return ops, sorted(edges)


def functional_graphs(ip: Interpreter, index: LayerIndex, root: int) -> dict[str, Any]:
    """Graph additions for the MR: per functional (sub)model its operations and edges, and "dataflow" edges between
    module paths, the form the PyTorch front end's data-flow analysis produces."""
    walk = index.walk(root)
    paths = {node.addr: path for path, node in walk}
    graphs: dict[str, Any] = {}
    dataflow: set[tuple[str, str]] = set()
    skipped: dict[str, str] = {}
    for path, node in walk:
        model = node.functional or (node.addr if "_operations" in node.attrs else 0)
        if not model:
            continue
        try:
            ops, edges = model_graph(ip, model)
            label = {op: paths.get(op, f"op:{_name(ip, op)}") for op in ops}
            for a, b, _ in edges:
                label.setdefault(a, paths.get(a, f"op:{_name(ip, a)}"))
                label.setdefault(b, paths.get(b, f"op:{_name(ip, b)}"))
        except ZenError as exc:
            skipped[path] = str(exc)
            continue
        graphs[path] = {"operations": [label[o] for o in ops],
                        "edges": sorted([label[a], label[b], i] for a, b, i in edges)}  # fmt: skip
        try:  # the call sites, for reuse: each node's arguments in the deployed order
            graphs[path].update(node_records(ip, model, lambda op: paths.get(op) or f"op:{_name(ip, op)}"))
        except (ZenError, ValueError) as exc:
            skipped[path] = f"call arguments not read: {exc}"
        dataflow.update((label[a], label[b]) for a, b, _ in edges)
    if not graphs:
        return {}
    return {"functional": graphs, "dataflow": sorted([list(e) for e in dataflow]), "dataflow_method": METHOD,
            "dataflow_skipped": skipped}  # fmt: skip
