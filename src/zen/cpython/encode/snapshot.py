"""Encode objects of an image as JSON so that a live process can rebuild them (model reuse).

Rebuilding a model "from the image alone" needs more than hyper-parameters: modules hold config
objects, enums, function references, dtypes, dicts of adapters... Every value is encoded by what it
*is*, never by running anything:

    {"lit": "(3, 3)"}                    plain value (exact builtin types), Python literal syntax
    {"tuple"|"list"|"set"|"frozenset": [...]}, {"dict": [[k, v], ...], "type": "collections:OrderedDict"}
    {"cls": "module:qualname"}           a class (one made inside a function also with "cls_of" or "local_class",
                                         see `Encoder._anchored`; so is the "obj" of an instance of one)
    {"func": "module:qualname", "fn": ADDR}   a function (ADDR: the function object in the image,
                                         which tells a decorated function from the wrapper holding its name)
    {"module": "name"}                   a module           {"enum": "module:qualname", "name": "X"}
    {"dtype": "float32"}                 a torch dtype (found by address among torch's dtypes)
    {"obj": "module:qualname", "id": n, "state": {...}, "slots": {...}}   an instance, by its __dict__
    {"ref": n}                           an instance already encoded (shared or cyclic)
    {"class": "module:qualname", "id": n, "name": NAME, "bases": [...], "meta": {...}|None, "dict": [[k, v], ...]}
                                         a class made inside a function, by what its class statement made
                                         (the "local_class" of a "cls" or "obj"; `Encoder._local_class`)
    {"global": "module:name"}            an instance its class's module holds under a name (a
                                         registry, a singleton): the live process imports it
    {"logger": "name"}                   a logging.Logger (logging.getLogger(name))
    {"method": "name", "self": {...}}    a bound method (getattr of the decoded object)
    {"tensor": KEY} / {"module_ref": PATH} / {"device": "cuda:0"}   supplied by the framework front end (hooks)
    {"unsupported": "why"}               anything else (reuse reports it if the attribute is used)

Depth and size are bounded; unreadable objects become {"unsupported": ...}, never an exception.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from zen.cpython.encode.modules_memo import MAX_ITEMS, module_info
from zen.cpython.interp import Interpreter
from zen.runtime.errors import ZenError

PLAIN = frozenset({"none", "bool", "int", "float", "complex", "str", "bytes", "ellipsis"})
CONTAINERS = frozenset({"tuple", "list", "set", "frozenset"})
MAX_DEPTH = 12

Hook = Callable[[int], dict | None]


class Encoder:
    """Encodes objects; shared instances are encoded once per encoder and referenced after."""

    def __init__(self, ip: Interpreter, *, tensor: Hook | None = None, module: Hook | None = None, home: str | None = None,
                 value: Hook | None = None) -> None:  # fmt: skip
        """`home`: the module whose globals are being encoded; its own instances are encoded by
        state, not as references to its globals (which the rebuild is about to create)."""
        self.ip = ip
        self.home = home
        self.tensor_hook = tensor
        self.module_hook = module
        if value is None:  # partials, local functions, slices, singletons: in defaults and class attributes too
            from zen.cpython.encode.values import ValueKinds

            kinds = ValueKinds(ip, containers=False)
            kinds.encoder = weakref.proxy(self)  # no cycle: thousands of encoders are made and dropped
            value = kinds
        self.value_hook = value  # values the plain forms miss (partials, a torch.device), after the tensor/module hooks
        self._ids: dict[int, int] = {}
        self._dtypes: dict[int, str] | None = None
        self._globals: dict[str, dict[int, str]] = {}
        self._sys_modules: dict[str, int] | None = None

    def encode(self, addr: int, depth: int = 0) -> dict[str, Any]:
        try:
            return self._encode(addr, depth)
        except ZenError as exc:
            return {"unsupported": f"unreadable: {exc}"}

    def _encode(self, addr: int, depth: int) -> dict[str, Any]:
        ip = self.ip
        if depth > MAX_DEPTH:
            return {"unsupported": "nested too deep"}
        for hook in (self.module_hook, self.tensor_hook, self.value_hook):
            if hook is not None:
                found = hook(addr)
                if found is not None:
                    return found
        tp = ip.type_of(addr)
        kind = ip.kind_of_type(tp)
        exact = ip.wk.kind_by_type.get(tp) == kind
        t = ip.type_info(tp)
        if kind in PLAIN and exact:
            return {"lit": repr(ip.value(addr, 1))}
        if self._is_enum(t):
            return self._enum(addr, t)
        if kind in CONTAINERS:
            from zen.cpython.readers.containers import read_list, read_set, read_tuple

            items = read_tuple(ip, addr) if kind == "tuple" else read_list(ip, addr) if kind == "list" else read_set(ip, addr)
            if len(items) > MAX_ITEMS:
                return {"unsupported": f"{kind} of {len(items)} items"}
            out: dict[str, Any] = {kind: [self.encode(a, depth + 1) for a in items]}
            return out if exact else {**out, "type": self._name(t)}
        if kind == "dict":
            from zen.cpython.readers.dicts import read_dict

            items = read_dict(ip, addr)
            if len(items) > MAX_ITEMS:
                return {"unsupported": f"dict of {len(items)} items"}
            out = {"dict": [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in items]}
            return out if exact else {**out, "type": self._name(t)}
        if kind == "type":
            return self._anchored({"cls": self._name(ip.type_info(addr))}, ip.type_info(addr), depth)
        if kind == "function":
            from zen.cpython.names import name_resolves
            from zen.cpython.readers.functions import carries_own_name, read_function

            f = read_function(ip, addr)
            if not f.module:
                return {"unsupported": f"function {f.qualname} has no module"}
            if not carries_own_name(ip, f) and not name_resolves(ip, f.module, f.qualname, addr):
                return {"unsupported": f"function wrapping {f.qualname} (functools.wraps): its code is another function's"}
            return {"func": f"{f.module}:{f.qualname}", "fn": f"{addr:#x}"}
        if kind == "method":
            from zen.cpython.readers.functions import read_function, read_method

            m = read_method(ip, addr)
            if ip.kind(m.func) != "function":
                return {"unsupported": "method of a builtin function"}
            return {"method": read_function(ip, m.func).name, "self": self.encode(m.self, depth + 1)}
        if kind == "builtin_function":
            return self._builtin(addr)
        if kind == "module":
            return {"module": module_info(ip, addr).name}
        if t.full_name == "torch.dtype":
            name = self._dtype_names().get(addr)
            return {"dtype": name} if name else {"unsupported": "unknown torch.dtype"}
        if kind == "instance" and t.is_heap:
            return self._instance(addr, t, depth)
        return {"unsupported": t.full_name}

    # -- kinds that need more than one reader -------------------------------------------------
    def _name(self, t) -> str:
        return f"{t.module}:{t.qualname}"

    def _is_enum(self, t) -> bool:
        for a in t.mro_addrs[1:]:
            try:
                if self.ip.type_info(a).full_name == "enum.Enum":
                    return True
            except ZenError:
                continue
        return False

    def _enum(self, addr: int, t) -> dict[str, Any]:
        from zen.cpython.readers.instances import read_instance

        name = read_instance(self.ip, addr).attrs.get("_name_")
        if name is None or self.ip.kind(name) != "str":
            return {"unsupported": f"enum member of {t.full_name} without a name"}
        return {"enum": self._name(t), "name": self.ip.str(name)}

    def _builtin(self, addr: int) -> dict[str, Any]:
        ip = self.ip
        F = ip.P.cfunction
        ml, self_obj, module = ip.ptr(addr + F.m_ml), ip.ptr(addr + F.m_self), ip.ptr(addr + F.m_module)
        name = ip.space.cstring(ip.ptr(ml + ip.P.methoddef.ml_name), 256).decode("utf-8", "replace")
        if module and ip.kind(module) == "str":
            return {"func": f"{ip.str(module)}:{name}"}
        if self_obj and ip.kind(self_obj) == "module":
            return {"func": f"{module_info(ip, self_obj).name}:{name}"}
        return {"unsupported": f"builtin method {name} bound to an object"}

    def _dtype_names(self) -> dict[int, str]:
        """Addresses of torch's dtype objects -> their names, from the torch module's namespace."""
        if self._dtypes is None:
            memo = self.ip.census_memo  # the image's dtypes: read once per interpreter, not per encoder
            if "torch_dtypes" in memo:
                self._dtypes = memo["torch_dtypes"]  # type: ignore[assignment]
                return self._dtypes
            self._dtypes = memo["torch_dtypes"] = {}
            try:
                from zen.cpython.heap import Heap
                from zen.cpython.readers.dicts import dict_str_items

                torch = Heap(self.ip).sys_modules().get("torch")
                if torch:
                    for name, v in dict_str_items(self.ip, module_info(self.ip, torch).dict):
                        try:
                            if self.ip.type_name(v) == "torch.dtype":
                                self._dtypes.setdefault(v, name)
                        except ZenError:
                            continue
            except ZenError:
                pass
        return self._dtypes

    def _module_global(self, addr: int, module: str) -> str | None:
        """The name under which `module` (the instance's class's module) holds this object."""
        if module not in self._globals:
            # encoders are made per value (class attributes, defaults): a module's names are read
            # once per interpreter, not once per encoder
            shared = self.ip.census_memo.setdefault("module_global_names", {})
            if module in shared:  # type: ignore[operator]
                self._globals[module] = shared[module]  # type: ignore[index]
                return self._globals[module].get(addr)
            names: dict[int, str] = {}
            try:
                from zen.cpython.heap import Heap
                from zen.cpython.readers.dicts import dict_str_items

                if self._sys_modules is None:
                    self._sys_modules = Heap(self.ip).sys_modules()
                mod = self._sys_modules.get(module)
                if mod:
                    for name, v in dict_str_items(self.ip, module_info(self.ip, mod).dict):
                        if not name.startswith("__"):
                            names.setdefault(v, name)
            except ZenError:
                pass
            self._globals[module] = shared[module] = names  # type: ignore[index]
        return self._globals[module].get(addr)

    def _anchored(self, enc: dict[str, Any], t, depth: int) -> dict[str, Any]:
        """`enc` as is, unless `t` is a class made inside a function (`<locals>` in its qualname: no import path
        reaches it). Then, where its module holds an instance of it (or the class) under a name, with
        `"cls_of": "module:name"`: the live process takes the class from that object (`type(module.name)`), as
        pickle would. Else (and always for the module being rebuilt, `home`, whose names are being made) with
        `"local_class"`: the class itself, by its bases and its `__dict__` (`_local_class`).

        kernels' `use_kernel_forward_from_hub` makes such a class for each function it wraps (transformers 5.25:
        `apply_rotary_pos_emb`), names it after that function's module and leaves an instance there; each layer
        using it holds another instance."""
        if "<locals>" not in t.qualname:
            return enc
        name = self._anchor(t) if t.module != self.home else None
        if name is not None:
            return {**enc, "cls_of": f"{t.module}:{name}"}
        return {**enc, "local_class": self._local_class(t, depth)}

    def _anchor(self, t) -> str | None:
        """A name under which `t`'s module holds `t` or an instance of it (the first in name order)."""
        self._module_global(0, t.module)  # the module's names, read once per interpreter
        anchors = self.ip.census_memo.setdefault("module_type_anchors", {})
        if t.module not in anchors:
            found: dict[int, str] = {}
            for v, name in sorted(self._globals[t.module].items(), key=lambda kv: kv[1]):
                try:
                    found.setdefault(v if self.ip.kind(v) == "type" else self.ip.type_of(v), name)
                except ZenError:
                    continue
            anchors[t.module] = found  # type: ignore[index]
        return anchors[t.module].get(t.addr)  # type: ignore[index]

    def _local_class(self, t, depth: int) -> dict[str, Any]:
        """`{"class": "module:qualname", "id": n, "name": NAME, "bases": [...], "meta": {...} | None,
        "dict": [[name, {...}], ...]}`: a class made inside a function, to be made again by calling its
        metaclass (`Decoder._local_class`). Its methods are functions no name reaches, encoded with their code
        (`values.ValueKinds`); the descriptors `type` makes itself are left out. `{"ref": n}` the next time."""
        if t.addr in self._ids:
            return {"ref": self._ids[t.addr]}
        from zen.cpython.readers.dicts import read_dict

        ip = self.ip
        n = self._ids[t.addr] = len(self._ids) + 1
        items = read_dict(ip, t.dict_addr) if t.dict_addr else []
        if len(items) > MAX_ITEMS:
            return {"unsupported": f"class {t.qualname} with {len(items)} attributes"}
        ns = []
        for k, v in items:
            name = ip.str(k) if ip.kind(k) == "str" else None
            if name is None or name in ("__dict__", "__weakref__", "__qualname__"):
                continue
            ns.append([name, self.encode(v, depth + 1)])
        meta = None if t.metatype == ip.wk.types.get("type") else self.encode(t.metatype, depth + 1)
        return {"class": self._name(t), "id": n, "name": t.name, "bases": [self.encode(b, depth + 1) for b in t.bases],
                "meta": meta, "dict": ns}  # fmt: skip

    def _instance(self, addr: int, t, depth: int) -> dict[str, Any]:
        if addr in self._ids:
            return {"ref": self._ids[addr]}
        from zen.cpython.readers.instances import read_instance

        if t.full_name in ("logging.Logger", "logging.RootLogger", "logging.PlaceHolder"):
            name = read_instance(self.ip, addr).attrs.get("name")
            if name and self.ip.kind(name) == "str":
                return {"logger": self.ip.str(name)}
        held = self._module_global(addr, t.module) if t.module != self.home else None
        if held is not None:
            return {"global": f"{t.module}:{held}"}

        n = self._ids[addr] = len(self._ids) + 1
        inst = read_instance(self.ip, addr)
        out: dict[str, Any] = self._anchored({"obj": self._name(t), "id": n}, t, depth)
        out["state"] = {k: self.encode(v, depth + 1) for k, v in inst.attrs.items()}
        if inst.slots:
            out["slots"] = {k: self.encode(v, depth + 1) for k, v in inst.slots.items() if v}
        return out
