"""`zen decompile`: TVM model library -> graph -> probed operators -> PyTorch package + case files.

Static steps run in zen's process (no TVM import); probing runs in a child. What is written:

    DIR/__init__.py, model.py, weights.safetensors   the importable package (load() -> nn.Module)
    DIR/graph.json      the kernel-call graph with shapes and the operators found in each kernel
    DIR/bytecode.txt    the VM bytecode listing
    DIR/manifest.json   evidence (path, size, sha256), TVM format version, counts, the search limits
                        probing ran under, timings, problems
    DIR/mr.json, pr.json, ur.json, state_dict.safetensors   case files (zen.compiled.case), so that
                        `zen library add`, `zen attribute` and `zen report` take DIR like a recovered case
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from zen import __version__
from zen.compiled.codegen import write_package
from zen.compiled.errors import ExecutableError
from zen.compiled.kernels.budget import TIMEOUT, SearchLimits
from zen.compiled.probing import probe, tvm_available, tvm_python
from zen.compiled.static.load import load_graph

FORMAT = 1


def decompile(library: Path, out: Path, *, do_probe: bool = True, use_names: bool = True,
              limits: SearchLimits | None = None, timeout: float = TIMEOUT) -> dict:  # fmt: skip
    """Decompile `library` into `out`; returns the manifest. Raises ExecutableError on bad input.

    `limits` bound each kernel's search by work and are recorded in the manifest: with the same library
    and limits, every file but the manifest's `timings` is the same on any machine at any load. `timeout`
    is each child's wall-clock safety net (TimeLimitExceeded when it runs out), never part of a result."""
    library = Path(library)
    limits = limits or SearchLimits()
    t0 = time.monotonic()
    lib, ex, graph = load_graph(library)
    t_static = time.monotonic() - t0
    sha = hashlib.sha256(lib.data).hexdigest()
    kernels = [n for n in graph.nodes if not n.builtin]
    manifest = {
        "format": FORMAT,
        "kind": "zen-decompile",
        "tool": f"zen {__version__}",  # "zen-case" once case files exist
        "evidence": {"path": str(library), "size": len(lib.data), "sha256": sha},
        "executable": {
            "vm_version": ex.version,
            "magic": hex(ex.magic),
            "blob_found_by": lib.found_by,
            "stripped": lib.stripped,
            **_machine(lib.machine),
            "functions": [f.name for f in ex.functions if f.kind != "packed"],
            "kernel_symbols": len(lib.kernels),
            "constants": len(ex.constants),
            "weight_tensors": len(graph.tensor_constants()),
            "instructions": len(ex.instructions),
        },
        "graph": {
            "kernel_calls": len(kernels),
            "distinct_kernels": len(graph.kernels()),
            "inputs": [
                {"name": graph.values[i].input_name, "shape": graph.values[i].shape, "dtype": graph.values[i].dtype}
                for i in graph.inputs
            ],
        },
        "problems": list(graph.notes),
        "timings": {"static_s": round(t_static, 3)},
    }
    from zen.compiled.codegen import detached_inputs

    manifest["detached_parameters"] = [
        {
            "name": graph.values[v].input_name,
            "shape": graph.values[v].shape,
            "dtype": graph.values[v].dtype,
            **({"shape_guessed": True} if graph.values[v].shape_guessed else {}),
        }
        for v in detached_inputs(graph)
    ]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from zen.compiled.case import CASE_FILES

    for name in CASE_FILES:  # a case from an earlier run into DIR must not outlive this one's manifest
        (out / name).unlink(missing_ok=True)
    (out / "bytecode.txt").write_text(ex.listing() + "\n")
    results: dict[int, dict] = {}
    runnable = runnable_here(lib.machine)
    if do_probe and runnable is not True:
        manifest["problems"].append(f"operators were not probed, no model rebuilt: {runnable}")
    elif do_probe:
        if not tvm_available(timeout=timeout):
            manifest["problems"].append(f"TVM is not importable by {tvm_python()}: operators were not probed, no model rebuilt")
        else:
            t1 = time.monotonic()
            results = probe(graph, library, timeout=timeout, use_names=use_names, limits=limits)
            manifest["kernel_names_used"] = use_names
            manifest["limits"] = limits.to_json()
            manifest["timings"]["probe_s"] = round(time.monotonic() - t1, 3)
    for n in kernels:
        if n.id in results:
            r = results[n.id]
            n.attrs = {
                "status": r.get("status"),
                "ops": [{"op": s["op"], **s["attrs"]} for s in r.get("steps", [])],
                "error": r.get("error"),
                "reason": r.get("reason"),
                **({"method": r["method"]} if r.get("method") else {}),
            }
    folded = [n.kernel for n in kernels if results.get(n.id, {}).get("folded")]
    if folded:
        manifest["folded"] = {
            "kernel_calls": len(folded),
            "kernels": sorted(set(folded)),
            "why": "these calls read only constants and matched no operator; their outputs are "
            "constant and kept as buffers of the rebuilt model",
        }
    unresolved = [n.kernel for n in kernels if results and results.get(n.id, {}).get("status") != "ok"]
    if unresolved:
        manifest["problems"].append("kernels not reproduced by any candidate: " + ", ".join(sorted(set(unresolved))))
        stopped: dict[str, set[str]] = {}  # the limit a search ran into -> kernels it stopped
        for n in kernels:
            if results.get(n.id, {}).get("status") != "ok" and results.get(n.id, {}).get("stopped"):
                stopped.setdefault(results[n.id]["stopped"], set()).add(n.kernel)
        for limit, names in sorted(stopped.items()):
            manifest["problems"].append(
                f"the search stopped at {limit} for: {', '.join(sorted(names))} (raise it with --limit NAME=VALUE)"
            )
    (out / "graph.json").write_text(json.dumps(graph.to_json(), indent=1, default=str) + "\n")
    manifest["operators"] = _op_counts(kernels)
    rebuilt = bool(results) and not unresolved
    if rebuilt:
        try:
            write_package(out, graph, results, {"zen": __version__, "library": library.name, "sha256": sha})
        except ExecutableError as exc:
            manifest["problems"].append(str(exc))
            rebuilt = False
    manifest["rebuilt"] = rebuilt
    if results:
        from zen.compiled.case import write_case

        write_case(out, graph, results, manifest, library)
    manifest["timings"]["total_s"] = round(time.monotonic() - t0, 3)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    return manifest


def _machine(machine: str) -> dict:
    """What the manifest says of the architecture: the library's, the host's, and whether it runs emulated."""
    from zen.compiled.emulation import arch_name, host_machine

    if not machine:  # a raw VMExecutable file: no machine code of its own to say
        return {}
    return {"machine": machine, "architecture": arch_name(machine), "host_architecture": arch_name(host_machine()),
            "emulated": machine != host_machine()}  # fmt: skip


def runnable_here(machine: str) -> bool | str:
    """True when this machine can run the library's kernels (its own architecture, or an emulated runtime that is
    built); else why not, with what to do."""
    from zen.compiled.emulation import ARCHES, arch_name, build_hint, host_machine, ready

    if not machine or machine == host_machine() or ready(machine):
        return True
    what = "is not built" if machine in ARCHES else "does not exist in zen"
    return f"the library is compiled for {arch_name(machine)} and this machine is {arch_name(host_machine())}; " \
           f"the emulated {arch_name(machine)} runtime {what} ({build_hint(machine)})"  # fmt: skip


def _op_counts(kernels) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in kernels:
        for s in n.attrs.get("ops", []):
            name = s["fn"] if s["op"] == "act" else s["op"]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


__all__ = ["decompile", "ExecutableError"]
