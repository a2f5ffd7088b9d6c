"""Turn zen's value encodings (zen.cpython.snapshot) back into live objects. Reuse only.

This runs in the investigator's process and *imports and instantiates* code: framework classes
by name, and the recovered model classes that a patch or a synthesised module made available.
Names of recovered classes and functions are first translated through the patch's maps (a fork's
`convnet_se:SEBlock` may live in the patched base module `convnet`).
"""

from __future__ import annotations

import ast
import importlib
import sys
from typing import Any

from zen.errors import ZenError


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
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ReuseError(f"not a Python literal: {text[:80]}") from None


class Decoder:
    def __init__(self, resolver: Resolver, tensors: dict[tuple[str, str], Any] | None = None,
                 modules: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.r = resolver
        self.tensors = tensors or {}
        self.modules = modules or {}
        self.memo: dict[int, Any] = {}
        self.unrecovered: list[str] = []

    def decode(self, enc: Any, where: str = "") -> Any:
        if not isinstance(enc, dict):
            raise ReuseError(f"malformed encoding at {where}: {enc!r}"[:200])
        if "lit" in enc:
            return literal(enc["lit"])
        for kind, build in (("tuple", tuple), ("list", list), ("set", set), ("frozenset", frozenset)):
            if kind in enc:
                items = [self.decode(x, where) for x in enc[kind]]
                return self._typed(enc, build(items) if kind != "tuple" else tuple(items), where)
        if "dict" in enc:
            items = {self.decode(k, where): self.decode(v, where) for k, v in enc["dict"]}
            return self._typed(enc, items, where)
        if "cls" in enc:
            return self.r.cls(enc["cls"])
        if "func" in enc:
            if enc.get("fn") in self.r.by_function:
                return self.r.by_function[enc["fn"]]
            if "<locals>" in enc["func"]:
                return self._missing(f"function {enc['func']} was made inside another function", where)
            return self.r.func(enc["func"])
        if "module" in enc:
            return self.r.module(enc["module"])
        if "global" in enc:
            return self.r.func(enc["global"])  # a name in a module, through the maps like a function
        if "method" in enc:
            owner = self.decode(enc["self"], where)
            if isinstance(owner, Unrecovered):
                return owner
            return getattr(owner, enc["method"])
        if "logger" in enc:
            import logging

            return logging.getLogger(enc["logger"])
        if "enum" in enc:
            return getattr(self.r.cls(enc["enum"]), enc["name"])
        if "dtype" in enc:
            import torch

            return getattr(torch, enc["dtype"])
        if "device" in enc:
            import torch

            return torch.device(enc["device"])
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
            cls = self.r.cls(enc["obj"])
            obj = cls.__new__(cls)
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
        if "empty" in enc:
            return self._missing("empty cell", where)
        if "unsupported" in enc:
            return self._missing(enc["unsupported"], where)
        raise ReuseError(f"unknown encoding at {where}: {sorted(enc)}")

    def _typed(self, enc: dict, value: Any, where: str) -> Any:
        if "type" not in enc:
            return value
        try:
            return self.r.cls(enc["type"])(value)
        except (ReuseError, TypeError, ValueError):
            return value

    def _missing(self, reason: str, where: str) -> Unrecovered:
        self.unrecovered.append(f"{where}: {reason}")
        return Unrecovered(reason, where)
