"""Step 4 of applying a patch (apply.py): values, once every class and function exists.

Defaults, keyword defaults, closure cells, class attributes and module globals are decoded through the patch's name
maps. A module global that the base already has is only replaced by a recovered class, function, module or plain
constant that differs; recovered *instances* (loggers, registries) never replace the base's. This EXECUTES
recovered code (decoding builds recovered objects), as apply.py does.
"""

from __future__ import annotations

import enum
import types
from typing import Any

from zen.patch.classes import namedtuple_fields, sunder
from zen.patch.decode import Decoder, ReuseError, Unrecovered

VALUE_KINDS = frozenset({"lit", "tuple", "list", "set", "frozenset", "dict", "cls", "func", "module", "enum", "dtype"})


class ValuePhase:
    """The values step of `apply.Patcher` (it provides data, report, made_classes, installed, live, fresh, _module)."""

    # -- 4. values --------------------------------------------------------------------------------
    def values(self) -> None:
        r = self.report.resolver
        dec = Decoder(r)
        busy: set[str] = set()
        dec.pending = lambda ref: self._global_now(dec, ref, busy)
        for c in self.data["classes"]:
            cls = self.made_classes.get(c["key"])
            if cls is None or c["recovered_module"] in self.installed:
                continue
            machinery = isinstance(cls, enum.EnumMeta)  # members and the enum's own state were made with the class
            made = set(getattr(cls, "_fields", ())) if namedtuple_fields(c, cls.__bases__) else set()  # accessors
            for name, enc in c["attributes"].items():
                if name in made:
                    continue
                if "lit" not in enc and not (machinery and (name in cls.__members__ or sunder(name))):
                    self._set_attr(cls, name, enc, dec, f"{c['key']}.{name}")
        for target, attrs in self.data.get("class_changes", {}).items():
            try:
                cls = r.cls(target)
            except ReuseError as exc:
                self.report.warnings.append(f"class attributes of {target} not applied: {exc}")
                continue
            for name, enc in attrs.items():
                self._set_attr(cls, name, enc, dec, f"{target}.{name}")
        for e in self.data["functions"]:
            f = self.live.get(e["id"])
            if f is None:
                continue
            where = f"{e['module']}:{e['qualname']}"
            if e.get("defaults") is not None or e["op"] != "replace" or e["id"] in self.fresh:
                f.__defaults__ = self._tuple(dec, e.get("defaults"), f"{where} defaults")
            if e.get("kwdefaults") is not None or e["id"] in self.fresh:
                kw = dec.decode(e["kwdefaults"], f"{where} kwdefaults") if e.get("kwdefaults") else None
                f.__kwdefaults__ = kw if isinstance(kw, dict) else None
            if e["id"] in self.fresh:
                self._cells(f, e, dec, where)
                if e.get("dict"):
                    attrs = dec.decode(e["dict"], f"{where} __dict__")
                    if isinstance(attrs, dict):
                        f.__dict__.update({k: v for k, v in attrs.items() if not isinstance(v, Unrecovered)})
        self._globals(dec)
        self.report.warnings += dec.unrecovered
        self.report.warnings += [f"{ref}: not in the recovered code; taken from the installed package" for ref in
                                 sorted(set(self.report.resolver.fell_back))]  # fmt: skip

    def _tuple(self, dec: Decoder, enc: dict | None, where: str) -> tuple | None:
        if not enc:
            return None
        v = dec.decode(enc, where)
        return v if isinstance(v, tuple) else None

    def _cells(self, f: types.FunctionType, e: dict, dec: Decoder, where: str) -> None:
        for name, cell, enc in zip(f.__code__.co_freevars, f.__closure__ or (), e.get("closure") or []):
            if name == "__class__":
                continue
            try:
                cell.cell_contents  # noqa: B018 - already filled (kept from the replaced function)
                continue
            except ValueError:
                pass
            if enc.get("empty"):
                continue
            cell.cell_contents = dec.decode(enc, f"{where} closure {name}")

    def _set_attr(self, obj: Any, name: str, enc: dict, dec: Decoder, where: str) -> None:
        if "unsupported" in enc:
            self.report.warnings.append(f"{where}: {enc['unsupported']} (left as the base has it)")
            return
        try:
            v = dec.decode(enc, where)
            if not isinstance(v, Unrecovered):
                setattr(obj, name, v)
        except (ReuseError, TypeError, AttributeError) as exc:
            self.report.warnings.append(f"{where}: not restored ({exc})")

    def _outside(self, enc: dict) -> bool:
        """A global that names something outside the recovered modules (an import: `inspect`,
        `functools.wraps`): it is set before classes are created, because creating a class runs
        its bases' `__init_subclass__`, recovered code that may read such globals."""
        kind = next(iter(enc), "")
        if kind == "lit":
            return True
        if kind not in ("module", "func", "cls", "global") or not isinstance(enc[kind], str):
            return False
        top = enc[kind].partition(":")[0]
        return top not in self.report.modules and not any(top.startswith(m + ".") for m in self.report.modules)

    def _global_now(self, dec: Decoder, ref: str, busy: set) -> Any:
        """The global `ref` ("module:name") of a module this patch rebuilds, decoded and set before its turn in
        `_globals` (a closure cell or default refers to it); None when the patch holds none, or the name holds
        it already (see `_displaces`), or it cannot be rebuilt, or it is being decoded already (a cycle)."""
        mod, _, name = ref.partition(":")
        enc = self.data.get("globals", {}).get(mod, {}).get(name)
        if enc is None or mod not in self.report.modules or ref in busy:
            return None
        busy.add(ref)
        ns = self._module(mod).__dict__
        if name in ns and not self._displaces(ns[name], enc):
            return None  # there already: resolved by name
        v = dec.decode(enc, f"{mod}.{name}")
        if isinstance(v, Unrecovered):
            return None
        ns[name] = v
        return v

    def _displaces(self, current: Any, enc: Any) -> bool:
        """Whether a recovered instance (`enc`) takes a module name from a function this patch made there: the
        image held the instance under the function's name (a decorator left a callable object in its place,
        keeping the function in a cell; see `closure`), so the name must reach the instance."""
        if not (isinstance(enc, dict) and "obj" in enc and isinstance(current, types.FunctionType)):
            return False
        made = getattr(self, "_made_ids", None)
        if made is None:
            made = self._made_ids = {id(self.live[i]) for i in self.fresh if i in self.live}
        return id(current) in made

    def _globals(self, dec: Decoder, early: bool = False) -> None:
        for rec_mod, names in self.data.get("globals", {}).items():
            if rec_mod not in self.report.modules:
                continue
            module = self._module(rec_mod)
            ns = module.__dict__
            for name, enc in names.items():
                if early and not (name not in ns and isinstance(enc, dict) and self._outside(enc)):
                    continue
                kind = next(iter(enc), "")
                if name in ns and not _value_like(enc) and not self._displaces(ns[name], enc):
                    continue  # keep the base's instance (a logger, a registry)
                try:
                    v = dec.decode(enc, f"{module.__name__}.{name}")
                except (ReuseError, TypeError, ValueError) as exc:
                    if name not in ns:
                        self.report.warnings.append(f"global {module.__name__}.{name}: {exc}")
                    continue
                if isinstance(v, Unrecovered) and name in ns:
                    continue
                if name in ns and (ns[name] is v or (kind == "lit" and type(ns[name]) is type(v) and ns[name] == v)):
                    continue
                ns[name] = v


def _value_like(enc: Any, depth: int = 0) -> bool:
    """Only plain values and references by name (classes, functions, modules, enums, dtypes)."""
    if depth > 16:
        return False
    if isinstance(enc, list):
        return all(_value_like(x, depth + 1) for x in enc)
    if not isinstance(enc, dict):
        return True
    kind = next((k for k in enc if k in VALUE_KINDS), None)
    if kind is None:
        return False
    if kind in ("tuple", "list", "set", "frozenset", "dict"):
        return _value_like(enc[kind], depth + 1)
    return True
