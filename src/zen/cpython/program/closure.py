"""Model-specific code filtering (ZEN Fig. 1 ⑧-⑨): the closure of the code implementing a model.

The rules, exactly (tests re-implement them on live objects to get ground truth):

1. Seeds: the classes of the model's modules. Adding a class adds every class in its MRO that is
   not excluded, and every function its own `__dict__` holds (plain, or inside a staticmethod,
   classmethod or property).
2. Adding a function scans its code object and, recursively, the code objects among its constants
   (comprehensions, lambdas, inner functions): instructions are read in order with a "current
   object" that only a chain of loads keeps alive:
   * `LOAD_GLOBAL n`: the value of `n` in the function's globals, else its builtins;
   * `LOAD_DEREF n` (the function's own code only): the contents of closure cell `n`;
   * `LOAD_ATTR n` / `LOAD_METHOD n`: after a resolved module, `module.n`; after a resolved class,
     `n` through the class's MRO; otherwise `n` through the MRO of each class holding this
     function (that is `self.n`);
   * any other instruction ends the chain.
   Every resolved function is added; every resolved class is added (rule 1); staticmethods,
   classmethods, properties and bound methods add the functions inside; an instance of a class
   made inside a function (`<locals>` in its qualname) adds the functions its class's own
   `__dict__` holds (as rule 1 does, but not the class: no name reaches it, so it is no class
   record; `reuse` makes it again from the instance's encoding): a decorator that leaves a
   callable object in a function's place (kernels' `use_kernel_forward_from_hub` in transformers
   5.25: `apply_rotary_pos_emb`) keeps the function in a cell of that class's methods.
   The contents of the function's closure cells are resolved the same way.
3. Excluded: anything whose module (a function's `__module__`, else its globals' `__name__`; a
   class's module) is unknown or belongs to torch, numpy, builtins or the standard library. It
   is not followed, and its module is recorded as a dependency of the model code.

Nested code objects belong to the function whose constants hold them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from zen.cpython.program.exclusion import excluded
from zen.cpython.runtime import Runtime
from zen.runtime.errors import ZenError

MAX_ITEMS = 200_000
_CHAIN = frozenset(("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_ATTR", "LOAD_METHOD"))  # the instructions rule 2 follows


@dataclass
class ClosureResult:
    functions: set[int] = field(default_factory=set)
    classes: set[int] = field(default_factory=set)
    codes: dict[int, int | None] = field(default_factory=dict)  # code address -> parent code (None: top-level)
    code_of_function: dict[int, int] = field(default_factory=dict)
    dependencies: Counter = field(default_factory=Counter)
    # the reference graph: ("class"|"function", addr) -> what it adds; ("function", addr) -> its codes
    edges: dict[tuple[str, int], set[tuple[str, int]]] = field(default_factory=dict)
    codes_of: dict[int, list[int]] = field(default_factory=dict)
    seeds: set[int] = field(default_factory=set)  # the classes the closure started from (the model's)

    def reach(self, seeds: list[tuple[str, int]]) -> ClosureResult:
        """The closure of a subset of seeds, by reachability in the recorded graph (no re-reading)."""
        out = ClosureResult()
        stack = list(seeds)
        seen = set(stack)
        while stack:
            kind, addr = stack.pop()
            if kind == "class" and addr in self.classes:
                out.classes.add(addr)
            elif kind == "function" and addr in self.functions:
                out.functions.add(addr)
                out.code_of_function[addr] = self.code_of_function[addr]
                for c in self.codes_of.get(addr, []):
                    out.codes[c] = self.codes[c]
            for nxt in self.edges.get((kind, addr), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return out


class Closure:
    """Incremental closure: call `add_class`/`add_function`, then `run()`."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.result = ClosureResult()
        self._work: list[tuple[str, int]] = []
        self._seen: set[tuple[str, int]] = set()
        self._current: tuple[str, int] | None = None  # the node whose references are being recorded

    def add_class(self, taddr: int) -> None:
        self._push("class", taddr)

    def add_function(self, faddr: int) -> None:
        self._push("function", faddr)

    def _push(self, what: str, addr: int) -> None:
        key = (what, addr)
        if self._current is not None:
            self.result.edges.setdefault(self._current, set()).add(key)
        if key not in self._seen and len(self._seen) < MAX_ITEMS:
            self._seen.add(key)
            self._work.append(key)

    def run(self) -> ClosureResult:
        while self._work:
            what, addr = self._work.pop()
            self._current = (what, addr)
            if what == "class":
                self._class(addr)
            else:
                self._function(addr)
        self._current = None
        return self.result

    # -- rule 1 ---------------------------------------------------------------------------------
    def _class(self, taddr: int) -> None:
        t = self.rt.type(taddr)
        if t is None:
            return
        if excluded(t.module):
            self.result.dependencies[t.module] += 1
            return
        self.result.classes.add(taddr)
        for base in t.mro_addrs[1:]:
            self.add_class(base)
        for _, f in self.rt.methods(t):
            self.add_function(f)

    # -- rule 2 ---------------------------------------------------------------------------------
    def _function(self, faddr: int) -> None:
        rt = self.rt
        f = rt.function(faddr)
        if f is None:
            return
        module = rt.module_name(f)
        if excluded(module):
            self.result.dependencies[module or "<unknown>"] += 1
            return
        self.result.functions.add(faddr)
        self.result.code_of_function[faddr] = f.code
        globals_ns = rt.namespace(f.globals)
        builtins_ns = rt.namespace(f.builtins)
        cells = self._cells(f)
        for v in cells.values():
            self._resolved(v)
        owners = rt.owners(faddr)
        stack: list[tuple[int, int | None]] = [(f.code, None)]
        while stack:
            code_addr, parent = stack.pop()
            if code_addr in self.result.codes:
                continue
            ci = rt.code(code_addr)
            if ci is None:
                continue
            self.result.codes[code_addr] = parent
            self.result.codes_of.setdefault(faddr, []).append(code_addr)
            own = parent is None
            cur: int | None = None
            for _, _, name, _, _, argval in rt.instructions(ci):
                if name not in _CHAIN:
                    cur = None
                    continue
                if name == "LOAD_GLOBAL":
                    cur = globals_ns.get(argval) or builtins_ns.get(argval)
                elif name == "LOAD_DEREF":
                    cur = cells.get(argval) if own else None
                elif cur is not None:  # LOAD_ATTR / LOAD_METHOD after a resolved object
                    cur = rt.lookup_attr(cur, argval)
                else:  # ... of `self`: through the classes holding this function
                    cur = next((v for o in owners if (v := rt.lookup_attr(o, argval)) is not None), None)
                if cur is not None:
                    self._resolved(cur)
            for c in ci.consts:
                if rt.kind(c) == "code":
                    stack.append((c, code_addr))

    def _cells(self, f) -> dict[str, int]:
        """Free variable name -> cell contents, for the function's own closure."""
        rt = self.rt
        ci = rt.code(f.code)
        if ci is None or not f.closure or not ci.freevars:
            return {}
        from zen.cpython.readers.containers import read_tuple
        from zen.cpython.readers.functions import read_cell

        out = {}
        try:
            for name, cell in zip(ci.freevars, read_tuple(rt.ip, f.closure)):
                v = read_cell(rt.ip, cell)
                if v:
                    out[name] = v
        except ZenError:  # a damaged closure just contributes nothing
            return out
        return out

    def _resolved(self, v: int | None) -> None:
        if v is None:
            return
        kind = self.rt.kind(v)
        if kind == "function":
            self.add_function(v)
        elif kind == "type":
            self.add_class(v)
        elif kind in ("staticmethod", "classmethod", "property", "method"):
            for f in self.rt.functions_in(v):
                self.add_function(f)
        elif kind is not None:
            try:
                tp = self.rt.ip.type_of(v)
                local = "<locals>" in self.rt.ip.type_info(tp).qualname
            except ZenError:
                return
            t = self.rt.type(tp) if local else None
            for _, f in self.rt.methods(t) if t is not None else ():
                self.add_function(f)
