"""Find every nn.Module in an image and organise them into a forest of models.

A module is any instance whose type has `torch.nn.modules.module.Module` in its MRO: no list of
known class names, so custom and third-party modules are found like built-in ones. Children come
from each module's `_modules` dict (registration order preserved); roots are modules that are no
other module's child. Roots are ranked so that the model an investigator most likely wants comes
first: referenced by name from `__main__` or a live frame, then by parameter count, then size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.containers import read_set
from zen.cpython.readers.dicts import read_dict
from zen.cpython.readers.instances import read_instance
from zen.cpython.readers.types import TypeInfo
from zen.frontends.common import NoModelFound, references  # noqa: F401 - their home before the Keras front end
from zen.runtime.errors import ZenError

MODULE_BASE = "torch.nn.modules.module.Module"
TENSOR_BASE = "torch._C.TensorBase"
MAX_TREE = 1_000_000


@dataclass
class ModuleNode:
    addr: int
    type: TypeInfo
    attrs: dict[str, int]  # instance attributes: name -> value address
    children: list[tuple[str, int]] = field(default_factory=list)  # (name, address or 0 for None)
    parameters: list[tuple[str, int]] = field(default_factory=list)
    buffers: list[tuple[str, int]] = field(default_factory=list)
    non_persistent: set[str] = field(default_factory=set)
    # `_parameters`/`_buffers`/`_modules` held in something other than a dict (TorchScript's wrappers):
    # the module is still a node, and `forms.audit` names what was not read
    wrapped: dict[str, str] = field(default_factory=dict)


class ModuleIndex:
    """All module instances of an image, read once."""

    def __init__(self, ip: Interpreter, heap: Heap | None = None, found: dict | None = None) -> None:
        """`found` may carry instances already located (by a scan shared with other types)."""
        self.ip = ip
        self.heap = heap or Heap(ip)
        self.types: dict[int, TypeInfo] = {t.addr: t for t in self.heap.subclasses_of(MODULE_BASE)}
        if found is None:
            found = self.heap.instances_of_types(self.types)
        found = {t: a for t, a in found.items() if t in self.types}
        self.nodes: dict[int, ModuleNode] = {}
        self.errors: dict[int, str] = {}
        for taddr, addrs in found.items():
            for a in addrs.tolist():
                try:
                    self.nodes[a] = self._read(a, self.types[taddr])
                except ZenError as exc:
                    self.errors[a] = str(exc)

    def _read(self, addr: int, t: TypeInfo) -> ModuleNode:
        ip = self.ip
        inst = read_instance(ip, addr)
        node = ModuleNode(addr, t, dict(inst.attrs))
        none = ip.wk.singletons.get("None")
        for attr, target in (("_modules", node.children), ("_parameters", node.parameters), ("_buffers", node.buffers)):
            d = inst.attrs.get(attr)
            if d is None or d == none:
                continue
            if ip.kind(d) != "dict":
                node.wrapped[attr] = ip.type_name(d)
                continue
            for k, v in read_dict(ip, d):
                if ip.kind(k) == "str":
                    target.append((ip.str(k), 0 if v == none else v))
        np_set = inst.attrs.get("_non_persistent_buffers_set")
        if np_set and ip.kind(np_set) in ("set", "frozenset"):
            node.non_persistent = {ip.str(a) for a in read_set(ip, np_set) if ip.kind(a) == "str"}
        return node

    def roots(self) -> list[int]:
        """Modules that are no other module's child (readable ones only), in index order.

        A module may be its own child (`model.me = model`) or sit in a cycle of children; such
        evidence must not hide the model. Self-references are ignored, and every module of a cycle
        that no module outside the cycle reaches is a candidate root (ranking then picks the one
        referenced by name): the strongly connected components with no parent from outside.
        """
        parents: dict[int, set[int]] = {}
        for a, n in self.nodes.items():
            for _, c in n.children:
                if c and c != a and c in self.nodes:
                    parents.setdefault(c, set()).add(a)
        roots = [a for a in self.nodes if a not in parents]
        covered = {a for r in roots for a in self._reach(r)}
        rest = [a for a in self.nodes if a not in covered]
        if rest:
            import networkx as nx

            g = nx.DiGraph()
            g.add_nodes_from(rest)
            g.add_edges_from((p, c) for c in rest for p in parents.get(c, ()) if p not in covered)
            cond = nx.condensation(g)
            for scc in cond.nodes:
                if cond.in_degree(scc) == 0:
                    roots += sorted(cond.nodes[scc]["members"])
        return roots

    def _reach(self, root: int) -> list[int]:
        return [n.addr for _, n in self.walk(root)]

    def walk(self, root: int) -> list[tuple[str, ModuleNode]]:
        """(path, node) in depth-first registration order, like `named_modules()` (no duplicates)."""
        out: list[tuple[str, ModuleNode]] = []
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
                if c:
                    stack.append((f"{path}.{name}" if path else name, c))
        return out

    def depth(self, root: int) -> int:
        return max((p.count(".") + 1 if p else 0) for p, _ in self.walk(root))
