"""Find every Keras layer and model in an image and organise them into a forest of models.

A layer is any instance whose type has `keras.src.layers.layer.Layer` in its MRO (Sequential, functional and
subclassed models are layers too): no list of known classes, so custom layers and models are found like built-in
ones. Children are a layer's tracked sublayers (`_layers`, in tracking order, as `Layer._flatten_layers` walks them),
variables are in `_trainable_variables` / `_non_trainable_variables`, random-seed state in `_seed_generators[*].state`.
Roots are layers that are no other layer's child; a Sequential's internal functional twin (`_functional`, which
lists the same layers) is its graph, not another model. Ranking is the PyTorch front end's: referenced by name from
`__main__` or a live frame, then parameter count, then size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.containers import read_list, read_tuple
from zen.cpython.readers.instances import read_instance
from zen.cpython.readers.types import TypeInfo
from zen.runtime.errors import ZenError

LAYER_BASE = "keras.src.layers.layer.Layer"
VARIABLE_BASE = "keras.src.backend.common.variables.Variable"
TF_VARIABLE_BASE = "keras.src.backend.tensorflow.core.Variable"  # a Keras Variable on the TensorFlow backend
OPTIMIZER_BASE = "keras.src.optimizers.base_optimizer.BaseOptimizer"
MAX_TREE = 1_000_000


@dataclass
class LayerNode:
    addr: int
    type: TypeInfo
    attrs: dict[str, int]  # instance attributes: name -> value address
    name: str
    children: list[tuple[str, int]] = field(default_factory=list)  # (layer name, address), tracking order
    trainable: list[int] = field(default_factory=list)  # Keras Variable addresses, as the layer lists them
    non_trainable: list[int] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)  # SeedGenerator state variables
    functional: int = 0  # a Sequential's internal Functional (its graph)


def _items(ip: Interpreter, addr: int | None) -> list[int]:
    """The items of a list/tuple attribute ([] for None or anything else).

    TF's trackable `ListWrapper` (what a Keras optimizer's `_variables` becomes) subclasses list only for isinstance
    checks: its items live in its `_storage` list, the list part stays empty."""
    if addr is None:
        return []
    kind = ip.kind(addr)
    if kind == "list":
        items = read_list(ip, addr)
        if not items and ip.type_of(addr) != ip.wk.types["list"]:
            storage = read_instance(ip, addr).attrs.get("_storage")
            if storage is not None and storage != addr and ip.kind(storage) == "list":
                return read_list(ip, storage)
        return items
    if kind == "tuple":
        return read_tuple(ip, addr)
    return []


class LayerIndex:
    """All Keras layer instances of an image, read once."""

    def __init__(self, ip: Interpreter, heap: Heap, found: dict) -> None:
        """`found` carries instances located by a scan shared with other types (type address -> addresses)."""
        self.ip, self.heap = ip, heap
        self.types: dict[int, TypeInfo] = {t.addr: t for t in heap.subclasses_of(LAYER_BASE)}
        self.nodes: dict[int, LayerNode] = {}
        self.errors: dict[int, str] = {}
        for taddr, addrs in found.items():
            if taddr not in self.types:
                continue
            for a in addrs.tolist():
                try:
                    self.nodes[a] = self._read(a, self.types[taddr])
                except ZenError as exc:
                    self.errors[a] = str(exc)

    def _read(self, addr: int, t: TypeInfo) -> LayerNode:
        ip = self.ip
        attrs = dict(read_instance(ip, addr).attrs)
        name_addr = attrs.get("name")
        name = ip.str(name_addr) if name_addr is not None and ip.kind(name_addr) == "str" else f"{addr:#x}"
        node = LayerNode(addr, t, attrs, name)
        node.trainable = _items(ip, attrs.get("_trainable_variables"))
        node.non_trainable = _items(ip, attrs.get("_non_trainable_variables"))
        for sg in _items(ip, attrs.get("_seed_generators")):
            state = read_instance(ip, sg).attrs.get("state")
            if state is not None and not ip.is_none(state):
                node.seeds.append(state)
        fn = attrs.get("_functional")
        if fn is not None and not ip.is_none(fn):
            node.functional = fn
        return node

    def link(self) -> None:
        """Children from `_layers` (after every node is read: names come from the child nodes)."""
        for node in self.nodes.values():
            seen: set[str] = set()
            try:
                items = _items(self.ip, node.attrs.get("_layers"))
            except ZenError as exc:
                self.errors[node.addr] = f"_layers unreadable: {exc}"
                continue
            for c in items:
                child = self.nodes.get(c)
                name = child.name if child else f"{c:#x}"
                base, n = name, 1
                while name in seen:  # sibling layers may share a user-given name
                    n += 1
                    name = f"{base}_{n}"
                seen.add(name)
                node.children.append((name, c))

    def roots(self) -> list[int]:
        """Layers that are no other layer's child and not a Sequential's functional twin, in index order."""
        parents: set[int] = set()
        for a, n in self.nodes.items():
            parents.update(c for _, c in n.children if c != a)
            if n.functional:
                parents.add(n.functional)
        return [a for a in self.nodes if a not in parents]

    def walk(self, root: int) -> list[tuple[str, LayerNode]]:
        """(path, node) in depth-first tracking order (each layer once, shared layers at their first path)."""
        out: list[tuple[str, LayerNode]] = []
        seen: set[int] = set()
        stack: list[tuple[str, int]] = [("", root)]
        while stack:
            path, addr = stack.pop()
            if addr in seen or addr not in self.nodes or len(out) >= MAX_TREE:
                continue
            seen.add(addr)
            node = self.nodes[addr]
            out.append((path, node))
            for name, c in reversed(node.children):
                stack.append((f"{path}.{name}" if path else name, c))
        return out

    def variables(self, root: int) -> list[tuple[int, int, str]]:
        """(variable address, owning layer address, "parameter"|"buffer"|"seed") in `Layer.variables` order:
        a layer's own trainable then non-trainable variables, its seed states, then each sublayer's, recursively,
        each variable once. The kind is the list it was found in (a layer's trainable flag is applied later)."""
        out: list[tuple[int, int, str]] = []
        seen: set[int] = set()
        stack: list[tuple[int, tuple[int, ...]]] = [(root, ())]
        while stack:
            addr, ancestors = stack.pop()
            node = self.nodes.get(addr)
            if node is None or addr in ancestors or len(ancestors) > 10_000:
                continue  # a layer below itself: Keras itself would recurse forever
            own = [(v, "parameter") for v in node.trainable] + [(v, "buffer") for v in node.non_trainable]
            for v, kind in own + [(v, "seed") for v in node.seeds]:
                if v not in seen:
                    seen.add(v)
                    out.append((v, addr, kind))
            below = (*ancestors, addr)
            for _, c in reversed(node.children):
                stack.append((c, below))
        return out
