"""Build the MR of one Keras model: layer tree, configuration, every variable, optimizer state.

Module records are layers (path = layer names joined by "." below the root, as PyTorch paths are attribute names);
tensor keys are the variables' own Keras paths (`model/conv/kernel`), the names `model.variables` and Keras weight
files use, so weights.safetensors reads like the deployed model's state. Kinds: trainable variables are
"parameter", non-trainable ones (BatchNormalization's moving statistics) "buffer", random-seed state "seed"
(all in weights.safetensors, in `Layer.variables` order); the optimizer's variables go to extra.safetensors as
"optimizer_slot" (per-weight slots: momentums, velocities, ...) or "optimizer_state" (iterations, learning rate).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from zen.cpython.interp import Interpreter
from zen.cpython.readers.functions import read_function
from zen.cpython.readers.instances import read_instance
from zen.frontends.keras.construct import construction
from zen.frontends.keras.layers import LayerIndex, LayerNode, _items
from zen.frontends.keras.tensors import TFTensorMeta, TFTensorReader
from zen.represent.mr import ModelMR, ModuleRecord, RootRecord, TensorRecord
from zen.runtime.errors import ZenError

PLAIN_KINDS = {"none", "bool", "int", "float", "complex", "str"}
# Bookkeeping every Keras layer carries: not configuration.
INTERNAL = frozenset({
    "name", "built", "autocast", "supports_jit", "_called", "_tracked", "_path", "_parent_path", "_remat_mode",
    "_supports_masking", "_convert_input_args", "_allow_non_tensor_positional_args", "_call_has_training_arg",
    "_call_has_mask_arg", "_call_has_context_arg", "_auto_config", "_self_setattr_tracking", "_self_update_uid",
    "_run_eagerly", "_jit_compile", "_initial_epoch", "steps_per_execution", "unrolled_steps_per_execution", "compiled",
    "_compute_loss_has_training_arg", "_lora_enabled", "_layers", "_trainable_variables", "_non_trainable_variables",
    "_seed_generators", "_losses", "_loss_ids", "_losses_override", "_metrics", "_inbound_nodes", "_outbound_nodes",
    "_saved_model_arg_spec", "_saved_model_inputs_spec", "_input_spec", "_build_shapes_dict", "_tracker", "_lock",
})  # fmt: skip


@dataclass
class KerasSlot:
    """One variable: its key, the Keras Variable object, its metadata (None if unreadable) and its record."""

    key: str
    addr: int
    kind: str
    meta: TFTensorMeta | None
    record: TensorRecord


def plain(ip: Interpreter, addr: int, depth: int = 3) -> bool:
    """Exact None/bool/int/float/complex/str and tuples/lists of them (bounded), as the PyTorch front end keeps."""
    try:
        kind = ip.kind(addr)
        if ip.wk.kind_by_type.get(ip.type_of(addr)) != kind:
            return False
        if kind in PLAIN_KINDS:
            return True
        if kind in ("tuple", "list") and depth > 0:
            items = _items(ip, addr)
            return len(items) <= 64 and all(plain(ip, a, depth - 1) for a in items)
    except ZenError:
        return False
    return False


def _wrapped_list(ip: Interpreter, addr: int) -> bool:
    """A list subclass (TF's ListWrapper) whose items, kept in `_storage`, are plain values."""
    try:
        if ip.kind(addr) != "list" or ip.type_of(addr) == ip.wk.types["list"]:
            return False
        items = _items(ip, addr)
        return len(items) <= 64 and all(plain(ip, a) for a in items)
    except ZenError:
        return False


def layer_config(ip: Interpreter, node: LayerNode, problems: list[str], path: str) -> dict[str, str]:
    """Configuration attributes as Python literal reprs: plain values (public ones and Keras's `_num_heads`-style
    private ones), functions (activations) by qualified name, the dtype policy by name."""
    out: dict[str, str] = {}
    for name, v in sorted(node.attrs.items()):
        if name in INTERNAL or name.startswith(("__", "_self_", "_call_")):
            continue
        key = name[1:] if name.startswith("_") and name[1:] not in node.attrs else name
        try:
            if plain(ip, v):
                out[key] = repr(ip.value(v, 4))
            elif _wrapped_list(ip, v):  # Keras tracks a list attribute (LayerNormalization's axis) as a ListWrapper
                out[key] = repr([ip.value(a, 4) for a in _items(ip, v)])
            elif ip.kind(v) == "function":
                f = read_function(ip, v)
                if f.qualname.rsplit(".", 1)[-1] != key.lstrip("_"):  # not a method Keras wrapped (build, quantize)
                    out[key] = repr(f"{f.module}.{f.qualname}" if f.module else f.qualname)
            elif name == "_dtype_policy":
                pname = read_instance(ip, v).attrs.get("_name")
                if pname is not None and ip.kind(pname) == "str":
                    out["dtype_policy"] = repr(ip.str(pname))
        except ZenError as exc:
            problems.append(f"attribute {path or '<root>'}.{name} not read: {exc}")
    return out


def _var_info(ip: Interpreter, addr: int) -> dict:
    """The Python side of a Keras Variable: path, name, trainable flag, claimed dtype and shape."""
    attrs = read_instance(ip, addr).attrs
    info: dict = {}
    for name in ("_path", "_name", "_dtype"):
        a = attrs.get(name)
        info[name] = ip.str(a) if a is not None and ip.kind(a) == "str" else None
    t = attrs.get("_trainable")
    info["_trainable"] = bool(ip.value(t)) if t is not None and ip.kind(t) == "bool" else None
    s = attrs.get("_shape")
    info["_shape"] = tuple(ip.value(s, 2)) if s is not None and ip.kind(s) == "tuple" and plain(ip, s) else None
    return info


def tensor_record(key: str, kind: str, addr: int, meta: TFTensorMeta | None, error: str = "") -> TensorRecord:
    if meta is None:
        return TensorRecord(key, kind, "?", [], [], 0, "?", False, 0, f"{addr:#x}", "0x0", "?", status="unreadable", note=error)
    rec = TensorRecord(
        key=key, kind=kind, dtype=meta.dtype, shape=list(meta.shape), stride=list(meta.stride), storage_offset=0,
        device=meta.device, requires_grad=kind == "parameter", nbytes=meta.nbytes, address=f"{addr:#x}",
        storage=f"{meta.buffer:#x}", python_type=meta.python_type, data_address=f"{meta.data_ptr:#x}",
    )  # fmt: skip
    if not meta.on_cpu:
        rec.status, rec.note = "on-device", f"data on device {meta.device}, not in host memory (not in this image)"
    elif meta.safetensors is None:
        rec.status, rec.note = "unrepresentable", f"dtype {meta.dtype} has no safetensors encoding"
    return rec


class VariableReader:
    """Reads each Keras Variable once (a shared layer's variables are reached from several paths)."""

    def __init__(self, ip: Interpreter, reader: TFTensorReader) -> None:
        self.ip, self.reader = ip, reader
        self._memo: dict[int, tuple[dict, TFTensorMeta | None, str]] = {}

    def read(self, addr: int) -> tuple[dict, TFTensorMeta | None, str]:
        if addr not in self._memo:
            try:
                info = _var_info(self.ip, addr)
            except ZenError as exc:
                info = {"_path": None, "_name": None, "_trainable": None, "_dtype": None, "_shape": None, "error": str(exc)}
            try:
                meta, err = self.reader.keras_variable(addr), ""
            except ZenError as exc:
                meta, err = None, str(exc)
            self._memo[addr] = (info, meta, err)
        return self._memo[addr]


def root_record(index: LayerIndex, vars_: VariableReader, root: int, refs: list[str]) -> RootRecord:
    walk = index.walk(root)
    params = [v for v, _, kind in index.variables(root) if kind == "parameter"]
    elements = sum(m.numel for m in (vars_.read(v)[1] for v in params) if m is not None)
    depth = max((p.count(".") + 1 if p else 0) for p, _ in walk)
    return RootRecord(f"{root:#x}", index.nodes[root].type.full_name, len(walk), len(params), elements, depth, refs)


def _slot(key: str, kind: str, addr: int, info: dict, meta: TFTensorMeta | None, err: str, problems: list[str]) -> KerasSlot:
    rec = tensor_record(key, kind, addr, meta, err)
    if meta is not None:
        claimed = (info.get("_dtype"), info.get("_shape"))
        if claimed[0] not in (None, meta.dtype) or (claimed[1] is not None and tuple(claimed[1]) != meta.shape):
            problems.append(f"variable {key}: Python side says {claimed[0]}{list(claimed[1] or [])}, "
                            f"the TF tensor holds {meta.dtype}{list(meta.shape)} (the tensor's bytes are recovered)")  # fmt: skip
    return KerasSlot(key, addr, kind, meta, rec)


def _unique(key: str, used: set[str], problems: list[str]) -> str:
    if key not in used:
        used.add(key)
        return key
    n = 2
    while f"{key}#{n}" in used:
        n += 1
    problems.append(f"variable path {key} is used by more than one variable: the later one is keyed {key}#{n}")
    used.add(f"{key}#{n}")
    return f"{key}#{n}"


def build_mr(ip: Interpreter, index: LayerIndex, vars_: VariableReader, root: RootRecord,
             roots: list[RootRecord]) -> tuple[ModelMR, list[KerasSlot], list[KerasSlot]]:  # fmt: skip
    """The MR, one slot per model variable (weights) and one per optimizer variable (extra)."""
    raddr = int(root.address, 16)
    problems: list[str] = []
    used: set[str] = set()
    key_of: dict[int, str] = {}
    slots: list[KerasSlot] = []
    for v, _owner, kind in index.variables(raddr):
        info, meta, err = vars_.read(v)
        if kind != "seed" and info.get("_trainable") is not None:
            kind = "parameter" if info["_trainable"] else "buffer"
        key = _unique(info.get("_path") or info.get("_name") or f"{v:#x}", used, problems)
        key_of[v] = key
        slots.append(_slot(key, kind, v, info, meta, err, problems))
    walk = index.walk(raddr)
    paths = {node.addr: path for path, node in walk}
    modules = []
    for path, node in walk:
        own = [(v, "p") for v in node.trainable] + [(v, "b") for v in node.non_trainable] + [(v, "b") for v in node.seeds]
        pkeys, bkeys = {}, {}
        for v, which in own:
            name = vars_.read(v)[0].get("_name") or key_of.get(v, f"{v:#x}").rsplit("/", 1)[-1]
            (pkeys if which == "p" else bkeys)[name] = key_of.get(v)
        modules.append(ModuleRecord(
            path=path, cls_module=node.type.module, cls_qualname=node.type.qualname, address=f"{node.addr:#x}",
            training=None, hyperparameters=layer_config(ip, node, problems, path), parameters=list(pkeys),
            buffers=list(bkeys), children=[n for n, _ in node.children], parameter_keys=pkeys, buffer_keys=bkeys,
            child_paths={n: paths.get(c) for n, c in node.children},
            state={"keras": construction(ip, node, problems, path)},
        ))  # fmt: skip
    extra = optimizer_slots(ip, index, vars_, raddr, used, problems)
    storages: dict[str, list[str]] = {}
    for s in slots:
        if s.meta is not None and s.meta.buffer:
            storages.setdefault(s.record.storage, []).append(s.key)
    mr = ModelMR(
        root=root, roots=roots, modules=modules, tensors=[s.record for s in slots],
        shared_storage=[k for k in storages.values() if len(k) > 1],
        layer_types=dict(sorted(Counter(m.cls for m in modules).items())), problems=problems, framework="keras",
    )  # fmt: skip
    mr.extra_tensors = [s.record for s in extra]
    mr.graph = {"nodes": [m.path for m in modules], "hierarchy": hierarchy_edges(modules)}
    return mr, slots, extra


def optimizer_slots(ip: Interpreter, index: LayerIndex, vars_: VariableReader, root: int, used: set[str],
                    problems: list[str]) -> list[KerasSlot]:  # fmt: skip
    """The compiled optimizer's variables (`model.optimizer._variables`), marked slot or state."""
    opt = index.nodes[root].attrs.get("optimizer")
    if opt is None or ip.is_none(opt):
        return []
    try:
        attrs = read_instance(ip, opt).attrs
        inner = attrs.get("inner_optimizer")  # LossScaleOptimizer wraps the real one
        if inner is not None and not ip.is_none(inner) and "_variables" in read_instance(ip, inner).attrs:
            attrs = read_instance(ip, inner).attrs
        state = {attrs.get("_iterations"), attrs.get("_learning_rate")} - {None}
        variables = _items(ip, attrs.get("_variables"))
    except ZenError as exc:
        problems.append(f"optimizer at {opt:#x} not read: {exc}")
        return []
    out = []
    for v in variables:
        info, meta, err = vars_.read(v)
        kind = "optimizer_state" if v in state else "optimizer_slot"
        key = _unique(info.get("_path") or f"optimizer/{v:#x}", used, problems)
        out.append(_slot(key, kind, v, info, meta, err, problems))
    return out


def hierarchy_edges(modules: list[ModuleRecord]) -> list[list]:
    """[parent, child, tracking index] for every child link in the tree."""
    paths = {m.path for m in modules}
    edges = []
    for m in modules:
        for i, name in enumerate(m.children):
            child = f"{m.path}.{name}" if m.path else name
            if child in paths:
                edges.append([m.path, child, i])
    return edges


def summarize(mr: ModelMR) -> dict:
    params = [t for t in mr.tensors if t.kind == "parameter"]
    numel = [1 if not t.shape else _prod(t.shape) for t in params]
    return {
        "modules": len(mr.modules),
        "state_dict_entries": len(mr.tensors),
        "unique_tensors": len(mr.tensors),
        "parameters": len(params),
        "parameter_elements": sum(numel),
        "buffers": len([t for t in mr.tensors if t.kind != "parameter"]),
        "bytes": sum(t.nbytes for t in mr.tensors),
        "dtypes": dict(sorted(Counter(t.dtype for t in mr.tensors).items())),
        "status": dict(sorted(Counter(t.status for t in mr.tensors).items())),
        "tied_groups": len(mr.tied),
        "optimizer_variables": len(mr.extra_tensors),
    }


def _prod(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
