"""Write the rebuilt PyTorch package: readable `model.py`, `weights.safetensors`, `__init__.py`.

The package depends on torch and safetensors only (not on zen or TVM), so an investigator can read
and run it anywhere. Each kernel of the executable becomes a commented block of functional
PyTorch calls, built from the expressions probing verified against that kernel; the constants it
reads become parameters named after the operator and role (`k0_conv2d_weight`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from zen.compiled import ops
from zen.compiled.errors import ExecutableError
from zen.compiled.static.graph import Graph
from zen.represent.safetensors_io import Entry, SafetensorsWriter

ROLES = {
    "conv1d": ["weight"],
    "conv2d": ["weight"],
    "matmul": ["weight"],
    "dense": ["weight"],
    "batch_norm": ["gamma", "beta", "running_mean", "running_var"],
    "layer_norm": ["weight", "bias"],
    "take": ["table", "indices"],
    "add": ["bias"],
    "multiply": ["scale"],
}
ST_DTYPES = {
    "float32": "F32",
    "float64": "F64",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "bool": "BOOL",
    "uint16": "BF16",
}

INIT = '''"""Model decompiled by zen {version} from the TVM library {library} (sha256 {sha}).

`load()` rebuilds it as a PyTorch nn.Module (eval mode) from model.py and weights.safetensors.
Importing this package runs nothing from the library; model.py is plain PyTorch written by zen.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(*, eval_mode=True, params=None):
    """The rebuilt model (torch.nn.Module) with the weights read from the executable's constant pool.

    `params` (a safetensors file or a dict name -> tensor) supplies the weights the executable takes
    as inputs (model.DETACHED; compiled with keep_params_as_input), which it does not contain."""
    import torch
    from safetensors.torch import load_file

    from .model import DETACHED, DecompiledModel

    model = DecompiledModel()
    state = load_file(str(HERE / "weights.safetensors"))
    if DETACHED:
        names = ", ".join(n for n, _, _ in DETACHED)
        if params is None:
            raise ValueError(f"the executable does not contain these weights; pass params=FILE or a dict with: {{names}}")
        given = load_file(str(params)) if isinstance(params, (str, Path)) else dict(params)
        missing = [n for n, _, _ in DETACHED if n not in given]
        if missing:
            raise ValueError(f"params lacks {{', '.join(missing)}} (needed: {{names}})")
        for n, shape, dtype in DETACHED:
            state[n] = torch.as_tensor(given[n]).to(getattr(torch, dtype)).reshape(shape)
    model.load_state_dict(state)
    return model.eval() if eval_mode else model


def example_inputs():
    """Random inputs of the shapes and dtypes the executable was compiled for."""
    import torch

    from .model import INPUTS

    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(s, generator=gen).to(getattr(torch, d)) for s, d in INPUTS)
'''


def _ident(s: str) -> str:
    s = re.sub(r"\W", "_", s)
    return s if s and not s[0].isdigit() else "_" + s


def generate(graph: Graph, results: dict[int, dict]) -> tuple[str, dict[str, np.ndarray]]:
    """(source of model.py, parameter name -> array) for a fully resolved graph."""
    names: dict[int, str] = {}  # constant index -> parameter name
    tensors: dict[str, np.ndarray] = {}
    detached = detached_inputs(graph)
    var = {v: ("self." if v in detached else "") + _ident(graph.values[v].input_name or f"x{v}") for v in graph.inputs}
    data_inputs = [v for v in graph.inputs if v not in detached]
    body: list[str] = []

    def const_name(idx: int, hint: str) -> str:
        if idx not in names:
            name = hint
            while name in tensors:
                name += "_"
            names[idx] = name
            tensors[name] = np.array(graph.constants[idx], order="C")
        return "self." + names[idx]

    def operand(ref) -> str:
        kind, v = ref
        if kind == "value":
            return var[v]
        return const_name(v, f"c{v}")

    for n in graph.nodes:
        out = [f"v{o}" for o in n.outputs]
        for o in n.outputs:
            var[o] = f"v{o}"
        if n.builtin:
            if n.kernel == "vm.builtin.reshape" and n.outputs:
                shape = list(graph.values[n.outputs[0]].shape or ())
                body.append(f"        {out[0]} = torch.reshape({operand(n.inputs[0])}, {shape})")
            continue
        res = results[n.id]
        body.append(f"        # kernel {n.kernel}")
        args = list(n.inputs)
        per_output = res.get("per_output", [res["steps"]])
        used_later = {v for m in graph.nodes[n.id + 1 :] for kind, v in m.inputs if kind == "value"} | set(graph.outputs)
        for o in n.outputs[len(per_output) :]:
            if o in used_later:
                raise ExecutableError(f"kernel {n.kernel}: output {n.outputs.index(o)} is used but was not reproduced")
        for oi, steps in enumerate(per_output):
            last = None
            for step in steps:
                if "save" in step:  # a second branch starts: keep the running value for the op that rejoins it
                    body.append(f"        s{step['save']} = h")
                argn = []
                for j, o in enumerate(step["operands"]):
                    if o[0] in ("cur", "saved"):
                        argn.append("h" if o[0] == "cur" else f"s{o[1]}")
                        continue
                    ref = args[o[1]]
                    if ref[0] == "const":
                        roles = ROLES.get(step["op"], [])
                        role_i = j if step["op"] == "take" else j - 1
                        role = roles[role_i] if 0 <= role_i < len(roles) else "const"
                        argn.append(const_name(ref[1], f"k{n.id}_{step['op']}_{role}"))
                    else:
                        argn.append(operand(ref))
                attrs = step["attrs"]
                if step["op"] == "gather":
                    attrs = dict(attrs)
                    if "index" in attrs:
                        attrs["index_name"] = "self." + _add(
                            tensors, f"k{n.id}_gather_index", np.asarray(attrs["index"], dtype=np.int64)
                        )
                    if isinstance(attrs.get("shift"), list):
                        attrs["shift_name"] = "self." + _add(
                            tensors, f"k{n.id}_gather_shift", np.asarray(attrs["shift"], dtype=np.float32).reshape(attrs["shape"])
                        )
                if step["op"] == "constant":  # computed from constants only (see probe._fold): kept as a buffer
                    attrs = dict(
                        attrs,
                        name="self."
                        + _add(
                            tensors,
                            f"k{n.id}_folded{attrs['output'] or ''}",
                            np.array(res["folded_values"][attrs["output"]], order="C"),
                        ),
                    )
                expr = ops.expression(step["op"], attrs, argn)
                body.append(f"        h = {expr}")
                last = "h"
            body.append(f"        {out[oi]} = {last}")
    outs = [var[o] for o in graph.outputs]
    ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
    params = [
        f'        self.register_parameter("{k}", nn.Parameter(torch.empty({list(a.shape)}, dtype=torch.{_torch_dtype(a)}), '
        f"requires_grad=False))"
        if a.dtype.kind == "f"
        else f'        self.register_buffer("{k}", torch.empty({list(a.shape)}, dtype=torch.{_torch_dtype(a)}))'
        for k, a in tensors.items()
    ]
    inputs = [(list(graph.values[i].shape or ()), graph.values[i].dtype) for i in data_inputs]
    det = [(_ident(graph.values[i].input_name), list(graph.values[i].shape or ()), graph.values[i].dtype) for i in detached]
    vm_inputs = [(_ident(graph.values[i].input_name or f"x{i}"), i in detached) for i in graph.inputs]
    params += [
        f'        self.register_parameter("{k}", nn.Parameter(torch.empty({shape}, dtype=torch.{dt}), requires_grad=False))'
        for k, shape, dt in det
    ]
    src = "\n".join(
        [
            '"""Generated by zen decompile: the computation of a TVM-compiled model as PyTorch code.',
            "",
            "One block per kernel of the executable, in the order the VM bytecode calls them. Parameters hold",
            "the constants of the executable's constant pool, named by kernel number, operator and role.",
            '"""',
            "",
            "import torch",
            "import torch.nn.functional as F",
            "from torch import nn",
            "",
            f"INPUTS = {inputs!r}  # shape and dtype of each forward() argument",
            f"DETACHED = {det!r}  # weights the executable takes as inputs: load(params=...) supplies them",
            f"VM_INPUTS = {vm_inputs!r}  # the executable's main() arguments in order (name, detached)",
            "",
            "",
            "class DecompiledModel(nn.Module):",
            "    def __init__(self):",
            "        super().__init__()",
            *(params or ["        pass"]),
            "",
            f"    def forward(self, {', '.join(var[i] for i in data_inputs)}):",
            *body,
            f"        return {ret}",
            "",
        ]
    )
    return src, tensors


def detached_inputs(graph: Graph) -> list[int]:
    """Graph inputs that are weights passed to the executable (`keep_params_as_input`): those whose
    shape the bytecode does not check, as long as at least one input is checked (the data)."""
    checked = [v for v in graph.inputs if graph.values[v].checked]
    return [v for v in graph.inputs if checked and not graph.values[v].checked]


def _add(tensors: dict[str, np.ndarray], name: str, a: np.ndarray) -> str:
    while name in tensors:
        name += "_"
    tensors[name] = a
    return name


def _torch_dtype(a: np.ndarray) -> str:
    return {
        "float32": "float32",
        "float64": "float64",
        "float16": "float16",
        "int64": "int64",
        "int32": "int32",
        "int8": "int8",
        "uint8": "uint8",
        "int16": "int16",
        "bool": "bool",
        "uint16": "bfloat16",
    }[str(a.dtype)]


def write_package(out: Path, graph: Graph, results: dict[int, dict], meta: dict) -> Path:
    """Write the importable package DIR (model.py, weights.safetensors, __init__.py)."""
    src, tensors = generate(graph, results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.py").write_text(src)
    entries = [Entry(k, ST_DTYPES[str(a.dtype)], tuple(a.shape), a.nbytes) for k, a in tensors.items()]
    w = SafetensorsWriter(out / "weights.safetensors", entries, {"format": "pt", "producer": "zen decompile"})
    try:
        for k, a in tensors.items():
            w.write(k, [a.tobytes()])
    finally:
        w.close()
    (out / "__init__.py").write_text(INIT.format(version=meta["zen"], library=json.dumps(meta["library"]), sha=meta["sha256"]))
    return out
