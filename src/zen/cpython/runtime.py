"""Runtime recovery (ZEN Fig. 1 ③-⑦): every function, code object, class and module in the image.

The census finds the objects; this index reads them lazily and caches what is read, because the
closure walk asks for the same namespaces and class dicts many times. It also builds the map from
each function to the classes that hold it (directly, or wrapped in a staticmethod, classmethod or
property), which the closure uses to resolve `self.method` and a fingerprint uses as the
function's owner.
"""

from __future__ import annotations

from zen.cpython.code.instructions import Instruction, decode
from zen.cpython.heap import Heap
from zen.cpython.interp import Interpreter
from zen.cpython.readers.code import CodeInfo, read_code
from zen.cpython.readers.dicts import dict_str_items
from zen.cpython.readers.functions import FunctionInfo, read_function, read_property, read_wrapped
from zen.cpython.readers.types import TypeInfo, read_type
from zen.runtime.errors import ZenError


class Runtime:
    def __init__(self, ip: Interpreter, heap: Heap | None = None, found: dict | None = None) -> None:
        """`found` may carry census results from a scan shared with other types."""
        self.ip = ip
        self.heap = heap or Heap(ip)
        wanted = [ip.wk.types["function"], ip.wk.types["code"]]
        if found is None or not all(t in found for t in wanted):
            found = self.heap.instances_of_types(wanted)
        self.function_addrs: list[int] = found[ip.wk.types["function"]].tolist()
        self.code_addrs: list[int] = found[ip.wk.types["code"]].tolist()
        self.type_addrs: list[int] = self.heap.all_types()
        try:
            self.modules: dict[str, int] = self.heap.sys_modules()
        except ZenError:
            self.modules = {}
        self._functions: dict[int, FunctionInfo | None] = {}
        self._codes: dict[int, CodeInfo | None] = {}
        self._decoded: dict[int, tuple[CodeInfo, list[Instruction]]] = {}
        self._namespaces: dict[int, dict[str, int]] = {}
        self._owners = None  # zen.cpython.owners.OwnerIndex, made on the first question
        self._table = None  # zen.cpython.namespaces.NamespaceTable, made on the first namespace asked for
        self._module_dicts: dict[int, int] = {}
        self._attrs: dict[tuple[int, str], int | None] = {}
        # a constant's listing display by address (programmatic.const_display): None, small ints and interned
        # strings are shared by many code objects (26,000 displays of 12,000 objects in a GPT-2 recovery)
        self.const_displays: dict[int, str] = {}

    # -- cached readers -----------------------------------------------------------------------
    def function(self, addr: int) -> FunctionInfo | None:
        if addr not in self._functions:
            try:
                self._functions[addr] = read_function(self.ip, addr)
            except ZenError:
                self._functions[addr] = None
        return self._functions[addr]

    def code(self, addr: int) -> CodeInfo | None:
        if addr not in self._codes:
            try:
                ci = self._codes[addr] = read_code(self.ip, addr)
                if not self.ip.P.code.has("co_qualname"):
                    ci.qualname = self._legacy_qualnames().get(addr, ci.qualname)
            except ZenError:
                self._codes[addr] = None
        return self._codes[addr]

    def instructions(self, ci: CodeInfo) -> list[Instruction]:
        """`ci`'s instructions decoded without constants' displays, once per code object: the
        closure walks them and the listing adds the displays (`instructions.with_consts`)."""
        hit = self._decoded.get(ci.addr)
        if hit is not None and hit[0] is ci:
            return hit[1]
        out = decode(ci.code, ci.names, ci.localsplusnames, [], self.ip.P.opcodes, ci.free_base)
        self._decoded[ci.addr] = (ci, out)
        return out

    def _legacy_qualnames(self) -> dict[int, str]:
        """Before 3.11 a code object has no qualified name; it is found where the 3.10 compiler put
        it: the `__qualname__` of a function running the code, else the string the parent code
        loads before MAKE_FUNCTION (nested functions, lambdas, comprehensions), else the one a
        class body stores as `__qualname__`."""
        names = self.__dict__.get("_qualnames")
        if names is None:
            names = self.__dict__["_qualnames"] = {}
            for f in self.function_addrs:
                fi = self.function(f)
                if fi is not None and fi.code not in names:
                    names[fi.code] = fi.qualname
            from zen.cpython.code.listing_legacy import qualnames_in

            for a in self.code_addrs:
                try:
                    ci = read_code(self.ip, a)
                    for code, qual in qualnames_in(self.ip, ci).items():
                        names.setdefault(code, qual)
                except ZenError:
                    continue
        return names

    def namespace(self, dict_addr: int) -> dict[str, int]:
        """A dict with str keys as {name: value address} (empty when unreadable)."""
        ns = self._namespaces.get(dict_addr)
        if ns is None:
            items = self.namespace_table().items(dict_addr) if dict_addr else None
            try:
                ns = dict(items if items is not None else dict_str_items(self.ip, dict_addr)) if dict_addr else {}
            except ZenError:
                ns = {}
            self._namespaces[dict_addr] = ns
        return ns

    def namespace_table(self):
        """Every class and module namespace of the process read in bulk (`cpython.namespaces`)."""
        if self._table is None:
            from zen.cpython import bulk
            from zen.cpython.namespaces import NamespaceTable

            classes = [t.dict_addr for t in map(self.type, self.type_addrs) if t is not None and t.is_heap and t.dict_addr]
            mods = bulk.gather_field(self.ip, bulk.as_array(list(self.modules.values())), self.ip.P.module.md_dict, "ptr")
            modules = [d for d, ok in zip(mods[0].tolist(), mods[1].tolist()) if ok and d]
            self._table = NamespaceTable(self.ip, classes + modules)
        return self._table

    def type(self, addr: int) -> TypeInfo | None:
        try:
            return read_type(self.ip, addr)
        except ZenError:
            return None

    def module_namespace(self, module_addr: int) -> dict[str, int]:
        """A module's namespace (its md_dict), read once."""
        d = self._module_dicts.get(module_addr)
        if d is None:
            try:
                if self.kind(module_addr) != "module":
                    return {}
                d = self.ip.ptr(module_addr + self.ip.P.module.md_dict)
            except ZenError:
                d = 0
            self._module_dicts[module_addr] = d
        return self.namespace(d)

    def kind(self, addr: int) -> str | None:
        try:
            return self.ip.kind(addr)
        except ZenError:
            return None

    # -- what a class attribute stands for ------------------------------------------------------
    def bound_functions(self, value: int) -> list[tuple[int, str]]:
        """(function, binding) a class attribute holds. Binding says how it sits in the class:
        "function", "staticmethod", "classmethod", "property.fget"/"fset"/"fdel" or "method"."""
        kind = self.kind(value)
        try:
            if kind == "function":
                return [(value, "function")]
            if kind in ("staticmethod", "classmethod"):
                inner = read_wrapped(self.ip, value)
                return [(inner, kind)] if self.kind(inner) == "function" else []
            if kind == "property":
                p = read_property(self.ip, value)
                return [(a, f"property.{n}") for a, n in ((p.fget, "fget"), (p.fset, "fset"), (p.fdel, "fdel"))
                        if a and self.kind(a) == "function"]  # fmt: skip
            if kind == "method":
                from zen.cpython.readers.functions import read_method

                f = read_method(self.ip, value).func
                return [(f, "method")] if self.kind(f) == "function" else []
        except ZenError:
            return []
        return []

    def functions_in(self, value: int) -> list[int]:
        """Function objects a class attribute holds: itself, or inside staticmethod/classmethod/property."""
        return [f for f, _ in self.bound_functions(value)]

    def methods(self, t: TypeInfo) -> list[tuple[str, int]]:
        """(attribute name, function address) for every function a class's own dict holds."""
        return [(name, f) for name, f, _ in self.bindings(t)]

    def bindings(self, t: TypeInfo) -> list[tuple[str, int, str]]:
        """(attribute name, function address, binding) for every function a class's own dict holds."""
        out = []
        for name, v in self.namespace(t.dict_addr).items():
            out += [(name, f, b) for f, b in self.bound_functions(v)]
        return out

    def owners(self, function_addr: int) -> list[int]:
        """Classes whose own dict holds the function (sorted by address)."""
        return [c for c, _, _ in self.holders(function_addr)]

    def holders(self, function_addr: int) -> list[tuple[int, str, str]]:
        """(class, attribute name, binding) for each place a class dict holds the function."""
        if self._owners is None:
            from zen.cpython.owners import OwnerIndex

            self._owners = OwnerIndex(self)
        return self._owners.holders(function_addr)

    def lookup_attr(self, obj: int, name: str) -> int | None:
        """`obj.name` for modules (their namespace) and classes (their MRO's dicts); None otherwise. Answered once
        per (object, name): the closure asks the same few (`self.x` through a deep MRO, `torch.cat`) thousands of
        times (a GPT-2 process: 18,900 questions)."""
        key = (obj, name)
        if key in self._attrs:
            return self._attrs[key]
        v = self._attrs[key] = self._lookup_attr(obj, name)
        return v

    def _lookup_attr(self, obj: int, name: str) -> int | None:
        kind = self.kind(obj)
        if kind == "module":
            return self.module_namespace(obj).get(name)
        if kind == "type":
            t = self.type(obj)
            for base in t.mro_addrs if t else []:
                bt = self.type(base)
                if bt is not None and bt.dict_addr:
                    v = self.namespace(bt.dict_addr).get(name)
                    if v is not None:
                        return v
        return None

    def globals_name(self, f: FunctionInfo) -> str | None:
        """`__name__` of a function's globals: the module its code really runs in (a decorator's
        wrapper carries the decorated function's `__module__` but runs in the decorator's module)."""
        v = self.namespace(f.globals).get("__name__")
        return self.ip.str(v) if v and self.kind(v) == "str" else None

    def module_name(self, f: FunctionInfo) -> str | None:
        """A function's module: `__module__`, else its globals' `__name__`."""
        if f.module:
            return f.module
        v = self.namespace(f.globals).get("__name__")
        return self.ip.str(v) if v and self.kind(v) == "str" else None
