"""Dynamic probing, run as a child process: call each kernel of a TVM library on chosen inputs and
find the PyTorch computation that reproduces it.

    python -m zen.compiled.kernels.probe < request.json > result.json

The static graph says which tensors a kernel reads and writes; its name (when intact) lists the
relax ops fused into it. What neither stores (stride, padding, dilation, pooling window, reduced
axes, the activation actually computed, normalisation epsilon) is recovered here by measurement:
the kernel runs through the TVM runtime, candidate PyTorch expressions (zen.compiled.ops) run
on the same inputs, and the first candidate that matches within float tolerance is kept. Epsilons
are then re-measured on inputs made so small that epsilon dominates. This module imports TVM and
torch and runs code from the library, which is why zen only ever runs it in a child process.

The answer depends on the library and the request alone (its seed and its search limits,
zen.compiled.kernels.budget), never on the machine's load: searches are bounded by work, not time, and TVM
and torch compute on one thread, so no reduction is split differently on a machine with more cores.
The search itself is zen.compiled.kernels.search; this module runs the kernels and answers the parent.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from zen.compiled import ops
from zen.compiled.kernels.budget import SearchLimits
from zen.compiled.kernels.search import search
from zen.compiled.kernels.watchdog import announce, watched

THREADS = 1  # TVM's and torch's: results (and the errors recorded) must not follow the core count
DEVICE: list = [None]  # where the kernels' tensors are made: None (the CPU here), or the emulated runtime's CPU
CALL_LIMIT: list = [None]  # seconds one kernel call may take (zen.compiled.kernels.watchdog), from the request


class Kernel:
    """One kernel call: its TVM function, probe inputs, and the reference outputs it computed."""

    def __init__(
        self, tvm, func, spec: dict, consts: list, rng: np.random.Generator, given: list[np.ndarray | None] | None = None
    ) -> None:
        import torch

        self.tvm, self.func, self.spec, self.torch = tvm, func, spec, torch
        self.inputs = []
        for j, inp in enumerate(spec["inputs"]):
            if inp["kind"] == "const":
                self.inputs.append(np.array(consts[inp["const"]], order="C"))  # keeps 0-d scalars 0-d
            elif given is not None and given[j] is not None:
                self.inputs.append(np.array(given[j], order="C"))
            else:
                self.inputs.append(self._random(inp, rng))
        self.outputs = self.run(self.inputs)

    def _random(self, inp: dict, rng: np.random.Generator) -> np.ndarray:
        dt = np.dtype(inp["dtype"] if inp["dtype"] != "bool" else "bool")
        if dt.kind in "iu":
            hi = max(int(inp.get("index_bound") or 2), 1)
            return rng.integers(0, hi, size=inp["shape"]).astype(dt)
        if dt.kind == "b":
            return rng.random(inp["shape"]) < 0.5
        return (rng.standard_normal(inp["shape"]) * 2).astype(dt)

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        tvm = self.tvm
        args = [tvm.runtime.tensor(np.array(a, order="C"), device=DEVICE[0]) for a in arrays]
        outs = [tvm.runtime.tensor(np.zeros(o["shape"], dtype=o["dtype"]), device=DEVICE[0]) for o in self.spec["outputs"]]
        with watched(CALL_LIMIT[0]):
            self.func(*args, *outs)
        return [o.numpy() for o in outs]


def _constant_inputs(spec: dict, consts: list, known: dict[int, np.ndarray]) -> list[np.ndarray | None] | None:
    """The real values of a kernel's inputs when every one is a constant or computed from constants only
    (position ids sliced from a buffer, a mask built from an all-ones tensor); None otherwise."""
    vals = []
    for inp in spec["inputs"]:
        if inp["kind"] == "const":
            vals.append(None)
            continue
        kind, v = inp.get("root") or ["value", inp.get("value")]
        src = consts[v] if kind == "const" else known.get(v)
        if not isinstance(src, np.ndarray) or src.size != int(np.prod(inp["shape"])) or str(src.dtype) != inp["dtype"]:
            return None
        vals.append(src.reshape(inp["shape"]))
    return vals if spec["inputs"] else None


def _fold(k: Kernel, spec: dict, fold_dir: str) -> dict:
    """A kernel whose inputs never change computes the same tensors on every call: keep those (the
    rebuilt model holds them as buffers) when no operator reading reproduced it."""
    outs = []
    for o, a in enumerate(k.outputs):
        np.save(os.path.join(fold_dir, f"n{int(spec['node'])}_{o}.npy"), a, allow_pickle=False)
        outs.append({"shape": list(a.shape), "dtype": str(a.dtype)})
    steps = [[("constant", {"output": o, **d}, [], None)] for o, d in enumerate(outs)]
    res = {"status": "ok", "steps": steps[0], "error": 0.0, "folded": outs, "method": "constant folding"}
    if len(steps) > 1:
        res["per_output"] = steps
    return res


def _steps_json(steps: list) -> list[dict]:
    return [
        {"op": op, "attrs": a, "operands": [list(o) for o in opd], **({"save": sv} if sv is not None else {})}
        for op, a, opd, sv in steps
    ]


def main() -> int:
    # native code (LAPACK's DLASCL warnings, TVM's logging) may write to fd 1: keep the answer's channel
    # apart by moving fd 1 to stderr for everything but the final JSON
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.environ["TVM_NUM_THREADS"] = str(THREADS)  # read when TVM's thread pool starts
    import torch
    import tvm

    torch.set_num_threads(THREADS)

    from zen.compiled.static.load import load_executable

    req = json.load(sys.stdin)
    limits = SearchLimits.from_json(req.get("limits"))
    from zen.compiled.emulation import load_library

    lib, DEVICE[0] = load_library(tvm, req["library"])  # here, or in the emulated runtime (zen.compiled.emulation)
    consts = load_executable(req["library"])[1].constants
    rng = np.random.default_rng(req.get("seed", 0))
    CALL_LIMIT[0] = req.get("call_limit")
    known: dict[int, np.ndarray] = {}  # outputs of kernels whose inputs are all constants
    results = []
    for spec in req["kernels"]:
        t0 = time.monotonic()
        announce(f"kernel {str(spec['kernel'])[:120]} (call {spec['node']})")
        try:
            func = lib.get_function(spec["kernel"], query_imports=True)
        except (AttributeError, RuntimeError) as exc:
            results.append({"node": spec["node"], "status": "unresolved", "reason": f"kernel not loadable: {exc}"})
            continue
        given = _constant_inputs(spec, consts, known)
        try:
            k = Kernel(tvm, func, spec, consts, rng, given)
            tokens = ops.split_kernel_name(spec["kernel"]) if req.get("use_names", True) else None
            res = search(k, tokens, limits)
            if given is not None:  # computed from constants only: its outputs are constants too
                for v, o in zip(spec.get("output_values", []), k.outputs):
                    known[v] = o
                if res["status"] != "ok" and req.get("fold_dir"):
                    res = _fold(k, spec, req["fold_dir"])
        except Exception as exc:  # a kernel that crashes on probe inputs must not stop the others
            res = {"status": "unresolved", "reason": f"{type(exc).__name__}: {exc}"[:300]}
        res["node"] = spec["node"]
        res["seconds"] = round(time.monotonic() - t0, 3)
        if "steps" in res:
            res["steps"] = _steps_json(res["steps"])
        if "per_output" in res:
            res["per_output"] = [_steps_json(s) for s in res["per_output"]]
        results.append(res)
    json.dump({"results": results}, answer)
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
