"""What `zen reuse` needs to construct a Keras model again: each layer's constructor arguments and call sites.

Keras 3 keeps, on every layer whose constructor received only plain values (str/int/float/bool/None in lists,
tuples, dicts), those exact keyword arguments in `_auto_config` (a SerializableDict whose `config` is the dict):
the most faithful configuration there is, since it is what the deployed code passed, not what the layer derived.
Layers built with objects (an initializer instance, a list of layers) have `_auto_config = None`; reuse then
falls back to the configuration attributes in `hyperparameters`. A layer's `_build_shapes_dict` says with what
input shapes it was built (what a subclassed model must be called on before its variables exist).

For functional models (and a Sequential's functional twin) each node is recorded with its call arguments,
keras tensors replaced by `{"ref": [producer, node index, tensor index]}`, plain values as literals, so that the
graph is replayed call by call, in the deployed argument order (a Concatenate's inputs, a shared layer's calls).
Everything is read, bounded, from the image; nothing here runs.
"""

from __future__ import annotations

from typing import Any

from zen.cpython.interp import Interpreter
from zen.cpython.readers.dicts import read_dict
from zen.cpython.readers.instances import read_instance
from zen.frontends.keras.layers import LayerNode, _items
from zen.runtime.errors import ZenError

PLAIN = frozenset({"none", "bool", "int", "float", "str"})
MAX_DEPTH = 8
MAX_ITEMS = 4096


def _plain_value(ip: Interpreter, addr: int, depth: int = MAX_DEPTH) -> Any:
    """A plain value (exact builtin types, containers of them), or raise ZenError: only literals are recorded."""
    kind = ip.kind(addr)
    exact = ip.wk.kind_by_type.get(ip.type_of(addr)) == kind
    if kind in PLAIN and not exact:  # containers may be Keras's tracked list/dict subclasses; values may not
        raise ZenError(f"{ip.type_name(addr)} is not a plain value")
    if kind in PLAIN:
        return ip.value(addr, 1)
    if depth <= 0:
        raise ZenError("nested too deep")
    if kind in ("tuple", "list"):
        items = _items(ip, addr)
        if len(items) > MAX_ITEMS:
            raise ZenError("too many items")
        vals = [_plain_value(ip, a, depth - 1) for a in items]
        return tuple(vals) if kind == "tuple" else vals
    if kind == "dict":
        pairs = read_dict(ip, addr)
        if len(pairs) > MAX_ITEMS:
            raise ZenError("too many items")
        return {_plain_value(ip, k, depth - 1): _plain_value(ip, v, depth - 1) for k, v in pairs}
    raise ZenError(f"{kind} is not a plain value")


def construction(ip: Interpreter, node: LayerNode, problems: list[str], path: str) -> dict[str, Any]:
    """{"name", "init" (repr of the constructor kwargs, or None), "build" (repr of the build shapes, or None)}."""
    out: dict[str, Any] = {"name": node.name, "init": None, "build": None}
    auto = node.attrs.get("_auto_config")
    try:
        if auto is not None and not ip.is_none(auto):
            cfg = read_instance(ip, auto).attrs.get("config")
            if cfg is not None and ip.kind(cfg) == "dict":
                out["init"] = repr(_plain_value(ip, cfg))
    except ZenError as exc:
        problems.append(f"constructor arguments of {path or '<root>'} not read: {exc}")
    shapes = node.attrs.get("_build_shapes_dict")
    try:
        if shapes is not None and not ip.is_none(shapes) and ip.kind(shapes) == "dict":
            out["build"] = repr(_plain_value(ip, shapes))
    except ZenError as exc:
        problems.append(f"build shapes of {path or '<root>'} not read: {exc}")
    return out


class ArgEncoder:
    """Encodes a node's call arguments: keras tensors by their producer, plain values as literals."""

    def __init__(self, ip: Interpreter, label) -> None:
        self.ip, self.label = ip, label  # label(op address) -> module path or "op:name"

    def encode(self, addr: int, depth: int = MAX_DEPTH) -> dict:
        ip = self.ip
        kind = ip.kind(addr)
        if kind in PLAIN and ip.wk.kind_by_type.get(ip.type_of(addr)) == kind:
            return {"lit": repr(ip.value(addr, 1))}
        if depth <= 0:
            return {"unsupported": "nested too deep"}
        if kind in ("tuple", "list") and ip.wk.kind_by_type.get(ip.type_of(addr)) == kind:
            items = _items(ip, addr)[:MAX_ITEMS]
            return {kind: [self.encode(a, depth - 1) for a in items]}
        if kind == "dict":
            pairs = read_dict(ip, addr)[:MAX_ITEMS]
            return {"dict": [[ip.str(k) if ip.kind(k) == "str" else repr(ip.value(k, 1)), self.encode(v, depth - 1)]
                             for k, v in pairs]}  # fmt: skip
        if kind == "instance" or kind not in PLAIN:
            try:
                hist = read_instance(ip, addr).attrs.get("_keras_history")
            except ZenError:
                hist = None
            if hist is not None and ip.kind(hist) == "tuple":
                parts = _items(ip, hist)
                if len(parts) >= 3 and not ip.is_none(parts[0]):
                    return {"ref": [self.label(parts[0]), int(ip.value(parts[1], 1)), int(ip.value(parts[2], 1))]}
        return {"unsupported": ip.type_name(addr)}


def node_records(ip: Interpreter, model: int, label) -> dict[str, Any]:
    """{"nodes": [{"op", "index", "args", "kwargs"}] in execution order, "inputs", "outputs"} of one functional
    model (`label` maps an operation's address to its module path or "op:name")."""
    attrs = read_instance(ip, model).attrs
    enc = ArgEncoder(ip, label)
    by_depth = attrs.get("_nodes_by_depth")
    depths: list[tuple[int, list[int]]] = []
    if by_depth is not None and ip.kind(by_depth) == "dict":
        for k, lst in read_dict(ip, by_depth):
            if ip.kind(k) == "int":
                depths.append((int(ip.value(k, 1)), _items(ip, lst)))
    nodes = []
    for _, lst in sorted(depths, key=lambda d: -d[0]):  # deepest first: producers before consumers
        for n in lst:
            na = read_instance(ip, n).attrs
            op, args = na.get("operation"), na.get("arguments")
            if op is None:
                continue
            inbound = _items(ip, read_instance(ip, op).attrs.get("_inbound_nodes"))
            rec: dict[str, Any] = {"op": label(op), "index": inbound.index(n) if n in inbound else 0}
            if args is not None and not ip.is_none(args):
                aa = read_instance(ip, args).attrs
                rec["args"] = enc.encode(aa["args"]) if "args" in aa else {"tuple": []}
                rec["kwargs"] = enc.encode(aa["kwargs"]) if "kwargs" in aa else {"dict": []}
            nodes.append(rec)
    out: dict[str, Any] = {"nodes": nodes}
    for key, attr in (("inputs", "_inputs_struct"), ("outputs", "_outputs_struct")):
        a = attrs.get(attr)
        if a is not None and not ip.is_none(a):
            out[key] = enc.encode(a)
    return out
