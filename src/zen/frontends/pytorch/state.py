"""The full state of every module, for rebuilding the model object graph (reuse).

Each module's instance attributes are encoded with `zen.cpython.encode.snapshot` (with the forms of
`values.py` for partials, local functions, slices and torch singletons) except the four the
rebuild restores structurally (`_parameters`, `_buffers`, `_modules`, `_non_persistent_buffers_set`).
References to modules of the tree become `{"module_ref": path}`; tensors become `{"tensor": key}`:
state_dict tensors by their key, anything else (non-persistent buffers, tensors held in plain
attributes, e.g. a rotary embedding's `original_inv_freq`) as an *extra tensor* under
`PATH.NAME`, written to extra.safetensors.
"""

from __future__ import annotations

from typing import Any

from zen.cpython.encode.snapshot import Encoder
from zen.cpython.encode.values import ValueKinds
from zen.cpython.interp import Interpreter
from zen.frontends.pytorch.modules import ModuleIndex
from zen.frontends.pytorch.mr import TensorSlot, tensor_record
from zen.frontends.pytorch.tensors import TensorReader
from zen.represent.mr import ModelMR
from zen.runtime.errors import ZenError

STRUCTURAL = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})


def module_states(ip: Interpreter, index: ModuleIndex, reader: TensorReader, mr: ModelMR, slots: list[TensorSlot],
                  tensor_types: set[int]) -> list[TensorSlot]:  # fmt: skip
    """Fill `state` of every MR module record; return the extra (non-state_dict) tensors."""
    walk = index.walk(int(mr.root.address, 16))
    paths = {node.addr: path for path, node in walk}
    state_key: dict[int, str] = {}
    for s in slots:
        state_key.setdefault(s.addr, s.key)  # a tied tensor keeps its first key
    extra: list[TensorSlot] = []
    extra_key: dict[int, str] = {}
    used_keys: set[str] = set()
    context = {"where": ""}

    def tensor_hook(addr: int) -> dict | None:
        try:
            if ip.type_of(addr) not in tensor_types:
                return None
        except ZenError:
            return None
        if addr in state_key:
            return {"tensor": state_key[addr], "file": "weights"}
        if addr not in extra_key:
            key = context["where"]
            # one attribute can hold several tensors (a list of anchors): keys must stay unique
            n = 0
            while key in used_keys:
                n += 1
                key = f"{context['where']}#{n}"
            used_keys.add(key)
            try:
                meta = reader.meta(addr)
                rec = tensor_record(key, "extra", addr, meta, reader=reader)
            except ZenError as exc:
                meta, rec = None, tensor_record(key, "extra", addr, None, str(exc))
            extra_key[addr] = key
            extra.append(TensorSlot(key, addr, "extra", meta, rec))
        return {"tensor": extra_key[addr], "file": "extra"}

    def module_hook(addr: int) -> dict | None:
        path = paths.get(addr)
        return None if path is None else {"module_ref": path}

    device_type: list[int | None] = [None]
    values = ValueKinds(ip)  # partials, local functions, slices, torch singletons, shared containers

    def value_hook(addr: int) -> dict | None:
        try:
            tp = ip.type_of(addr)
            if device_type[0] is None and ip.type_name(addr) == "torch.device":
                device_type[0] = tp
            if tp != device_type[0]:
                return values(addr)
            return {"device": reader.device_object(addr)}
        except ZenError:
            return None

    enc = values.encoder = Encoder(ip, tensor=tensor_hook, module=module_hook, value=value_hook)
    by_path = {m.path: m for m in mr.modules}
    for path, node in walk:
        rec = by_path.get(path)
        if rec is None:
            continue
        # non-persistent buffers are not in state_dict: they travel as extra tensors
        for name, a in node.buffers:
            if a and name in node.non_persistent:
                context["where"] = f"{path}.{name}" if path else name
                tensor_hook(a)
        state: dict[str, Any] = {}
        for name, v in node.attrs.items():
            if name in STRUCTURAL:
                continue
            context["where"] = f"{path}.{name}" if path else name
            state[name] = enc.encode(v)
        rec.state = state
        rec.buffer_keys = {n: (state_key.get(a) or extra_key.get(a)) if a else None for n, a in node.buffers}
        rec.parameter_keys = {n: state_key.get(a) if a else None for n, a in node.parameters}
        rec.child_paths = {n: paths.get(c) if c else None for n, c in node.children}
    _subclass_states(ip, enc, mr, slots, context)
    mr.extra_tensors = [s.record for s in extra]
    return extra


def _subclass_states(ip: Interpreter, enc: Encoder, mr: ModelMR, slots: list[TensorSlot], context: dict) -> None:
    """The attributes of each tensor read in parts (`subclasses.expand`), encoded for the rebuild: inner tensors
    by key, metadata (block size, qtype, a bitsandbytes quant_state with its own tensors as extra tensors) as
    values. A value the encoder cannot rebuild leaves that tensor unread (named), never silently dropped."""
    from zen.cpython.readers.instances import read_instance

    for s in slots:
        sc = s.record.subclass
        if not sc or "state" in sc:
            continue
        context["where"] = s.key
        try:
            sc["state"] = {name: enc.encode(v) for name, v in read_instance(ip, s.addr).attrs.items()}
        except ZenError as exc:
            sc["state"] = {}
            _unread(mr, s, f"its attributes could not be read ({exc})")
            continue
        bad = [name for name, v in sc["state"].items() if _unsupported(v)]
        if bad:
            _unread(mr, s, f"attributes zen cannot rebuild: {', '.join(bad[:8])}")


def _unread(mr: ModelMR, s: TensorSlot, why: str) -> None:
    u = {"where": s.key, "type": s.record.python_type, "address": s.record.address, "why": why}
    mr.unread.append(u)
    mr.problems.append(f"{s.key} ({u['type']} at {u['address']}) not read: {why}")


def _unsupported(v: Any, depth: int = 0) -> bool:
    """Whether an encoding holds a value marked unsupported (bounded: encodings are bounded too)."""
    if depth > 32:
        return True
    if isinstance(v, dict):
        return "unsupported" in v or any(_unsupported(x, depth + 1) for x in v.values())
    if isinstance(v, list):
        return any(_unsupported(x, depth + 1) for x in v)
    return False
