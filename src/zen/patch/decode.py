"""Turn zen's value encodings (zen.cpython.encode.snapshot) back into live objects. Reuse only.

This runs in the investigator's process and *imports and instantiates* code: framework classes
by name, and the recovered model classes that a patch or a synthesised module made available.
Names of recovered classes and functions are first translated through the patch's maps (a fork's
`convnet_se:SEBlock` may live in the patched base module `convnet`).
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any

from zen.runtime.errors import ZenError


class ReuseError(ZenError):
    pass


class Unrecovered:
    """Stands in for a value zen could not rebuild; using it raises a clear error."""

    def __init__(self, reason: str, where: str = "") -> None:
        object.__setattr__(self, "_zen_reason", reason)
        object.__setattr__(self, "_zen_where", where)

    def _fail(self, *_a, **_k):
        raise ReuseError(f"value of {self._zen_where or 'an attribute'} was not recoverable from the image: {self._zen_reason}")

    __call__ = __getattr__ = __iter__ = __len__ = __getitem__ = _fail

    def __bool__(self) -> bool:
        self._fail()
        return False

    def __repr__(self) -> str:
        return f"<unrecovered: {self._zen_reason}>"


class Resolver:
    """Finds classes, functions and modules by 'module:qualname', through the patch's maps."""

    def __init__(self, class_map: dict[str, str] | None = None, function_map: dict[str, str] | None = None,
                 module_map: dict[str, str | None] | None = None) -> None:  # fmt: skip
        self.class_map = class_map or {}
        self.function_map = function_map or {}
        self.module_map = module_map or {}
        self.by_function: dict[str, Any] = {}  # function object address in the image -> live function
        self.installed_fallback: set[str] = set()  # synthesised modules whose missing names come from the installed one
        self.fell_back: list[str] = []

    def module(self, name: str):
        target = self.module_map.get(name) or name
        if target in sys.modules:
            return sys.modules[target]
        try:
            return importlib.import_module(target)
        except ImportError as exc:
            raise ReuseError(f"module {target!r} is not importable here: {exc}",
                             "install the base model's packages (see the case's requirements.txt)") from None  # fmt: skip

    def _walk(self, ref: str):
        mod_name, _, qual = ref.partition(":")
        try:
            return self._path(self.module(mod_name), ref, qual)
        except ReuseError:
            if mod_name not in self.installed_fallback:
                raise
        # a name the recovered code did not need (not in the image's model code): the installed package's
        try:
            obj = self._path(importlib.import_module(mod_name), ref, qual)
        except (ImportError, ReuseError):
            raise ReuseError(f"{ref} is neither in the rebuilt module nor in an installed {mod_name}") from None
        self.fell_back.append(ref)
        return obj

    @staticmethod
    def _path(obj, ref: str, qual: str):
        for part in qual.split("."):
            try:
                obj = vars(obj)[part] if part in getattr(obj, "__dict__", {}) else getattr(obj, part)
            except (AttributeError, TypeError):
                raise ReuseError(f"{ref} not found: no attribute path {qual}") from None
        return obj

    def cls(self, ref: str):
        return self._walk(self.class_map.get(ref, ref))

    def func(self, ref: str):
        target = self.function_map.get(ref)
        if target is None:
            mod, _, qual = ref.partition(":")
            target = f"{self.module_map.get(mod) or mod}:{qual}"
        obj = self._walk(target)
        return getattr(obj, "__func__", obj) if isinstance(obj, (staticmethod, classmethod)) else obj


def literal(text: str) -> Any:
    if text in ("nan", "inf", "-inf"):
        return float(text)
    if text == "Ellipsis":
        return ...
    if text == "NotImplemented":
        return NotImplemented
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ReuseError(f"not a Python literal: {text[:80]}") from None


def describe(enc: Any) -> str:
    """What an encoding stands for, for problem entries ('functools.partial', 'class m:C', ...)."""
    if not isinstance(enc, dict):
        return type(enc).__name__
    for key, label in (("obj", ""), ("partial", ""), ("function", "function "), ("func", "function "), ("cls", "class "),
                       ("enum", "enum "), ("global", "global "), ("module", "module "), ("method", "bound method ")):  # fmt: skip
        if key in enc and isinstance(enc[key], str):
            return label + enc[key].replace(":", ".")
    if "unsupported" in enc:
        return str(enc["unsupported"])
    return next(iter(enc), "?")


ERRORS = (ReuseError, TypeError, ValueError, AttributeError, KeyError, IndexError, ImportError, RecursionError)


class Decoder:
    """Encodings -> live objects. A value that cannot be rebuilt becomes an `Unrecovered`
    placeholder and a problem entry naming its path and type; decoding never raises for one."""

    def __init__(self, resolver: Resolver, tensors: dict[tuple[str, str], Any] | None = None,
                 modules: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.r = resolver
        # `is None`, not `or`: the graph's tensor table is an empty dict subclass that fills on demand
        self.tensors = tensors if tensors is not None else {}
        self.modules = modules if modules is not None else {}
        self.memo: dict[int, Any] = {}
        self.unrecovered: list[str] = []
        self.pending: Callable[[str], Any] | None = None  # "module:name" -> that global, made now (or None)

    def decode(self, enc: Any, where: str = "") -> Any:
        try:
            return self._decode(enc, where)
        except ERRORS as exc:
            what = describe(enc)
            return self._missing(f"cannot rebuild {what}: {type(exc).__name__}: {exc}"[:400], where, what)

    def _decode(self, enc: Any, where: str) -> Any:
        if not isinstance(enc, dict):
            raise ReuseError(f"malformed encoding at {where}: {enc!r}"[:200])
        if "lit" in enc:
            return literal(enc["lit"])
        # forms whose fields reuse other forms' tags ("func", "dict") come first
        if "partial" in enc:
            return self._partial(enc, where)
        if "function" in enc:
            return self._function(enc, where)
        if "class" in enc:
            return self._local_class(enc, where)
        if "id" in enc and ("list" in enc or "dict" in enc or "set" in enc):
            return self._shared(enc, where)
        for kind, build in (("tuple", tuple), ("list", list), ("set", set), ("frozenset", frozenset)):
            if kind in enc:
                items = [self.decode(x, f"{where}[{i}]") for i, x in enumerate(enc[kind])]
                return self._typed(enc, build(items), where)
        if "dict" in enc:
            items = {}
            for k, v in enc["dict"]:
                key = self.decode(k, f"{where}.<key>")
                items[key] = self.decode(v, f"{where}[{key!r}]"[:300])
            return self._typed(enc, items, where)
        if "cls" in enc:
            return self._class(enc, "cls")
        if "func" in enc:
            if enc.get("fn") in self.r.by_function:
                return self.r.by_function[enc["fn"]]
            if "<locals>" in enc["func"]:
                return self._missing(f"function {enc['func']} was made inside another function", where)
            return self.r.func(enc["func"])
        if "module" in enc:
            return self.r.module(enc["module"])
        if "global" in enc:
            return self._named_global(enc["global"])
        if "method" in enc:
            owner = self.decode(enc["self"], f"{where}.__self__")
            if isinstance(owner, Unrecovered):
                return owner
            return getattr(owner, enc["method"])
        if "logger" in enc:
            import logging

            return logging.getLogger(enc["logger"])
        if "enum" in enc:
            cls = self.r.cls(enc["enum"])
            if "name" not in enc:
                return cls(self.decode(enc["value"], where))
            if enc["name"] in getattr(cls, "__members__", {}) or "|" not in enc["name"]:
                return getattr(cls, enc["name"])
            import functools
            import operator

            return functools.reduce(operator.or_, (cls[n] for n in enc["name"].split("|")))  # a Flag combination
        if "dtype" in enc:
            import torch

            return getattr(torch, enc["dtype"])
        if "device" in enc:
            import torch

            return torch.device(enc["device"])
        if "slice" in enc:
            return slice(*(self.decode(x, where) for x in enc["slice"]))
        if "tensor" in enc:
            key = (enc.get("file", "weights"), enc["tensor"])
            if key not in self.tensors:
                return self._missing(f"tensor {key[1]} is not in the case", where)
            return self.tensors[key]
        if "module_ref" in enc:
            return self.modules[enc["module_ref"]]
        if "ref" in enc:
            if enc["ref"] not in self.memo:
                return self._missing(f"reference to object #{enc['ref']} before its definition", where)
            return self.memo[enc["ref"]]
        if "obj" in enc:
            return self._instance(enc, where)
        if "empty" in enc:
            return self._missing("empty cell", where)
        if "unsupported" in enc:
            return self._missing(enc["unsupported"], where)
        raise ReuseError(f"unknown encoding at {where}: {sorted(enc)}")

    def _shared(self, enc: dict, where: str) -> Any:
        """A list, dict or set with an identity: made empty and memoised first, then filled, so
        references to it from inside (cycles) and from elsewhere (sharing) get this object."""
        kind = next(k for k in ("list", "dict", "set") if k in enc)
        obj: Any = {"list": list, "dict": dict, "set": set}[kind]()
        self.memo[enc["id"]] = obj
        if kind == "dict":
            for k, v in enc["dict"]:
                key = self.decode(k, f"{where}.<key>")
                obj[key] = self.decode(v, f"{where}[{key!r}]"[:300])
        elif kind == "list":
            obj.extend(self.decode(x, f"{where}[{i}]") for i, x in enumerate(enc["list"]))
        else:
            obj.update(self.decode(x, f"{where}[{i}]") for i, x in enumerate(enc["set"]))
        return obj

    def _instance(self, enc: dict, where: str) -> Any:
        """An instance by its state, without calling its constructor (`cls.__new__(cls)`)."""
        cls = self._class(enc, "obj")
        try:
            obj = cls.__new__(cls)
        except Exception as exc:  # noqa: BLE001 - a C type whose __new__ needs arguments zen does not have
            return self._missing(f"{enc['obj'].replace(':', '.')} cannot be created without its constructor's arguments "
                                 f"({type(exc).__name__}: {exc})", where, enc["obj"])  # fmt: skip
        self.memo[enc["id"]] = obj
        state = {k: self.decode(v, f"{where}.{k}") for k, v in enc.get("state", {}).items()}
        try:
            obj.__dict__.update(state)
        except AttributeError:
            for k, v in state.items():
                object.__setattr__(obj, k, v)
        for k, v in enc.get("slots", {}).items():
            object.__setattr__(obj, k, self.decode(v, f"{where}.{k}"))
        return obj

    def _class(self, enc: dict, key: str) -> type:
        """The class `enc[key]` names; one made inside a function through the object its module holds
        (`"cls_of"`, see `Encoder._anchored`), which must be of a class of that same qualname."""
        if isinstance(enc.get("local_class"), dict) and not isinstance(enc.get("cls_of"), str):
            cls = self.decode(enc["local_class"], f"class {enc[key]}")
            if not isinstance(cls, type):
                why = getattr(cls, "_zen_reason", None) or f"a {type(cls).__name__}"
                raise ReuseError(f"class {enc[key]} made inside a function could not be made again ({why})")
            return cls
        if not isinstance(enc.get("cls_of"), str):
            return self.r.cls(enc[key])
        held = self.r.func(enc["cls_of"])
        cls = held if isinstance(held, type) else type(held)
        want = str(enc[key]).partition(":")[2]
        if getattr(cls, "__qualname__", None) != want:
            raise ReuseError(f"{enc['cls_of'].replace(':', '.')} is of class {cls.__module__}.{cls.__qualname__} here, "
                             f"not {str(enc[key]).replace(':', '.')}")  # fmt: skip
        return cls

    def _named_global(self, ref: str) -> Any:
        """A name in a module, through the maps like a function. One the patch is about to set in a module it
        rebuilds (an instance its code reads as a global, referenced from a closure decoded before the module's
        globals) is decoded first through `pending`, where the patch's applier sets it."""
        made = self.pending(ref) if self.pending is not None else None
        return made if made is not None else self.r.func(ref)

    def _local_class(self, enc: dict, where: str) -> type:
        """A class made inside a function (`Encoder._local_class`): its metaclass called on its bases and its
        decoded `__dict__`, as the class statement did (its methods' code is recovered code)."""
        mod, _, qual = str(enc["class"]).partition(":")
        bases = tuple(self.decode(b, f"{where}.__bases__[{i}]") for i, b in enumerate(enc.get("bases") or []))
        if not bases or not all(isinstance(b, type) for b in bases):
            raise ReuseError(f"bases of {qual} could not be rebuilt")
        meta = self.decode(enc["meta"], f"{where}.__class__") if enc.get("meta") else type
        if not isinstance(meta, type) or not issubclass(meta, type):
            raise ReuseError(f"metaclass of {qual} could not be rebuilt")
        ns = {k: self.decode(v, f"{where}.{k}") for k, v in enc.get("dict") or [] if isinstance(k, str)}
        ns.setdefault("__module__", mod)
        ns["__qualname__"] = qual
        cls = meta(str(enc.get("name") or qual.rpartition(".")[2]), bases, ns)
        self.memo[enc["id"]] = cls
        return cls

    def _partial(self, enc: dict, where: str) -> Any:
        """functools.partial: created around a placeholder, memoised, then given its real state
        with `__setstate__` (so a partial reachable from its own arguments is rebuilt too)."""
        cls = self.r.cls(enc["partial"])
        obj = cls.__new__(cls, print)
        self.memo[enc["id"]] = obj
        func = self.decode(enc["func"], f"{where}.func")
        args = self.decode(enc["args"], f"{where}.args")
        kw = self.decode(enc["keywords"], f"{where}.keywords")
        state = {k: self.decode(v, f"{where}.{k}") for k, v in enc.get("state", {}).items()}
        bad = [n for n, v in (("func", func), ("args", args), ("keywords", kw)) if isinstance(v, Unrecovered)]
        if bad:
            return self._missing(f"{enc['partial'].replace(':', '.')} whose {', '.join(bad)} could not be rebuilt", where)
        obj.__setstate__((func, tuple(args), dict(kw or {}), state or None))
        return obj

    def _function(self, enc: dict, where: str) -> Any:
        """A function no name reaches (a lambda, a closure): its code from the encoding, its globals
        from its module here (through the patch's maps), then defaults, cells and __dict__."""
        import marshal
        import types

        if enc.get("fn") in self.r.by_function:
            return self.r.by_function[enc["fn"]]
        if "code" not in enc:
            return self._missing(enc.get("unsupported") or f"no code for {enc['function']}", where, enc["function"])
        here = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if enc.get("python") != here:
            return self._missing(f"{enc['function']} holds Python {enc.get('python')} bytecode; this is Python {here}", where)
        import base64

        code = marshal.loads(base64.b64decode(enc["code"]))  # load(): executes recovered code by design
        if not isinstance(code, types.CodeType):
            raise ReuseError(f"code of {enc['function']} is not a code object")
        module = self.r.module(enc["function"].partition(":")[0])
        closure = tuple(types.CellType() for _ in code.co_freevars) or None
        f = types.FunctionType(code, module.__dict__, enc.get("name") or code.co_name, None, closure)
        f.__qualname__ = enc["function"].partition(":")[2]
        f.__module__ = module.__name__
        self.memo[enc["id"]] = f
        if enc.get("defaults"):
            d = self.decode(enc["defaults"], f"{where}.__defaults__")
            f.__defaults__ = d if isinstance(d, tuple) else None
        if enc.get("kwdefaults"):
            kw = self.decode(enc["kwdefaults"], f"{where}.__kwdefaults__")
            f.__kwdefaults__ = kw if isinstance(kw, dict) else None
        for name, cell, c in zip(code.co_freevars, closure or (), enc.get("closure") or []):
            if not c.get("empty"):
                cell.cell_contents = self.decode(c, f"{where}.<cell {name}>")
        if enc.get("dict"):
            attrs = self.decode(enc["dict"], f"{where}.__dict__")
            if isinstance(attrs, dict):
                f.__dict__.update(attrs)
        return f

    def _typed(self, enc: dict, value: Any, where: str) -> Any:
        """A container of a subclass: namedtuples by `_make`, others by calling the class on the
        items; a class that refuses is reported and the plain container kept."""
        if "type" not in enc:
            return value
        try:
            cls = self.r.cls(enc["type"])
            if isinstance(value, tuple) and hasattr(cls, "_make"):
                return cls._make(value)
            return cls(value)
        except ERRORS as exc:
            self.unrecovered.append(f"{where}: {enc['type'].replace(':', '.')} rebuilt as a plain {type(value).__name__} "
                                    f"({type(exc).__name__}: {exc})"[:400])  # fmt: skip
            return value

    def _missing(self, reason: str, where: str, what: str | None = None) -> Unrecovered:
        self.unrecovered.append(f"{where}: {reason}" if what is None or what in reason else f"{where}: {what}: {reason}")
        return Unrecovered(reason, where)
