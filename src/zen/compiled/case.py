"""Case files for a decompiled TVM library, so `zen library`, `zen attribute` and `zen report` work on it.

Probing tells, per kernel, which operators it computes and with which attributes; this module turns
that into the MR `zen recover` writes for a PyTorch process: one module node per recovered operator,
typed as the torch.nn class that computes it (Conv2d, BatchNorm2d, Linear, ReLU, MaxPool2d, ...),
hyper-parameters under torch's attribute names and in its repr form (so MR similarity compares them
with recovered PyTorch cases), parameters named and shaped as PyTorch stores them (TVM's transposed
dense weights and [1,C,1,1] biases undone), data-flow edges from the kernel-call graph.

What the executable cannot tell is said, not invented:
* names: layers are named by class and order of execution (`conv2d3`), the original names are gone;
* code: a compiled library holds no Python code, so pr.json is empty and marked `"source": "compiled"`;
  attribution then scores the MR part only and says so (zen.attribute.algorithm);
* values TVM does not keep: BatchNorm's momentum and num_batches_tracked (PyTorch defaults / left out),
  whether a bias-free layer had `bias=False` (it did: there is no bias constant), how a square pooling
  size was spelled (`2` or `(2, 2)`: written as an int for pools, a tuple for adaptive pooling).

Weights: the package's own `weights.safetensors` stays keyed by kernel constant (model.py loads it);
the same tensors under the MR's PyTorch keys go to `state_dict.safetensors`, whose sha256 the manifest
records under `case.state_dict`. Nothing here imports torch or TVM.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from zen import __version__
from zen.compiled.static.graph import Graph
from zen.represent.case import MR_FILE, PR_FILE, UR_FILE, WEIGHTS, file_sha256
from zen.represent.mr import ModelMR, ModuleRecord, RootRecord, TensorRecord
from zen.represent.pr import PR_FORMAT, UR_FORMAT
from zen.represent.safetensors_io import Entry, SafetensorsWriter

STATE_DICT = "state_dict.safetensors"
CASE_FILES = (MR_FILE, PR_FILE, UR_FILE, STATE_DICT)
ROOT_CLASS = ("zen.compiled", "DecompiledModel")
ACT = "torch.nn.modules.activation"
# activation fn (zen.compiled.ops.ACTIVATIONS) -> (module, class, hyper-parameters as torch's defaults)
ACTIVATIONS = {
    "relu": (ACT, "ReLU", {"inplace": "False"}),
    "relu6": (ACT, "ReLU6", {"min_val": "0.0", "max_val": "6.0", "inplace": "False"}),
    "sigmoid": (ACT, "Sigmoid", {}), "tanh": (ACT, "Tanh", {}), "gelu": (ACT, "GELU", {"approximate": "'none'"}),
    "gelu_tanh": (ACT, "GELU", {"approximate": "'tanh'"}), "silu": (ACT, "SiLU", {"inplace": "False"}),
    "hardswish": (ACT, "Hardswish", {"inplace": "False"}), "hardsigmoid": (ACT, "Hardsigmoid", {"inplace": "False"}),
    "elu": (ACT, "ELU", {"alpha": "1.0", "inplace": "False"}),
    "softplus": (ACT, "Softplus", {"beta": "1.0", "threshold": "20.0"}),
    "mish": (ACT, "Mish", {"inplace": "False"}),
}  # fmt: skip
DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "int64": "I64", "int32": "I32", "int8": "I8",
          "uint8": "U8", "int16": "I16", "bool": "BOOL", "uint16": "BF16"}  # fmt: skip


class Detached:
    """A weight the executable takes as an input (`keep_params_as_input`): its shape is known, its data is not
    in the library. Behaves like the array it stands for as far as shapes go; recorded with status "missing"."""

    def __init__(self, shape: tuple[int, ...], dtype: str, name: str) -> None:
        self.shape, self.dtype, self.name = tuple(int(d) for d in shape), dtype, name
        self.ndim, self.size = len(self.shape), int(np.prod(self.shape, dtype=np.int64))
        self.itemsize = np.dtype(dtype).itemsize if dtype != "uint16" else 2
        self.nbytes = self.size * self.itemsize

    def reshape(self, *shape) -> Detached:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if list(shape) == [-1]:
            shape = (self.size,)
        return Detached(tuple(shape), self.dtype, self.name)

    def transpose(self, perm=None) -> Detached:
        perm = list(perm) if perm is not None else list(range(self.ndim))[::-1]
        return Detached(tuple(self.shape[i] for i in perm), self.dtype, self.name)

    @property
    def T(self) -> Detached:  # noqa: N802  (numpy's name)
        return self.transpose()


class _Builder:
    """Walks the probed kernels in call order and collects modules, tensors and data-flow edges."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.modules: list[ModuleRecord] = []
        self.tensors: dict[str, np.ndarray] = {}  # MR key -> array in PyTorch's layout
        self.notes: dict[str, str] = {}  # MR key -> where it came from
        self.counts: Counter[str] = Counter()
        self.edges: set[tuple[str, str]] = set()
        self.src: dict[int, frozenset[str]] = {}  # value id -> modules whose output it is (through passthroughs)
        self.pending: dict[int, ModuleRecord] = {}  # value id -> bias-free conv/linear whose output it is
        self.problems: list[str] = []
        # values computed from constants alone (unfused builds reshape a bias or transpose a dense weight in
        # their own kernel or a builtin): the array and where it came from
        self.derived: dict[int, tuple[np.ndarray, str]] = {}
        from zen.compiled.codegen import detached_inputs

        self.detached = {v for v in detached_inputs(graph) if graph.values[v].shape is not None}

    def module(self, mod: str, cls: str, hyper: dict[str, str], feeds: frozenset[str]) -> ModuleRecord:
        path = f"{cls.lower()}{self.counts[cls]}"
        self.counts[cls] += 1
        m = ModuleRecord(path=path, cls_module=mod, cls_qualname=cls, address="0x0", training=False,
                         hyperparameters={"training": "False", **hyper})  # fmt: skip
        self.modules.append(m)
        self.edges.update((s, path) for s in feeds)
        return m

    def tensor(self, m: ModuleRecord, name: str, a: np.ndarray, note: str, buffer: bool = False) -> None:
        (m.buffers if buffer else m.parameters).append(name)
        key = f"{m.path}.{name}"
        self.tensors[key] = a if isinstance(a, Detached) else np.ascontiguousarray(a)
        self.notes[key] = note

    def const(self, node, operand) -> tuple[np.ndarray | None, str]:
        """The constant an ["in", j] operand reads, with where it is in the constant pool."""
        if operand[0] != "in" or operand[1] >= len(node.inputs):
            return None, ""
        kind, v = node.inputs[operand[1]]
        if kind == "value" and v in self.detached:
            val = self.graph.values[v]
            return Detached(val.shape, val.dtype, val.input_name or f"x{v}"), f"input {val.input_name} of main (detached)"
        if kind == "value":
            return self.derived.get(v, (None, ""))
        c = self.graph.constants[v] if kind == "const" else None
        return (c, f"constant pool #{v}") if isinstance(c, np.ndarray) else (None, "")

    def from_constants(self, node, result: dict) -> bool:
        """A kernel or builtin that only reshapes or transposes one constant: remember its output, make no layer."""
        ins = [self.const(node, ["in", j]) for j, (k, _) in enumerate(node.inputs) if k in ("const", "value")]
        if not ins or ins[0][0] is None or len(node.outputs) != 1:
            return False
        a, where = ins[0]
        out = self.graph.values.get(node.outputs[0])
        if node.builtin:
            if node.kernel != "vm.builtin.reshape" or out is None or out.shape is None or int(np.prod(out.shape)) != a.size:
                return False
            self.derived[node.outputs[0]] = (a.reshape(out.shape), f"{where}, reshaped")
            return True
        steps = result.get("steps") or []
        if len(ins) != 1 or not steps or any(s["op"] not in ("transpose", "permute_dims", "reshape") for s in steps):
            return False
        for s in steps:
            a = a.transpose(s["attrs"]["perm"]) if s["op"] != "reshape" else a.reshape(s["attrs"]["shape"])
        self.derived[node.outputs[0]] = (a, f"{where}, {'transposed' if steps[0]['op'] != 'reshape' else 'reshaped'}")
        return True

    def kernel(self, node, result: dict) -> None:
        for oi, steps in enumerate(result.get("per_output", [result.get("steps", [])])):
            feeds = self._walk(node, steps)
            if oi < len(node.outputs):
                self.src[node.outputs[oi]] = feeds

    def _feeds(self, node, operand, cur: frozenset[str], saved: dict) -> frozenset[str]:
        if operand[0] == "cur":
            return cur
        if operand[0] == "saved":
            return saved.get(operand[1], frozenset())
        kind, v = node.inputs[operand[1]] if operand[1] < len(node.inputs) else ("imm", 0)
        return self.src.get(v, frozenset()) if kind == "value" else frozenset()

    def _walk(self, node, steps: list[dict]) -> frozenset[str]:
        cur: frozenset[str] = frozenset()
        saved: dict[int, frozenset[str]] = {}
        last: ModuleRecord | None = None  # conv/linear just made by the previous step, still without bias
        for step in steps:
            if "save" in step:
                saved[step["save"]] = cur
            op, attrs, opd = step["op"], step.get("attrs", {}), step.get("operands", [])
            data = [o for o in opd if self.const(node, o)[0] is None]
            feeds = frozenset().union(*(self._feeds(node, o, cur, saved) for o in data)) if data else frozenset()
            if op == "add" and len(opd) == 2:
                target = last
                if target is None and len(data) == 1 and data[0][0] == "in":
                    kind, v = node.inputs[data[0][1]]
                    target = self.pending.pop(v, None) if kind == "value" else None
                consts = [self.const(node, o) for o in opd if self.const(node, o)[0] is not None]
                if target is not None and len(consts) == 1 and self._bias(target, *consts[0]):
                    cur, last = frozenset({target.path}), None
                    continue
            made = self._operator(node, op, attrs, opd, feeds)
            last = made if made is not None and made.cls_qualname in ("Conv1d", "Conv2d", "Linear") else None
            cur = frozenset({made.path}) if made is not None else feeds
        if last is not None and len(steps) and node.outputs:
            self.pending[node.outputs[0]] = last
        return cur

    def _bias(self, m: ModuleRecord, c: np.ndarray, where: str) -> bool:
        out = int(m.hyperparameters.get("out_channels", m.hyperparameters.get("out_features", "0")))
        if c.size != out or sum(d != 1 for d in c.shape) > 1:
            return False
        self.tensor(m, "bias", c.reshape(out), f"{where}, stored {list(c.shape)}")
        return True

    def _operator(self, node, op: str, a: dict, opd: list, feeds: frozenset[str]) -> ModuleRecord | None:
        consts = [self.const(node, o) for o in opd]
        if op in ("conv1d", "conv2d"):
            w, where = consts[1] if len(consts) > 1 else (None, "")
            if w is None:
                return None
            nd = 1 if op == "conv1d" else 2
            t = lambda v: repr(tuple([v] * nd))  # noqa: E731
            hyper = {"in_channels": repr(int(w.shape[1] * a["groups"])), "out_channels": repr(int(w.shape[0])),
                     "kernel_size": repr(tuple(int(k) for k in w.shape[2:])), "stride": t(a["stride"]),
                     "padding": t(a["padding"]), "dilation": t(a["dilation"]), "transposed": "False",
                     "output_padding": t(0), "groups": repr(a["groups"]), "padding_mode": "'zeros'"}  # fmt: skip
            m = self.module("torch.nn.modules.conv", f"Conv{nd}d", hyper, feeds)
            self.tensor(m, "weight", w, where)
            return m
        if op in ("dense", "matmul"):
            w, where = consts[1] if len(consts) > 1 else (None, "")
            if w is None or w.ndim != 2:
                return None  # matmul of two activations (attention): no layer
            w, note = (w, where) if op == "dense" else (w.T, f"{where}; used transposed by matmul")
            m = self.module(
                "torch.nn.modules.linear",
                "Linear",
                {"in_features": repr(int(w.shape[1])), "out_features": repr(int(w.shape[0]))},
                feeds,
            )
            self.tensor(m, "weight", w, note)
            return m
        if op == "batch_norm" and len(consts) == 5 and all(c is not None for c, _ in consts[1:]):
            (g, wg), (b, wb), (mu, wm), (var, wv) = consts[1:]
            x = self.graph.values.get(node.inputs[0][1]) if node.inputs and node.inputs[0][0] == "value" else None
            nd = {3: "1d", 4: "2d", 5: "3d"}.get(len(x.shape) if x is not None and x.shape else 4, "2d")
            hyper = {"num_features": repr(int(g.size)), "eps": repr(float(a["eps"])), "momentum": "0.1",
                     "affine": "True", "track_running_stats": "True"}  # fmt: skip
            m = self.module("torch.nn.modules.batchnorm", f"BatchNorm{nd}", hyper, feeds)
            for name, arr, where, buf in (("weight", g, wg, False), ("bias", b, wb, False),
                                          ("running_mean", mu, wm, True), ("running_var", var, wv, True)):  # fmt: skip
                self.tensor(m, name, arr.reshape(-1), where, buffer=buf)
            return m
        if op == "layer_norm" and len(consts) == 3 and consts[1][0] is not None:
            (w, ww), (b, wb) = consts[1], consts[2]
            hyper = {"normalized_shape": repr(tuple(int(d) for d in w.shape)), "eps": repr(float(a["eps"])),
                     "elementwise_affine": "True"}  # fmt: skip
            m = self.module("torch.nn.modules.normalization", "LayerNorm", hyper, feeds)
            self.tensor(m, "weight", w, ww)
            if b is not None:
                self.tensor(m, "bias", b, wb)
            return m
        if op == "take" and consts and consts[0][0] is not None and consts[0][0].ndim == 2:
            table, where = consts[0]
            hyper = {"num_embeddings": repr(int(table.shape[0])), "embedding_dim": repr(int(table.shape[1])),
                     "padding_idx": "None", "max_norm": "None", "norm_type": "2.0", "scale_grad_by_freq": "False",
                     "sparse": "False"}  # fmt: skip
            m = self.module("torch.nn.modules.sparse", "Embedding", hyper, feeds)
            self.tensor(m, "weight", table, where)
            return m
        if op == "act" and a.get("fn") in ACTIVATIONS:
            mod, cls, hyper = ACTIVATIONS[a["fn"]]
            return self.module(mod, cls, dict(hyper), feeds)
        if op == "act" and a.get("fn") == "leaky_relu":
            return self.module(ACT, "LeakyReLU", {"negative_slope": repr(float(a.get("slope", 0.01))), "inplace": "False"}, feeds)
        if op in ("max_pool2d", "max_pool1d"):
            hyper = {"kernel_size": repr(a["kernel"]), "stride": repr(a["stride"]), "padding": repr(a["padding"]),
                     "dilation": "1", "return_indices": "False", "ceil_mode": repr(bool(a["ceil"]))}  # fmt: skip
            return self.module("torch.nn.modules.pooling", f"MaxPool{op[-2:]}", hyper, feeds)
        if op in ("avg_pool2d", "avg_pool1d"):
            one = op.endswith("1d")
            f = (lambda v: repr((v,))) if one else repr  # AvgPool1d stores 1-tuples
            hyper = {
                "kernel_size": f(a["kernel"]),
                "stride": f(a["stride"]),
                "padding": f(a["padding"]),
                "ceil_mode": repr(bool(a["ceil"])),
                "count_include_pad": repr(bool(a["count_include_pad"])),
            }
            if not one:
                hyper["divisor_override"] = "None"
            return self.module("torch.nn.modules.pooling", f"AvgPool{op[-2:]}", hyper, feeds)
        if op == "adaptive_avg_pool2d":
            return self.module("torch.nn.modules.pooling", "AdaptiveAvgPool2d", {"output_size": repr(tuple(a["size"]))}, feeds)
        if op in ("softmax", "log_softmax"):
            return self.module(ACT, "Softmax" if op == "softmax" else "LogSoftmax", {"dim": repr(a["dim"])}, feeds)
        return None


def build_mr(graph: Graph, results: dict[int, dict]) -> tuple[ModelMR, dict[str, np.ndarray]]:
    """The MR of the probed graph and its tensors under the MR's keys (PyTorch layout)."""
    b = _Builder(graph)
    for n in graph.nodes:
        if b.from_constants(n, results.get(n.id) or {}):
            continue
        if n.builtin:
            for o in n.outputs:  # reshapes and tuple plumbing pass their input's producers on
                b.src[o] = frozenset().union(*(b.src.get(v, frozenset()) for k, v in n.inputs if k == "value"))
            continue
        r = results.get(n.id)
        if r is None or r.get("status") != "ok":
            b.problems.append(f"kernel call {n.id} ({n.kernel}) was not reproduced: its operators are missing from the MR")
            continue
        b.kernel(n, r)
    tensors = [_record(k, b.tensors[k], b.notes[k], any(k == f"{m.path}.{p}" for m in b.modules for p in m.buffers))
               for k in b.tensors]  # fmt: skip
    root = ModuleRecord(path="", cls_module=ROOT_CLASS[0], cls_qualname=ROOT_CLASS[1], address="0x0", training=False,
                        hyperparameters={"training": "False"}, children=[m.path for m in b.modules])  # fmt: skip
    modules = [root, *b.modules]
    elements = sum(int(a.size) for k, a in b.tensors.items() if not _is_buffer(k, b.modules))
    rr = RootRecord("0x0", ".".join(ROOT_CLASS), len(modules), sum(len(m.parameters) for m in modules), elements,
                    1 if b.modules else 0)  # fmt: skip
    mr = ModelMR(root=rr, roots=[rr], modules=modules, tensors=tensors,
                 layer_types=dict(sorted(Counter(m.cls for m in modules).items())), problems=b.problems)  # fmt: skip
    mr.graph = {"nodes": [m.path for m in modules], "hierarchy": [["", m.path, i] for i, m in enumerate(b.modules)],
                "dataflow": sorted([list(e) for e in b.edges]), "dataflow_method": "tvm-bytecode"}  # fmt: skip
    mr.summary = _summary(mr, b.tensors)
    return mr, b.tensors


def _is_buffer(key: str, modules: list[ModuleRecord]) -> bool:
    path, _, name = key.rpartition(".")
    return any(m.path == path and name in m.buffers for m in modules)


def _record(key: str, a: np.ndarray | Detached, note: str, buffer: bool) -> TensorRecord:
    if isinstance(a, Detached):
        stride = [int(np.prod(a.shape[i + 1 :], dtype=np.int64)) for i in range(a.ndim)]
        return TensorRecord(key=key, kind="buffer" if buffer else "parameter", dtype=a.dtype, shape=list(a.shape),
                            stride=stride, storage_offset=0, device="cpu", requires_grad=False, nbytes=a.nbytes,
                            address="0x0", storage="0x0", python_type="torch.nn.parameter.Parameter", status="missing",
                            note=f"{note}: not in the executable; the package's load(params=...) takes it as {a.name}",
                            )  # fmt: skip
    stride = [int(s // a.itemsize) for s in a.strides] if a.size else [1] * a.ndim
    return TensorRecord(key=key, kind="buffer" if buffer else "parameter", dtype=str(a.dtype), shape=list(a.shape),
                        stride=stride, storage_offset=0, device="cpu", requires_grad=False, nbytes=int(a.nbytes),
                        address="0x0", storage="0x0", python_type="torch.Tensor" if buffer else "torch.nn.parameter.Parameter",
                        sha256=hashlib.sha256(a.tobytes()).hexdigest(), note=note)  # fmt: skip


def _summary(mr: ModelMR, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    params = [t for t in mr.tensors if t.kind == "parameter"]
    return {
        "modules": len(mr.modules), "state_dict_entries": len(mr.tensors), "unique_tensors": len(mr.tensors),
        "parameters": len(params), "parameter_elements": sum(int(tensors[t.key].size) for t in params),
        "buffers": len(mr.tensors) - len(params), "bytes": sum(t.nbytes for t in mr.tensors),
        "dtypes": dict(sorted(Counter(t.dtype for t in mr.tensors).items())),
        "status": dict(sorted(Counter(t.status for t in mr.tensors).items())), "tied_groups": 0, "source": "compiled",
        "layer_types": dict(sorted(Counter(m.cls_qualname for m in mr.modules[1:]).items())),
    }  # fmt: skip


def empty_pr(library: str) -> dict[str, Any]:
    """pr.json of a compiled model: no code objects (there is no Python code in an executable), marked as such."""
    why = "a TVM-compiled library holds machine code, not Python code: there is no programmatic representation"
    return {"format": PR_FORMAT, "kind": "zen-pr", "codes": [], "classes": [], "modules": {}, "dependencies": {},
            "counts": {"system": {}, "model": {}}, "context": {"source": "compiled", "executable": library, "note": why},
            "system_codes": [], "exclusion": [], "module_globals": {}, "listing_version": 1}  # fmt: skip


def write_case(out: Path, graph: Graph, results: dict[int, dict], manifest: dict, library: Path) -> None:
    """Write mr.json, pr.json, ur.json and state_dict.safetensors into `out`; add the case fields to `manifest`
    (kept alongside decompile's own: framework, evidence image/sha256, tool version, file hashes)."""
    mr, tensors = build_mr(graph, results)
    missing = [k for k, a in tensors.items() if isinstance(a, Detached)]
    if missing:
        mr.problems.append(
            f"{len(missing)} weights are inputs of the executable, not in it (detached): "
            f"{', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''}; state_dict.safetensors lacks them"
        )
    tensors = {k: a for k, a in tensors.items() if not isinstance(a, Detached)}
    (out / MR_FILE).write_text(mr.dumps())
    (out / PR_FILE).write_text(json.dumps(empty_pr(library.name), indent=1) + "\n")
    ur = {
        "format": UR_FORMAT,
        "kind": "zen-ur",
        "shared_code_objects": 0,
        "nodes": [{"path": m.path, "cls": m.cls, "classes": [], "methods": [], "owned": [], "used": []} for m in mr.modules],
    }
    (out / UR_FILE).write_text(json.dumps(ur, indent=1) + "\n")
    entries = [Entry(k, DTYPES[str(a.dtype)], tuple(a.shape), a.nbytes) for k, a in tensors.items()]
    w = SafetensorsWriter(out / STATE_DICT, entries, {"format": "pt", "producer": "zen decompile (PyTorch names)"})
    try:
        for k, a in tensors.items():
            w.write(k, [a.tobytes()])
    finally:
        w.close()
    files = {n: file_sha256(out / n) for n in (MR_FILE, PR_FILE, UR_FILE, WEIGHTS) if (out / n).is_file()}
    ev = manifest["evidence"]
    ev.update(image=str(library), producer="tvm export_library",
              notes=["model decompiled from a TVM-compiled executable (relax VM); no Python process was imaged"])  # fmt: skip
    manifest.update(
        kind="zen-case", tool={"name": "zen", "version": __version__, "command": "decompile"}, framework="tvm",
        python={"version": "none (compiled executable)", "how": None}, torch={"version": None}, profiles={},
        model={"root": "0x0", "class": mr.root.cls, "selected_by": "the executable's main function"},
        status="complete" if not mr.problems else "partial", files=files,
        case={"source": "compiled", "modules": len(mr.modules) - 1, "layer_types": mr.summary["layer_types"],
              "state_dict": {"file": STATE_DICT, "sha256": file_sha256(out / STATE_DICT), "keys": len(tensors)},
              "problems": mr.problems},
    )  # fmt: skip
