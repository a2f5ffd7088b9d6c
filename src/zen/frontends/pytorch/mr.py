"""Build the MR of one model from the image: module tree, hyper-parameters, tensors, ties.

The tree follows `named_modules()` semantics (registration order, each module once); tensor keys
follow `state_dict()` semantics (pre-order, parameters then persistent buffers per module, a
shared submodule listed under every path, `None` entries skipped). Hooks that rewrite a
state_dict (`_register_state_dict_hook`) are code in the image and are not run: keys are the
structural ones.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from zen.cpython.interp import Interpreter
from zen.errors import ZenError
from zen.frontends.pytorch.modules import ModuleIndex, ModuleNode
from zen.frontends.pytorch.tensors import TensorMeta, TensorReader
from zen.represent.mr import ModelMR, ModuleRecord, RootRecord, TensorRecord

PLAIN_KINDS = {"none", "bool", "int", "float", "complex", "str"}
MAX_STATE_DEPTH = 256


@dataclass
class TensorSlot:
    """One state_dict entry: its key, the tensor object, and its metadata (None if unreadable)."""

    key: str
    addr: int
    kind: str
    meta: TensorMeta | None
    record: TensorRecord


def plain(ip: Interpreter, addr: int, depth: int = 3) -> bool:
    """True for exact None/bool/int/float/complex/str, and tuples/lists of those (bounded depth)."""
    try:
        kind = ip.kind(addr)
        if ip.wk.kind_by_type.get(ip.type_of(addr)) != kind:
            return False  # instances of subclasses (enums, str subclasses) are not plain values
        if kind in PLAIN_KINDS:
            return True
        if kind in ("tuple", "list") and depth > 0:
            from zen.cpython.readers.containers import read_list, read_tuple

            items = read_tuple(ip, addr) if kind == "tuple" else read_list(ip, addr)
            return len(items) <= 64 and all(plain(ip, a, depth - 1) for a in items)
    except ZenError:
        return False
    return False


def module_record(ip: Interpreter, path: str, node: ModuleNode, tensor_types: set[int]) -> ModuleRecord:
    t = node.type
    hyper = {}
    unregistered = []
    for name, v in node.attrs.items():
        if not name.startswith("_") and plain(ip, v):
            hyper[name] = repr(ip.value(v, 4))
        else:
            try:
                if ip.type_of(v) in tensor_types:
                    unregistered.append(name)
            except ZenError:
                pass
    training = node.attrs.get("training")
    return ModuleRecord(
        path=path,
        cls_module=t.module,
        cls_qualname=t.qualname,
        address=f"{node.addr:#x}",
        training=ip.value(training) if training is not None and ip.kind(training) == "bool" else None,
        hyperparameters=hyper,
        parameters=[n for n, a in node.parameters if a],
        buffers=[n for n, a in node.buffers if a],
        non_persistent_buffers=sorted(node.non_persistent),
        none_entries=[n for n, a in node.parameters + node.buffers + node.children if not a],
        children=[n for n, _ in node.children],
        unregistered_tensors=unregistered,
    )


def state_items(index: ModuleIndex, root: int) -> list[tuple[str, str, int]]:
    """(key, "parameter"|"buffer", tensor address) in state_dict() order."""
    out: list[tuple[str, str, int]] = []
    stack: list[tuple[str, int, int]] = [("", root, 0)]
    while stack:
        prefix, addr, depth = stack.pop()
        node = index.nodes.get(addr)
        if node is None or depth > MAX_STATE_DEPTH:
            continue
        out += [(prefix + n, "parameter", a) for n, a in node.parameters if a]
        out += [(prefix + n, "buffer", a) for n, a in node.buffers if a and n not in node.non_persistent]
        for name, c in reversed(node.children):
            if c:
                stack.append((f"{prefix}{name}.", c, depth + 1))
    return out


def tensor_record(key: str, kind: str, addr: int, meta: TensorMeta | None, error: str = "") -> TensorRecord:
    if meta is None:
        return TensorRecord(key, kind, "?", [], [], 0, "?", False, 0, f"{addr:#x}", "0x0", "?", status="unreadable", note=error)
    rec = TensorRecord(
        key=key, kind=kind, dtype=meta.dtype, shape=list(meta.shape), stride=list(meta.stride),
        storage_offset=meta.storage_offset, device=meta.device, requires_grad=meta.requires_grad, nbytes=meta.nbytes,
        address=f"{addr:#x}", storage=f"{meta.storage:#x}", python_type=meta.python_type,
        data_address=f"{meta.data_ptr + meta.storage_offset * meta.itemsize:#x}",
    )  # fmt: skip
    if not meta.on_cpu:
        rec.status, rec.note = "on-device", f"data on device {meta.device}, not in this image"
    elif meta.safetensors is None:
        rec.status, rec.note = "unrepresentable", f"dtype {meta.dtype} has no safetensors encoding"
    return rec


def root_record(index: ModuleIndex, reader: TensorReader, root: int, refs: list[str]) -> RootRecord:
    walk = index.walk(root)
    params = {a for _, n in walk for _, a in n.parameters if a}
    elements = 0
    for a in params:
        try:
            elements += reader.meta(a).numel
        except ZenError:
            pass
    depth = max((p.count(".") + 1 if p else 0) for p, _ in walk)
    return RootRecord(f"{root:#x}", index.nodes[root].type.full_name, len(walk), len(params), elements, depth, refs)


def build_mr(ip: Interpreter, index: ModuleIndex, reader: TensorReader, root: RootRecord, roots: list[RootRecord],
             tensor_types: set[int]) -> tuple[ModelMR, list[TensorSlot]]:  # fmt: skip
    raddr = int(root.address, 16)
    modules = [module_record(ip, path, node, tensor_types) for path, node in index.walk(raddr)]
    slots: list[TensorSlot] = []
    first_key_of: dict[int, str] = {}
    view_of: dict[tuple, str] = {}
    tied: dict[str, list[str]] = {}
    storages: dict[int, list[str]] = {}
    for key, kind, addr in state_items(index, raddr):
        try:
            meta = reader.meta(addr)
            rec = tensor_record(key, kind, addr, meta)
        except ZenError as exc:
            meta = None
            rec = tensor_record(key, kind, addr, None, str(exc))
        # The same tensor object under two keys, or two objects viewing the same bytes: tied.
        canonical = first_key_of.get(addr)
        if canonical is None and meta is not None:
            canonical = view_of.get((meta.storage, meta.storage_offset, meta.shape, meta.stride, meta.dtype))
        if canonical is not None:
            rec.tied_to = canonical
            tied.setdefault(canonical, [canonical]).append(key)
        else:
            first_key_of[addr] = key
            if meta is not None:
                view_of[(meta.storage, meta.storage_offset, meta.shape, meta.stride, meta.dtype)] = key
                if meta.storage:
                    storages.setdefault(meta.storage, []).append(key)
        slots.append(TensorSlot(key, addr, kind, meta, rec))
    mr = ModelMR(
        root=root,
        roots=roots,
        modules=modules,
        tensors=[s.record for s in slots],
        tied=list(tied.values()),
        shared_storage=[keys for keys in storages.values() if len(keys) > 1],
        layer_types=dict(sorted(Counter(m.cls for m in modules).items())),
    )
    mr.graph = {"nodes": [m.path for m in modules], "hierarchy": hierarchy_edges(modules)}
    return mr, slots


def hierarchy_edges(modules: list[ModuleRecord]) -> list[list]:
    """[parent, child, registration index] for every child link in the tree."""
    paths = {m.path for m in modules}
    edges = []
    for m in modules:
        for i, name in enumerate(m.children):
            child = f"{m.path}.{name}" if m.path else name
            if child in paths:
                edges.append([m.path, child, i])
    return edges


def summarize(mr: ModelMR) -> dict:
    unique = [t for t in mr.tensors if t.tied_to is None]
    params = [t for t in unique if t.kind == "parameter"]
    return {
        "modules": len(mr.modules),
        "state_dict_entries": len(mr.tensors),
        "unique_tensors": len(unique),
        "parameters": len(params),
        "parameter_elements": sum(_numel(t) for t in params),
        "buffers": len([t for t in unique if t.kind == "buffer"]),
        "bytes": sum(t.nbytes for t in unique),
        "dtypes": dict(sorted(Counter(t.dtype for t in unique).items())),
        "status": dict(sorted(Counter(t.status for t in mr.tensors).items())),
        "tied_groups": len(mr.tied),
    }


def _numel(t: TensorRecord) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n
