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
from zen.frontends.pytorch.modules import ModuleIndex, ModuleNode
from zen.frontends.pytorch.tensors import TensorMeta, TensorReader
from zen.represent.mr import ModelMR, ModuleRecord, RootRecord, TensorRecord
from zen.runtime.errors import ZenError

PLAIN_KINDS = {"none", "bool", "int", "float", "complex", "str"}


@dataclass
class ModelLimits:
    """Bounds on a model's structure (an image may build a chain of modules a million deep, or a
    diamond of shared children whose state_dict paths double at every level). Hitting one is a
    recorded problem and makes the case `partial`, never a silent drop. `zen recover --limit`."""

    max_module_depth: int = 10_000  # nesting of submodules below the root
    max_state_entries: int = 1_000_000  # state_dict keys (a shared submodule counts under every path)


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


def module_record(ip: Interpreter, path: str, node: ModuleNode, tensor_types: set[int], problems: list[str]) -> ModuleRecord:
    """One module's record; an attribute that cannot be read (oversize, corrupt) is a problem at its
    path and is left out, the rest of the module and model are still recovered."""
    t = node.type
    hyper = {}
    unregistered = []
    for name, v in node.attrs.items():
        try:
            if not name.startswith("_") and plain(ip, v):
                hyper[name] = repr(ip.value(v, 4))
            elif ip.type_of(v) in tensor_types:
                unregistered.append(name)
        except ZenError as exc:
            problems.append(f"attribute {_at(path, name)} not read: {exc}")
    training = node.attrs.get("training")
    try:
        train = ip.value(training) if training is not None and ip.kind(training) == "bool" else None
    except ZenError:
        train = None
    return ModuleRecord(
        path=path,
        cls_module=t.module,
        cls_qualname=t.qualname,
        address=f"{node.addr:#x}",
        training=train,
        hyperparameters=hyper,
        parameters=[n for n, a in node.parameters if a],
        buffers=[n for n, a in node.buffers if a],
        non_persistent_buffers=sorted(node.non_persistent),
        none_entries=[n for n, a in node.parameters + node.buffers + node.children if not a],
        children=[n for n, _ in node.children],
        unregistered_tensors=unregistered,
    )


def _at(path: str, name: str) -> str:
    return f"model.{path}.{name}" if path else f"model.{name}"


def state_items(index: ModuleIndex, root: int, limits: ModelLimits | None = None,
                problems: list[str] | None = None) -> list[tuple[str, str, int]]:  # fmt: skip
    """(key, "parameter"|"buffer", tensor address) in state_dict() order.

    A module reached again below itself (a cycle, `model.me = model`) is not descended into: PyTorch's
    own state_dict() would recurse forever there. Depth and key-count limits cut the walk with a
    problem naming where (the caller marks the case partial)."""
    limits = limits or ModelLimits()
    problems = problems if problems is not None else []
    out: list[tuple[str, str, int]] = []
    stack: list[tuple[str, int, tuple[int, ...]]] = [("", root, ())]
    while stack:
        prefix, addr, ancestors = stack.pop()
        node = index.nodes.get(addr)
        if node is None:
            continue
        if len(ancestors) > limits.max_module_depth:
            problems.append(f"module {prefix.rstrip('.')} is deeper than max_module_depth={limits.max_module_depth}: "
                            "its parameters and buffers and those below it were not recovered")  # fmt: skip
            continue
        if len(out) >= limits.max_state_entries:
            problems.append(f"more than max_state_entries={limits.max_state_entries} state_dict entries: "
                            f"the walk stopped at {prefix.rstrip('.') or 'the root'}")  # fmt: skip
            break
        out += [(prefix + n, "parameter", a) for n, a in node.parameters if a]
        out += [(prefix + n, "buffer", a) for n, a in node.buffers if a and n not in node.non_persistent]
        below = (*ancestors, addr)
        for name, c in reversed(node.children):
            if c and c not in below:
                stack.append((f"{prefix}{name}.", c, below))
    return out


def tensor_record(key: str, kind: str, addr: int, meta: TensorMeta | None, error: str = "",
                  reader: TensorReader | None = None) -> TensorRecord:  # fmt: skip
    if meta is None:
        return TensorRecord(key, kind, "?", [], [], 0, "?", False, 0, f"{addr:#x}", "0x0", "?", status="unreadable", note=error)
    rec = TensorRecord(
        key=key, kind=kind, dtype=meta.dtype, shape=list(meta.shape), stride=list(meta.stride),
        storage_offset=meta.storage_offset, device=meta.device, requires_grad=meta.requires_grad, nbytes=meta.nbytes,
        address=f"{addr:#x}", storage=f"{meta.storage:#x}", python_type=meta.python_type,
        data_address=f"{meta.data_ptr + meta.storage_offset * meta.itemsize:#x}",
    )  # fmt: skip
    if not meta.on_cpu and (reader is None or not reader.has_data(meta)):
        rec.status, rec.note = "on-device", TensorReader.missing_device_note(meta)
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
             tensor_types: set[int], limits: ModelLimits | None = None) -> tuple[ModelMR, list[TensorSlot]]:  # fmt: skip
    """The MR and one slot per state_dict entry; what could not be read is in `mr.problems`."""
    raddr = int(root.address, 16)
    problems: list[str] = []
    modules = [module_record(ip, path, node, tensor_types, problems) for path, node in index.walk(raddr)]
    slots: list[TensorSlot] = []
    first_key_of: dict[int, str] = {}
    view_of: dict[tuple, str] = {}
    tied: dict[str, list[str]] = {}
    storages: dict[int, list[str]] = {}
    for key, kind, addr in state_items(index, raddr, limits, problems):
        try:
            meta = reader.meta(addr)
            rec = tensor_record(key, kind, addr, meta, reader=reader)
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
        problems=problems,
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
    parts = [t for t in mr.tensors if t.kind == "inner"]  # a subclass's inner tensors (frontends/pytorch/subclasses)
    return {
        "modules": len(mr.modules),
        "state_dict_entries": len(mr.tensors) - len(parts),
        "inner_tensors": len(parts),
        "unique_tensors": len(unique),
        "parameters": len(params),
        "parameter_elements": sum(_numel(t) for t in params),
        "buffers": len([t for t in unique if t.kind == "buffer"]),
        "bytes": sum(t.nbytes for t in unique if t.status != "composite"),  # a composite's bytes are its parts'
        "dtypes": dict(sorted(Counter(t.dtype for t in unique).items())),
        "status": dict(sorted(Counter(t.status for t in mr.tensors).items())),
        "tied_groups": len(mr.tied),
    }


def _numel(t: TensorRecord) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n
