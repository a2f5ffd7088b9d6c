"""Apply a verified patch in this process (ZEN §IV-D, Fig. 2). This EXECUTES recovered code.

Only `zen reuse` / `zen verify` and the packages they write call this; analysis never does.

Order matters, because recovered objects refer to each other:

1. modules: a patch target (the base model's module) is imported; a recovered module with no base
   counterpart is imported when it is installed here (its functions are then *verified* against
   the image and replaced where they differ), else synthesised as `zen_rebuilt.<name>`;
   self-contained patches synthesise every model module;
2. added classes, bases before subclasses, with their methods; `__class__` cells (for `super()`)
   are filled with the new class;
3. functions: a changed function gets the recovered `__code__` in place (every reference to it,
   decorators' closures included, sees the change); when its free variables differ a new function
   takes its place (class/module attribute, or the decorator closure cell holding it); added
   functions are created with `types.FunctionType` in their module's globals and bound where the
   image had them (plain, staticmethod, classmethod, property accessor);
4. values, once every class and function exists: defaults, keyword defaults, closure cells,
   class attributes and module globals, decoded through the patch's name maps.

A module global that the base already has is only replaced by a recovered class, function, module
or plain constant that differs; recovered *instances* (loggers, registries) never replace the base's.
"""

from __future__ import annotations

import builtins
import enum
import importlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from zen.patch.classes import bind_ns, enum_members, fill_class_cell, namedtuple_class, namedtuple_fields, sunder
from zen.patch.decode import Decoder, Resolver, ReuseError
from zen.patch.format import PatchError, code_of
from zen.patch.values import ValuePhase

SYNTH_PREFIX = "zen_rebuilt"
_APPLIED: dict[str, str] = {}  # module name -> content sha of the patch that changed it (one patch per process)


@dataclass
class Applied:
    """What applying a patch did, for the reuse report."""

    resolver: Resolver
    modules: dict[str, str]  # recovered module -> module name live in this process
    synthesised: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)  # functions and classes made from recovered code
    replaced: list[str] = field(default_factory=list)  # functions whose code was replaced
    verified: list[str] = field(default_factory=list)  # installed functions identical to the image's
    warnings: list[str] = field(default_factory=list)
    rebased: list[str] = field(default_factory=list)  # mapped classes given the recovered bases
    mro_mismatch: list[str] = field(default_factory=list)  # classes whose MRO differs from the image's

    def to_json(self) -> dict[str, Any]:
        return {"modules": self.modules, "synthesised": self.synthesised, "created": len(self.created),
                "replaced": self.replaced, "verified_identical": len(self.verified), "warnings": self.warnings,
                "rebased": self.rebased, "mro_mismatch": self.mro_mismatch}  # fmt: skip


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Same bytecode, names, arguments and constants (nested code compared the same way); line
    tables and file names are ignored: an installed file at another path is still the same code."""
    fields = ("co_code", "co_names", "co_varnames", "co_freevars", "co_cellvars", "co_argcount", "co_posonlyargcount",
              "co_kwonlyargcount", "co_flags")  # fmt: skip
    if any(getattr(a, f) != getattr(b, f) for f in fields) or len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) or isinstance(y, types.CodeType):
            if not (isinstance(x, types.CodeType) and isinstance(y, types.CodeType) and same_code(x, y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _unwrap(raw: Any, binding: str) -> Any:
    if binding in ("staticmethod", "classmethod", "method"):
        return getattr(raw, "__func__", None)
    if binding.startswith("property."):
        return getattr(raw, binding.split(".", 1)[1], None)
    return raw


def _bind(holder: Any, attr: str, binding: str, f: types.FunctionType) -> None:
    """Put `f` where the image had it: plain, staticmethod, classmethod or a property accessor."""
    if binding == "staticmethod":
        value: Any = staticmethod(f)
    elif binding == "classmethod":
        value = classmethod(f)
    elif binding.startswith("property."):
        part = binding.split(".", 1)[1]
        current = vars(holder).get(attr) if isinstance(holder, type) else None
        if isinstance(current, property):
            value = {"fget": current.getter, "fset": current.setter, "fdel": current.deleter}[part](f)
        else:
            value = property(**{part: f})
    else:
        value = f
    setattr(holder, attr, value)


class Patcher(ValuePhase):
    def __init__(self, data: dict) -> None:
        self.data = data
        self.self_contained = data["mode"] == "self-contained"
        self.entries = {e["id"]: e for e in data["functions"]}
        self.live: dict[int, types.FunctionType] = {}  # entry id -> the function now in use
        self.fresh: set[int] = set()  # entries whose function was created here (their cells need values)
        self.made_classes: dict[str, type] = {}  # class entry key -> class
        self.installed: set[str] = set()  # recovered modules used as installed here (verify, don't trust)
        self.report: Applied | None = None

    # -- 1. modules -------------------------------------------------------------------------------
    def modules(self) -> dict[str, str]:
        live: dict[str, str] = {}
        for rec, target in sorted(self.data["modules"].items()):
            if target is not None:
                self._import(target, f"base module of {rec}")
                live[rec] = target
                continue
            if not self.self_contained:
                try:
                    importlib.import_module(rec)
                    live[rec] = rec
                    self.installed.add(rec)
                    continue
                except Exception:  # noqa: BLE001 - any failure to import means: not usable here
                    pass
            live[rec] = self._synthesise(rec)
        return live

    def _import(self, name: str, why: str) -> types.ModuleType:
        try:
            return importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            hint = "install the base model's code (see the case's requirements.txt) or rebuild without --base"
            raise PatchError(f"cannot import {name} ({why}): {exc}", hint) from None

    def _synthesise(self, rec: str) -> str:
        if SYNTH_PREFIX not in sys.modules:
            pkg = types.ModuleType(SYNTH_PREFIX, "Modules rebuilt by zen from recovered code.")
            pkg.__path__ = []
            sys.modules[SYNTH_PREFIX] = pkg
        name = f"{SYNTH_PREFIX}.{rec}"
        mod = sys.modules.get(name)
        if mod is None:
            mod = types.ModuleType(name, f"Rebuilt by zen from the code of module {rec!r} recovered from a memory image.")
            mod.__dict__["__builtins__"] = builtins
            sys.modules[name] = mod
        self.report.synthesised.append(name)
        return name

    # -- helpers ----------------------------------------------------------------------------------
    def _module(self, name: str) -> types.ModuleType:
        return self.report.resolver.module(name)

    def _function(self, e: dict, module: types.ModuleType) -> types.FunctionType:
        code = code_of(self.data, e["code"])
        closure = tuple(types.CellType() for _ in code.co_freevars) or None
        f = types.FunctionType(code, self._globals_of(e, module), code.co_name, None, closure)
        f.__qualname__ = e["qualname"]
        f.__module__ = module.__name__
        self._live(e, f)
        self.fresh.add(e["id"])
        self.report.created.append(f"{module.__name__}:{e['qualname']}")
        return f

    def _globals_of(self, e: dict, module: types.ModuleType) -> dict:
        """The namespace the code runs in: a decorator's wrapper runs in the decorator's module."""
        g = e.get("globals_module")
        if not g:
            return module.__dict__
        try:
            return self._module(g).__dict__
        except ReuseError as exc:
            self.report.warnings.append(f"{e['recovered']}: globals module {g} unavailable ({exc}); using {module.__name__}")
            return module.__dict__

    def _live(self, e: dict, f: types.FunctionType) -> None:
        self.live[e["id"]] = f
        if e.get("function"):
            self.report.resolver.by_function[e["function"]] = f

    def _holder(self, module: types.ModuleType, qualname: str) -> Any:
        obj: Any = module
        for part in qualname.split(".")[:-1]:
            if part == "<locals>":
                return None
            obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
            if obj is None:
                return None
        return obj

    def _locate(self, e: dict, module: types.ModuleType):
        """(holder, raw attribute, function, wrapper that holds it or None) for an existing function."""
        try:
            holder = self.report.resolver.cls(e["owner"]) if e.get("owner") else self._holder(module, e["qualname"])
        except ReuseError:
            return None
        if holder is None:
            return None
        raw = vars(holder).get(e["attr"])
        f, parent = _unwrap(raw, e["binding"]) if raw is not None else None, None
        want = e.get("match") or e["qualname"]  # the code's own qualname (co_qualname)
        for _ in range(8):  # decorators: follow __wrapped__ to the function with this code
            if f is None or not isinstance(f, types.FunctionType):
                return None
            if f.__code__.co_qualname == want or (
                parent is None
                and f.__qualname__ == want
                and not hasattr(f, "__wrapped__")
                and f.__code__.co_name == want.rsplit(".", 1)[-1]
            ):
                return holder, raw, f, parent
            parent, f = f, getattr(f, "__wrapped__", None)
        return None

    # -- 2. classes -------------------------------------------------------------------------------
    def classes(self) -> None:
        for c in self.data["classes"]:
            module = self._module(c["module"])
            existing = vars(module).get(c["name"]) if "." not in c["qualname"] else None
            if c["recovered_module"] in self.installed and isinstance(existing, type) and existing.__qualname__ == c["qualname"]:
                self.made_classes[c["key"]] = existing  # installed: its methods are verified below
                continue
            self.made_classes[c["key"]] = self._make_class(c, module)

    def _make_class(self, c: dict, module: types.ModuleType) -> type:
        r = self.report.resolver
        try:
            bases = tuple(r.cls(b) for b in c["bases"]) or (object,)
            meta = r.cls(c["metaclass"]) if c.get("metaclass") else None
        except ReuseError as exc:
            raise PatchError(f"cannot create class {c['key']}: {exc}") from None
        ns: dict[str, Any] = {"__module__": module.__name__, "__qualname__": c["qualname"]}
        members = enum_members(c) if meta is not None and isinstance(meta, type) and issubclass(meta, enum.EnumMeta) else None
        if members is not None:  # an Enum's class dict holds the enum machinery's state: give it the members only
            ns.update(members)
        for name, enc in c["attributes"].items():  # plain values now; references once everything exists
            if members is not None and (name in members or sunder(name)):
                continue
            if "lit" in enc and name not in ("__module__", "__qualname__"):
                ns[name] = Decoder(r).decode(enc, f"{c['key']}.{name}")
        methods = []
        for m in c["methods"]:
            e = self.entries[m["function"]]
            f = self._function(e, module)
            methods.append((m["attr"], m["binding"], f))
        for attr, binding, f in methods:  # properties merge their accessors
            bind_ns(ns, attr, binding, f)
        try:
            fields = namedtuple_fields(c, bases)
            if fields is not None:  # field accessors are C descriptors: let namedtuple make the class
                cls = namedtuple_class(c, fields, module.__name__)
            else:
                cls = types.new_class(c["name"], bases, {"metaclass": meta} if meta else {}, lambda body: body.update(ns))
        except Exception as exc:  # noqa: BLE001 - a recovered class body the framework rejects
            raise PatchError(f"cannot create class {c['key']}: {type(exc).__name__}: {exc}") from None
        for _, _, f in methods:
            fill_class_cell(f, cls)
        holder = self._holder(module, c["qualname"])
        setattr(holder if holder is not None else module, c["name"], cls)
        self.report.created.append(f"{module.__name__}:{c['qualname']}")
        return cls

    # -- 3. functions -----------------------------------------------------------------------------
    def functions(self) -> None:
        in_classes = {m["function"] for c in self.data["classes"] for m in c["methods"]}
        for c in self.data["classes"]:  # methods of installed classes: verify, replace if different
            if c["key"] in self.made_classes and c["recovered_module"] in self.installed:
                for m in c["methods"]:
                    e = self.entries[m["function"]]
                    if e["id"] not in self.live:
                        self._add(e)
        for e in self.data["functions"]:
            if e["id"] in in_classes:
                continue
            if e["op"] == "replace":
                self._replace(e)
            else:
                self._add(e)

    def _replace(self, e: dict) -> None:
        module = self._module(e["module"])
        found = self._locate(e, module)
        if found is None:
            self.report.warnings.append(f"{e['module']}:{e['qualname']} not found in the base code; added instead")
            self._add(e)
            return
        holder, raw, f, parent = found
        code = code_of(self.data, e["code"])
        if code.co_freevars == f.__code__.co_freevars:
            f.__code__ = code
            self._live(e, f)
        else:
            new = self._function(e, module)
            old_cells = dict(zip(f.__code__.co_freevars, f.__closure__ or ()))
            if new.__closure__:
                for name, cell in zip(code.co_freevars, new.__closure__):
                    if name in old_cells:
                        cell.cell_contents = old_cells[name].cell_contents
            new.__defaults__, new.__kwdefaults__, new.__dict__ = f.__defaults__, f.__kwdefaults__, dict(f.__dict__)
            self._put_instead(holder, e, raw, f, parent, new)
        self.report.replaced.append(f"{e['module']}:{e['qualname']}")

    def _put_instead(self, holder: Any, e: dict, raw: Any, old: types.FunctionType, parent, new: types.FunctionType) -> None:
        if parent is None:
            _bind(holder, e["attr"], e["binding"], new)
            return
        for cell in parent.__closure__ or ():  # a decorator's wrapper holds the function in a cell
            try:
                if cell.cell_contents is old:
                    cell.cell_contents = new
            except ValueError:
                continue
        parent.__wrapped__ = new

    def _add(self, e: dict) -> None:
        module = self._module(e["module"])
        if "<locals>" in e["qualname"] and not e.get("owner"):
            # made inside another function (a decorator's wrapper): no name to put it under; other
            # recovered functions reach it by its address in the image (closure cells, __wrapped__)
            if e["module"] not in self.installed:
                self._function(e, module)
            return
        found = self._locate(e, module)
        if found is not None:  # installed already: keep it when it is the image's code
            holder, raw, f, parent = found
            if same_code(f.__code__, code_of(self.data, e["code"])):
                self._live(e, f)
                self.report.verified.append(f"{e['module']}:{e['qualname']}")
                return
            self._replace({**e, "op": "replace"})
            return
        holder = self.report.resolver.cls(e["owner"]) if e.get("owner") else self._holder(module, e["qualname"])
        if holder is None:
            self.report.warnings.append(f"{e['recovered']}: no place for {e['qualname']} in {module.__name__}; not added")
            return
        f = self._function(e, module)
        if isinstance(holder, type):
            fill_class_cell(f, holder)
        current = vars(holder).get(e["attr"])
        if current is not None and not (e["binding"].startswith("property.") and isinstance(current, property)):
            return  # the name holds a decorator's wrapper made from the image: f is reached through it
        _bind(holder, e["attr"], e["binding"], f)  # a property's second accessor joins the first

    # -- 3b. class structure ------------------------------------------------------------------------
    def structure(self) -> None:
        """Mapped classes as the image had them: recovered bases, methods the fork dropped removed."""
        r = self.report.resolver
        for target, refs in self.data.get("class_bases", {}).items():
            try:
                cls, bases = r.cls(target), tuple(r.cls(x) for x in refs)
            except ReuseError as exc:
                self.report.warnings.append(f"bases of {target} not applied: {exc}")
                continue
            if cls.__bases__ == bases:
                continue
            try:
                cls.__bases__ = bases
                self.report.rebased.append(target)
            except TypeError as exc:  # layouts that cannot be combined in place
                self.report.warnings.append(f"bases of {target} could not be changed to {refs}: {exc}")
        for target, names in self.data.get("class_removals", {}).items():
            try:
                cls = r.cls(target)
            except ReuseError:
                continue
            for name in names:
                if name in vars(cls):
                    delattr(cls, name)

    def check_mro(self) -> None:
        """Every rebuilt class must resolve attributes as the recovered one did: same MRO."""
        r = self.report.resolver
        for target, refs in self.data.get("class_mro", {}).items():
            try:
                cls = r.cls(target)
                want = [r.cls(x) for x in refs]
            except ReuseError as exc:
                self.report.mro_mismatch.append(f"{target}: MRO not checkable ({exc})")
                continue
            if not isinstance(cls, type) or list(cls.__mro__) != want:
                got = [f"{k.__module__}.{k.__qualname__}" for k in getattr(cls, "__mro__", ())]
                self.report.mro_mismatch.append(f"{target}: MRO {got} differs from the image's {refs}")

    # -- all of it ----------------------------------------------------------------------------------
    def run(self) -> Applied:
        self.report = Applied(Resolver(), {})
        live = self.modules()
        self.report.modules = live
        self._claim(live)
        self.report.resolver = Resolver(self.data.get("class_map", {}), self.data.get("function_map", {}), live)
        self.report.resolver.installed_fallback = {rec for rec, name in live.items() if name.startswith(SYNTH_PREFIX + ".")}
        if self.self_contained or any(n.startswith(SYNTH_PREFIX + ".") for n in live.values()):
            early = Decoder(self.report.resolver)
            self._globals(early, early=True)
            self.report.warnings += early.unrecovered
        self.classes()
        self.functions()
        self.structure()
        self.values()
        self.check_mro()
        return self.report

    def _claim(self, live: dict[str, str]) -> None:
        """One patch per process: a second, different patch of the same modules would mix two models' code."""
        sha = self.data["content_sha256"]
        for name in set(live.values()):
            other = _APPLIED.get(name)
            if other is not None and other != sha:
                raise PatchError(f"module {name} was already patched in this process by another patch ({other[:12]}...)",
                                 "load each rebuilt model in its own Python process")  # fmt: skip
        for name in set(live.values()):
            _APPLIED[name] = sha


def apply_patch(data: dict) -> Applied:
    """Apply a patch read with `read_patch` (verified). Idempotent per process for the same patch."""
    sha = data["content_sha256"]
    cached = _DONE.get(sha)
    if cached is not None:
        return cached
    applied = Patcher(data).run()
    _DONE[sha] = applied
    return applied


_DONE: dict[str, Applied] = {}
