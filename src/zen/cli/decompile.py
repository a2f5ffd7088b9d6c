"""`zen decompile`: a TVM-compiled model library back to an importable PyTorch package.

Parsing is static and runs here; probing the kernels and comparing the rebuilt model with the
executable run the library's code, so they run in child processes (zen.compiled.kernels.probe/check).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import typer
from rich.markup import escape

from zen.compiled.kernels.budget import TIMEOUT, SearchLimits
from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

out, err = consoles()
EXIT_PARTIAL = 5


def compare(library: Path, package: Path, timeout: float = TIMEOUT) -> dict:
    """Max abs difference between the executable's and the rebuilt model's outputs (child process)."""
    from zen.compiled.emulation import runtime_for
    from zen.compiled.kernels.watchdog import call_limit, hung_call
    from zen.compiled.probing import child_env, hung_error, timed_out, tvm_python
    from zen.runtime import childproc

    limit = call_limit(timeout)
    args = [Path(library).resolve(), Path(package).resolve(), 3, *([limit] if limit else [])]
    argv = childproc.module_argv("zen.compiled.check", args, python=tvm_python())
    try:
        with runtime_for(Path(library), timeout) as emulated:  # a library for another CPU runs emulated
            proc = childproc.run(argv, capture_output=True, text=True, timeout=timeout, env={**child_env(), **emulated})
    except subprocess.TimeoutExpired:
        raise timed_out("comparing the rebuilt model with the executable", timeout) from None
    hung = hung_call(proc.stderr) if proc.returncode != 0 else None
    if hung is not None:
        raise hung_error(hung, "the rebuilt model was compared with it", timeout)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"comparison failed: {tail}"}


def decompile(
    library: Path = typer.Argument(..., help="A model library (.so) written by TVM's export_library (relax VM)."),
    output: Path = typer.Option(..., "-o", "--output", help="Directory for the package, graph.json and manifest.json."),
    probe: bool = typer.Option(
        True,
        "--probe/--static",
        help="Probe kernels with TVM in a child process (needed to rebuild); --static only parses the library.",
    ),
    check: bool = typer.Option(True, "--check/--no-check", help="Compare the rebuilt model with the executable."),
    names: bool = typer.Option(
        True,
        "--names/--behaviour-only",
        help="Use kernel names as hints; --behaviour-only "
        "ignores them (as for hashed names): single-operator kernels are recognised by behaviour.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    limit: list[str] | None = typer.Option(
        None,
        "--limit",
        help="NAME=VALUE: raise or lower a bound on each kernel's "
        "search (kernel_trials, kernel_leaves, pattern_trials, pattern_leaves; "
        "recorded in manifest.json).",
    ),
    timeout: float = typer.Option(
        TIMEOUT,
        "--timeout",
        min=1.0,
        help="Safety net: seconds a probing or checking "
        "child may run before zen stops with an error (exit 7), one call of the library's code a tenth of it; "
        "never changes a result.",
    ),
) -> None:
    """Decompile a TVM-built model library into a PyTorch package (`import DIR; DIR.load()`).

    DIR is also a zen case (mr.json with torch.nn layer types and hyper-parameters, an empty pr.json marked
    "source": "compiled", state_dict.safetensors under PyTorch names), so `zen library add DIR`, `zen attribute
    DIR` (MR similarity only: an executable holds no Python code) and `zen report DIR` take it.

    Each kernel's search is bounded by work (--limit), not time: the same library and limits give the same
    package on any machine at any load.

    Probing and --check EXECUTE the library's kernels (in a child process): run them in an isolated environment.
    """
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the package")
    from zen.compiled.decompile import decompile as run
    from zen.recover.limits import overrides

    limits = SearchLimits(**overrides(limit, SearchLimits().to_json()))
    if output.exists() and not output.is_dir():
        raise ZenError(f"{output} exists and is not a directory", "choose another -o DIR")
    manifest = run(library, output, do_probe=probe, use_names=names, limits=limits, timeout=timeout)
    if manifest["rebuilt"] and check:
        manifest["equivalence"] = compare(library, output, timeout)
        (output / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    if as_json:
        out.print_json(json.dumps(manifest, default=str))
    else:
        ex, g = manifest["executable"], manifest["graph"]
        out.print(
            f"[bold]{escape(str(library))}[/bold]: relax VM {ex['vm_version']}, {g['kernel_calls']} kernel calls "
            f"({g['distinct_kernels']} kernels), {ex['weight_tensors']} weight tensors" + (", stripped" if ex["stripped"] else "")
        )
        ops = ", ".join(f"{k}×{v}" for k, v in manifest["operators"].items())
        if ops:
            out.print(f"operators: {escape(ops)}")
        det = manifest.get("detached_parameters") or []
        if det:
            err.print(
                f"[yellow]note: {len(det)} weights are inputs of the executable, not in it: "
                f"{escape(', '.join(d['name'] for d in det))}; load(params=FILE) supplies them[/yellow]"
            )
        fold = manifest.get("folded")
        if fold:
            err.print(
                f"[yellow]note: {fold['kernel_calls']} kernel calls read only constants and matched no operator; "
                f"their outputs are kept as constant buffers: {escape(', '.join(fold['kernels']))}[/yellow]"
            )
        if manifest["rebuilt"]:
            out.print(f"package written: {escape(str(output))} (import it and call load())")
            if not output.name.isidentifier():
                err.print(
                    f"[yellow]note: {escape(output.name)} is not a Python identifier: rename the directory to "
                    "import it as a package[/yellow]"
                )
        eq = manifest.get("equivalence")
        if eq:
            if "error" in eq:
                err.print(f"[yellow]problem: {escape(eq['error'])}[/yellow]")
            else:
                out.print(
                    f"rebuilt vs executable: max abs difference {eq['max_abs_diff']:.3g} "
                    f"(outputs up to {eq['max_abs_output']:.3g}, {eq['trials']} random inputs)"
                )
    for p in manifest["problems"]:
        err.print(f"[yellow]problem: {escape(p)}[/yellow]")
    if (probe and not manifest["rebuilt"]) or "error" in (manifest.get("equivalence") or {}):
        raise typer.Exit(EXIT_PARTIAL)
