"""Encodings for values the plain encoder (`zen.cpython.encode.snapshot`) has no form for: its value hook.

Third-party models (torchvision, timm, transformers) keep layer *factories* and small helpers in
their modules' `__dict__`, in class attributes and in functions' defaults and closures:
`functools.partial(nn.LayerNorm, eps=1e-6)`, lambdas and closures, slices, torch's memory formats
and layouts. Nothing here is specific to a framework, so every encoder uses it: the module-state
encoder of a front end (with containers, see below) and the encoders of class attributes,
function defaults, closures and globals (without). Encoded by what they are, never by running anything:

    {"partial": "functools:partial", "id": n, "func": {...}, "args": {...}, "keywords": {...}, "state": {...}}
        a partial (or a subclass): its C members, read through the member descriptors of its
        type in the image (offsets come from the image, not from constants), plus its __dict__
    {"slice": [start, stop, step]}
    {"function": "module:qualname", "id": n, "name": NAME, "code": BASE64, "python": "3.11",
     "defaults": {...}, "kwdefaults": {...}, "closure": [{...}|{"empty": true}], "dict": {...}}
        a function made inside another function or a lambda: no name reaches it, so its code
        object is rebuilt (constructed, never run) and travels as marshal data
    {"global": "torch:channels_last"}  an instance of a built-in type that its module holds by
        name (torch.memory_format, torch.layout, torch.qscheme): a singleton
    {"list"|"set": [...], "id": n}, {"dict": [[k, v], ...], "id": n}   exact lists, sets and dicts
        with an identity, so that shared containers stay shared and cyclic ones cyclic
        (`{"ref": n}` on the second visit); only with `containers=True` (module state): elsewhere
        the plain encoder copies them per reference, so that the same class attribute encodes
        the same in a base and its fork whatever was encoded before it (diffs compare encodings)

Values of kinds the hook does not know are left to the generic encoder (`None`).
"""

from __future__ import annotations

import base64
from typing import Any

from zen.cpython.code import canonical_marshal
from zen.cpython.interp import Interpreter
from zen.runtime.errors import ZenError

MAX_NEST = 8  # nested values this hook encodes itself (each nesting restarts the encoder's own depth)
T_OBJECT, T_OBJECT_EX = 6, 16


class ValueKinds:
    """The value hook: `hook(addr)` -> an encoding, or None to let the encoder handle it."""

    def __init__(self, ip: Interpreter, *, containers: bool = True) -> None:
        self.ip = ip
        self.containers = containers
        self.encoder: Any = None  # the snapshot.Encoder using this hook (set by its creator)
        # type address -> handler name: what a type is depends on the image alone, so every hook of this
        # interpreter shares one table (a recovery makes thousands of encoders, each with its hook: classifying
        # the same types again was 9,000 MRO walks in a GPT-2 recovery)
        self._kind: dict[int, str | None] = ip.census_memo.setdefault(f"value_kinds/{containers}", {})  # type: ignore[assignment]
        self._nest = 0
        self._namespaces: dict[str, dict[int, str]] = {}

    def __call__(self, addr: int) -> dict | None:
        try:
            tp = self.ip.type_of(addr)
            kind = self._kind.get(tp, "?")
            if kind == "?":
                kind = self._kind[tp] = self._classify(tp)
            if kind is None:
                return None
            if self._nest >= MAX_NEST:
                return {"unsupported": f"{self.ip.type_info(tp).full_name} nested too deep"}
            self._nest += 1
            try:
                return getattr(self, f"_{kind}")(addr, tp)
            finally:
                self._nest -= 1
        except ZenError as exc:
            return {"unsupported": f"unreadable: {exc}"}

    def _classify(self, tp: int) -> str | None:
        t = self.ip.type_info(tp)
        names = []
        for a in t.mro_addrs:
            try:
                names.append(self.ip.type_info(a).full_name)
            except ZenError:
                continue
        if "functools.partial" in names:
            return "partial"
        if t.full_name == "slice":
            return "slice"
        if self.containers and tp in (self.ip.wk.types.get("list"), self.ip.wk.types.get("dict"), self.ip.wk.types.get("set")):
            return "container"
        if t.full_name == "function":
            return "function"
        if not t.is_heap and t.module not in ("builtins", "") and self.ip.kind_of_type(tp) == "instance":
            return "singleton"
        return None

    def _enc(self, addr: int) -> dict:
        if not addr:
            return {"lit": "None"}
        return self.encoder.encode(addr)

    def _memo(self, addr: int) -> tuple[int, bool]:
        """(id, seen): shared objects are encoded once and referenced after (the encoder's ids)."""
        ids = self.encoder._ids
        if addr in ids:
            return ids[addr], True
        ids[addr] = len(ids) + 1
        return ids[addr], False

    # -- kinds ----------------------------------------------------------------------------------
    def _partial(self, addr: int, tp: int) -> dict:
        from zen.cpython.readers.instances import read_instance

        n, seen = self._memo(addr)
        if seen:
            return {"ref": n}
        t = self.ip.type_info(tp)
        members = self._members(addr, t)
        missing = [k for k in ("func", "args", "keywords") if k not in members]
        if missing:
            return {"unsupported": f"{t.full_name} without readable {', '.join(missing)}"}
        inst = read_instance(self.ip, addr)
        return {"partial": f"{t.module}:{t.qualname}", "id": n, "func": self._enc(members["func"]),
                "args": self._enc(members["args"]), "keywords": self._enc(members["keywords"]),
                "state": {k: self._enc(v) for k, v in inst.attrs.items()}}  # fmt: skip

    def _members(self, addr: int, t) -> dict[str, int]:
        """Object members of a C type (PyMemberDef with T_OBJECT/T_OBJECT_EX), by name, from the
        member descriptors in its MRO's dictionaries."""
        from zen.cpython.readers.dicts import read_dict

        ip = self.ip
        md_kind = ip.wk.types.get("member_descriptor")
        MD, MDef = ip.P.memberdescr, ip.P.memberdef
        out: dict[str, int] = {}
        for cls in t.mro_addrs:
            ct = ip.type_info(cls)
            if not ct.dict_addr:
                continue
            for k, v in read_dict(ip, ct.dict_addr):
                if ip.kind(k) != "str" or md_kind is None or ip.header(v)[1] != md_kind:
                    continue
                name = ip.str(k)
                mdef = ip.ptr(v + MD.d_member)
                offset, mtype = ip.space.i64(mdef + MDef.offset), ip.space.u32(mdef + MDef.type)
                if name not in out and mtype in (T_OBJECT, T_OBJECT_EX) and 0 < offset < ct.basicsize:
                    out[name] = ip.ptr(addr + offset)
        return out

    def _container(self, addr: int, tp: int) -> dict:
        from zen.cpython.encode.modules_memo import MAX_ITEMS
        from zen.cpython.readers.containers import read_list, read_set
        from zen.cpython.readers.dicts import read_dict

        kind = self.ip.kind_of_type(tp)
        read = {"dict": read_dict, "list": read_list, "set": read_set}[kind]
        items = read(self.ip, addr)
        if len(items) > MAX_ITEMS:
            return {"unsupported": f"{kind} of {len(items)} items"}
        n, seen = self._memo(addr)
        if seen:
            return {"ref": n}
        if kind == "dict":
            return {"dict": [[self._enc(k), self._enc(v)] for k, v in items], "id": n}
        return {kind: [self._enc(a) for a in items], "id": n}

    def _slice(self, addr: int, tp: int) -> dict:
        S = self.ip.P.slice
        return {"slice": [self._enc(self.ip.ptr(addr + getattr(S, f))) for f in ("start", "stop", "step")]}

    def _function(self, addr: int, tp: int) -> dict | None:
        from zen.cpython.code.codebuild import can_rebuild, rebuild_code, rebuilt_memo
        from zen.cpython.names import name_resolves
        from zen.cpython.readers.containers import read_tuple
        from zen.cpython.readers.functions import carries_own_name, read_cell, read_function

        ip = self.ip
        f = read_function(ip, addr)
        if not f.module or ("<" not in f.qualname and (carries_own_name(ip, f) or name_resolves(ip, f.module, f.qualname, addr))
                            and not self._replaced(f)):  # fmt: skip
            return None  # reachable by its name: the encoder's {"func": ...}
        n, seen = self._memo(addr)
        if seen:
            return {"ref": n}
        out: dict[str, Any] = {"function": f"{f.module}:{f.qualname}", "id": n, "name": f.name, "fn": f"{addr:#x}"}
        if not can_rebuild(ip):
            return {**out, "unsupported": f"code of {f.qualname} is Python {ip.P.minor} bytecode (zen runs another version)"}
        out["code"] = base64.b64encode(canonical_marshal.dumps(rebuild_code(ip, f.code, rebuilt_memo(ip)))).decode()
        out["python"] = ip.P.minor
        out["defaults"] = self._enc(f.defaults) if f.defaults and not ip.is_none(f.defaults) else None
        out["kwdefaults"] = self._enc(f.kwdefaults) if f.kwdefaults and not ip.is_none(f.kwdefaults) else None
        cells = []
        if f.closure and not ip.is_none(f.closure):
            for cell in read_tuple(ip, f.closure):
                v = read_cell(ip, cell)
                cells.append(self._enc(v) if v else {"empty": True})
        out["closure"] = cells
        out["dict"] = self._enc(f.dict) if f.dict else None
        return out

    def _replaced(self, f) -> bool:
        """Whether the module-level name of function `f` holds an instance instead (a decorator made the
        function a callable object: kernels' `use_kernel_forward_from_hub`, whose instances call the function
        they hold in a closure). Its name then reaches that object, never the function: its code is encoded."""
        if "." in f.qualname:
            return False
        try:
            from zen.cpython.encode.modules_memo import module_info, names_in
            from zen.cpython.heap import Heap

            mod = Heap(self.ip).sys_module(f.module)
            held = names_in(self.ip, module_info(self.ip, mod).dict).get(f.qualname) if mod else None
            return held is not None and self.ip.kind(held) == "instance"
        except ZenError:
            return False

    def _singleton(self, addr: int, tp: int) -> dict | None:
        t = self.ip.type_info(tp)
        for module in dict.fromkeys((t.module, t.module.split(".")[0])):
            name = self._namespace(module).get(addr)
            if name is not None:
                return {"global": f"{module}:{name}"}
        return None

    def _namespace(self, module: str) -> dict[int, str]:
        if module not in self._namespaces:
            shared = self.ip.census_memo.setdefault("module_public_names", {})  # once per interpreter
            if module in shared:  # type: ignore[operator]
                self._namespaces[module] = shared[module]  # type: ignore[index]
                return self._namespaces[module]
            names: dict[int, str] = {}
            try:
                from zen.cpython.encode.modules_memo import module_info
                from zen.cpython.heap import Heap
                from zen.cpython.readers.dicts import dict_str_items

                mod = Heap(self.ip).sys_modules().get(module)
                if mod:
                    for name, v in dict_str_items(self.ip, module_info(self.ip, mod).dict):
                        if not name.startswith("_"):
                            names.setdefault(v, name)
            except ZenError:
                pass
            self._namespaces[module] = shared[module] = names  # type: ignore[index]
        return self._namespaces[module]
