"""Parent side of probing: build the request from the static graph, run the child, read its answer.

The child (`zen.compiled.kernels.probe`, isolated: see zen.runtime.childproc) imports TVM and runs the library's
kernels; zen's own process never does. Its interpreter defaults to the one running zen, and can be another Python
environment that has TVM and torch (ZEN_TVM_PYTHON).

What the child finds is bounded by work (zen.compiled.kernels.budget, sent in the request); the wall-clock
`timeout` on each child is only a safety net against one that never ends, and running out of it stops
zen with an error naming it (TimeLimitExceeded, exit 7), never with a different answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from zen.compiled.errors import ExecutableError
from zen.compiled.kernels.budget import TIMEOUT, SearchLimits
from zen.compiled.kernels.watchdog import call_limit, crashed_call, hung_call
from zen.compiled.static.graph import Graph
from zen.runtime import childproc
from zen.runtime.errors import TimeLimitExceeded


def tvm_python() -> str:
    return os.environ.get("ZEN_TVM_PYTHON") or sys.executable


# Thread pools of the native libraries a probing or checking child loads (OpenMP for torch, OpenBLAS/MKL
# for numpy's fits, TVM's own): one thread each, set before they start, so that no reduction is split
# by the core count of the machine and no spinning pool waits on a descheduled thread under load.
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TVM_NUM_THREADS": "1"}


def child_env() -> dict[str, str]:
    """The environment of a child that runs the library's kernels: this one, single-threaded."""
    return {**os.environ, **SINGLE_THREADED}


def tvm_available(python: str | None = None, timeout: float = TIMEOUT) -> bool:
    """Whether the probing interpreter can import tvm and torch (checked in a child, never here). A child
    still importing after `timeout` is an error, not "no TVM": a slow machine must not change the answer."""
    python = python or tvm_python()
    try:
        proc = childproc.run(childproc.code_argv("import tvm, torch", python=python), capture_output=True, timeout=timeout)
    except OSError:
        return False
    except subprocess.TimeoutExpired:
        raise timed_out(f"importing tvm and torch in {python}", timeout) from None
    return proc.returncode == 0


def timed_out(what: str, timeout: float) -> TimeLimitExceeded:
    return TimeLimitExceeded(
        f"{what} did not finish within the safety limit of {timeout:.0f} s (--timeout)",
        "raise it with `zen decompile --timeout SECONDS` if the machine is very slow or busy",
    )


def hung_error(what: str, how: str, timeout: float) -> TimeLimitExceeded:
    """A call of the library's code that never returned (zen.compiled.kernels.watchdog)."""
    return TimeLimitExceeded(
        f"{what} did not return within {call_limit(timeout):.0f} s when {how}: its code loops or blocks, as a damaged "
        "or crafted library's may",
        f"a single call may take a tenth of --timeout ({timeout:.0f} s): raise it if the machine is only very slow or busy",
    )


def request(graph: Graph, library: Path, use_names: bool = True, limits: SearchLimits | None = None) -> dict:
    """One probe entry per kernel call: its inputs (values get random data, constants the real weights)."""
    kernels = []
    roots: dict[int, list] = {}  # value -> what it reshapes: ["const", c] or ["value", kernel output]
    for n in graph.nodes:
        if n.builtin:
            if n.kernel == "vm.builtin.reshape" and n.inputs and n.outputs:
                kind, v = n.inputs[0]
                if kind == "const" and isinstance(graph.constants[v], np.ndarray):
                    roots[n.outputs[0]] = ["const", v]
                elif kind == "value":
                    roots[n.outputs[0]] = roots.get(v, ["value", v])
            continue
        inputs = []
        bound = None
        for kind, v in n.inputs:
            if kind == "const" and isinstance(graph.constants[v], np.ndarray):
                c = graph.constants[v]
                inputs.append({"kind": "const", "const": v, "shape": list(c.shape), "dtype": str(c.dtype)})
                if c.ndim == 2 and c.dtype.kind == "f" and bound is None:
                    bound = c.shape[0]
            elif kind == "value":
                val = graph.values[v]
                if val.shape is None:
                    raise ExecutableError(
                        f"kernel {n.kernel}: input v{v} has no static shape", "models with dynamic shapes are not supported yet"
                    )
                inputs.append(
                    {
                        "kind": "value",
                        "value": v,
                        "shape": list(val.shape),
                        "dtype": val.dtype,
                        "root": roots.get(v, ["value", v]),
                    }
                )
            else:
                raise ExecutableError(f"kernel {n.kernel} takes a {kind} argument, which zen cannot probe yet")
        for i in inputs:
            i["index_bound"] = bound
        outs = [{"shape": list(graph.values[o].shape or ()), "dtype": graph.values[o].dtype} for o in n.outputs]
        kernels.append({"node": n.id, "kernel": n.kernel, "inputs": inputs, "outputs": outs, "output_values": n.outputs})
    return {
        "library": str(Path(library).resolve()),
        "kernels": kernels,
        "seed": 0,
        "use_names": use_names,
        "limits": (limits or SearchLimits()).to_json(),
    }


def probe(graph: Graph, library: Path, timeout: float = TIMEOUT, use_names: bool = True,
          limits: SearchLimits | None = None) -> dict[int, dict]:  # fmt: skip
    """Node id -> probe result (status, steps with operators and attributes, scaled error).
    use_names=False ignores kernel names (as if hashed): operators are then told by behaviour alone.
    limits: how much each kernel's search may do (the defaults of SearchLimits when None)."""
    with tempfile.TemporaryDirectory(prefix="zen-fold-") as fold_dir:
        req = request(graph, library, use_names, limits)
        req["fold_dir"] = fold_dir
        req["call_limit"] = call_limit(timeout)
        results = _run_child(req, timeout)
        for r in results.values():  # kernels computed from constants only: their outputs, as the child saved them
            if r.get("folded"):
                r["folded_values"] = [_load_folded(Path(fold_dir), r["node"], o, spec) for o, spec in enumerate(r["folded"])]
    return results


def _load_folded(fold_dir: Path, node: int, output: int, spec: dict) -> np.ndarray:
    try:
        a = np.load(fold_dir / f"n{int(node)}_{int(output)}.npy", allow_pickle=False)
    except (OSError, ValueError):
        raise ExecutableError(f"the probing child did not save the folded output {output} of kernel call {node}") from None
    if list(a.shape) != list(spec.get("shape", [])) or str(a.dtype) != spec.get("dtype"):
        raise ExecutableError(
            f"folded output {output} of kernel call {node} has shape {list(a.shape)} {a.dtype}, "
            f"expected {spec.get('shape')} {spec.get('dtype')}"
        )
    return a


def _run_child(req: dict, timeout: float) -> dict[int, dict]:
    from zen.compiled.emulation import runtime_for

    try:
        with runtime_for(Path(req["library"]), timeout) as emulated:
            proc = childproc.run(childproc.module_argv("zen.compiled.kernels.probe", python=tvm_python()),
                                 input=json.dumps(req), capture_output=True, text=True, timeout=timeout,
                                 env={**child_env(), **emulated})  # fmt: skip
    except subprocess.TimeoutExpired:
        raise timed_out("probing the kernels", timeout) from None
    except OSError as exc:
        raise ExecutableError(f"cannot start the probing interpreter {tvm_python()}: {exc}") from None
    if proc.returncode != 0:
        hung = hung_call(proc.stderr)
        if hung is not None:
            raise hung_error(hung, "probed", timeout)
        crashed = crashed_call(proc.returncode, proc.stderr)
        if crashed is not None:
            raise ExecutableError(f"the library's code crashed when probed ({crashed}): a damaged or crafted library",
                                  "zen decompile runs each kernel to recover what it computes; this one cannot run")  # fmt: skip
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ExecutableError(
            f"probing the kernels failed: {tail}", "TVM could not load or run the library (wrong architecture, missing runtime?)"
        )
    try:
        return {r["node"]: r for r in json.loads(proc.stdout)["results"]}
    except (ValueError, KeyError, TypeError):
        raise ExecutableError("the probing child returned no readable result") from None
