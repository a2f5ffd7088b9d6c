"""`zen diff`, `zen reuse`, `zen verify`: what a model changed, and a runnable copy of it.

`diff` and `reuse` analyse and write files; they never run recovered code. `verify` (and the
`load()` of a package `reuse` writes) EXECUTES code recovered from the image, and says so.
"""

from __future__ import annotations

import json
import marshal
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen.cli.library import EXIT_PARTIAL, LIB_OPT, _open, check_case, library_for
from zen.represent import textio
from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

out, err = consoles()

EXECUTES = "load() and `zen verify` EXECUTE code recovered from the image: run them in an isolated environment."


def _base(library: str | None, name: str):
    with _open(library, create=False) as lib:
        entry = lib.get(name)
        code = lib.code(name)
    return entry, code


def diff(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    base: str = typer.Option(..., "--base", help="Name of the base model in the library (see `zen attribute`)."),
    library: str | None = LIB_OPT,
    patch: Path | None = typer.Option(None, "-o", "--patch", help="Also write the patch file (JSON) here."),
    as_json: bool = typer.Option(False, "--json", help="Print the diff as JSON."),
    source: bool = typer.Option(True, "--source/--listing", help="Diff decompiled source (depyf) where possible."),
    limit: list[str] | None = typer.Option(
        None,
        "--limit",
        help="NAME=VALUE: decompile_calls, the Python calls depyf may "
        "make per function before it is shown as a listing (recorded with --json).",
    ),
    timeout: float = typer.Option(
        600.0,
        "--timeout",
        min=1.0,
        help="Safety net: seconds decompilation may take before zen stops with an error (exit 7); never changes what is shown.",
    ),
) -> None:
    """What the recovered model changed relative to a base model (ZEN Algorithm 2).

    Whether a function is shown as decompiled source or as a listing depends on its code and the work
    limit (--limit decompile_calls=N) alone, never on how busy the machine is."""
    from zen.diff.decompile import DECOMPILE_CALLS
    from zen.evidence.outpaths import require_parent

    require_parent(patch, "the patch")
    from zen.diff.view import change_summary, function_views
    from zen.patch.format import write_patch
    from zen.recover.limits import overrides
    from zen.represent import case
    from zen.reuse.package import diff_case

    limits = {"decompile_calls": DECOMPILE_CALLS, **overrides(limit, {"decompile_calls": DECOMPILE_CALLS})}
    problems = check_case(case_dir)
    entry, base_blob = _base(library_for(case_dir, library), base)
    data, d, rec_code = diff_case(Path(case_dir), entry)
    if data is None:
        py = (case.load_manifest(case_dir).get("python") or {}).get("version", "?")
        err.print(f"[yellow]note: the image runs Python {escape(py)}: its code objects cannot be rebuilt by this zen's "
                  "Python, so changes are shown as listings[/yellow]")  # fmt: skip
        if patch is not None:
            raise ZenError("a patch needs the rebuilt code of the case", f"recover the case with zen running under Python {py}")
    base_code = None
    if base_blob:
        try:
            base_code = marshal.loads(base_blob)
        except (ValueError, EOFError, TypeError, SystemError):  # SystemError: a code object CPython refuses to build
            base_code = None  # stored under another Python version: listings only
    views = function_views(d, rec_code, base_code, decompile=source, timeout=timeout, max_calls=limits["decompile_calls"])
    if patch is not None:
        write_patch(data, patch)
    if as_json:
        recorded = {"limits": limits} if source else {}
        out.print_json(json.dumps({**d.summary(), "functions": [v.to_json() for v in views],
                                   "patch": str(patch) if patch else None, **recorded}))  # fmt: skip
        if problems:
            raise typer.Exit(EXIT_PARTIAL)
        return
    s = d.summary()
    out.print(f"[bold]{escape(str(case_dir))}[/bold] against base [bold]{escape(base)}[/bold]: "
              f"{s['changed']} changed, {s['added']} added, {s['unchanged']} unchanged functions")  # fmt: skip
    t = Table("recovered module", "base module")
    for m, b in d.module_map.items():
        t.add_row(escape(m), escape(b) if b else "[italic](new: synthesised on reuse)[/italic]")
    out.print(t)
    for label, items in (("classes added", s["classes_added"]), ("classes removed", s["classes_removed"]),
                         ("methods added to base classes", s["methods_added"]),
                         ("class attributes changed", s["class_attributes_changed"])):  # fmt: skip
        if items:
            out.print(f"{label}: " + ", ".join(escape(x) for x in items))
    for x in d.excluded:
        out.print(f"[yellow]excluded (corrupt): {escape(x['function'])}: {escape(x['reason'])}[/yellow]")
    for v in views:
        mark = "~" if v.op == "changed" else "+"
        score = f" (match {v.score})" if v.score is not None else ""
        out.print(f"\n[bold]{mark} {escape(v.target)}[/bold] <- {escape(v.recovered)}{score}")
        if v.changes:
            out.print(f"  {escape(change_summary(v.changes))}")
        out.print(f"  [dim]{v.shown_as} diff{f' ({escape(v.note)})' if v.note else ''}:[/dim]")
        for line in v.unified:
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim" if line.startswith("@") else ""
            out.print(f"[{style}]{escape(line)}[/{style}]" if style else escape(line), soft_wrap=True)
    if patch is not None:
        out.print(f"\npatch written to {escape(str(patch))} ({len(data['functions'])} functions, {len(data['classes'])} classes)")
    if problems:
        raise typer.Exit(EXIT_PARTIAL)


def reuse(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    output: Path = typer.Option(..., "-o", "--output", help="Package directory to write (a Python identifier)."),
    base: str | None = typer.Option(
        None,
        "--base",
        help="Base model in the library whose installed code is patched; "
        "omit for a self-contained rebuild from the recovered code alone.",
    ),  # fmt: skip
    library: str | None = LIB_OPT,
    dequantize: bool = typer.Option(
        False,
        "--dequantize",
        help="load() returns a float copy of a quantized model "
        "(torchao, quanto, bitsandbytes layers as torch.nn ones; outputs then differ).",
    ),
) -> None:
    """Write an importable package that rebuilds the recovered model: `import PKG; PKG.load()`.

    PyTorch: the model's code is patched into a base (--base) or synthesised from the recovered code; load()
    returns the nn.Module. TorchScript that was jit.load'ed or traced in the process: the package holds model.pt, a
    TorchScript archive of the code read from the image (a trace: its graphs, printed as code by torch in a child
    process), and load() runs torch.jit.load. Keras (a case whose mr.json says "keras"): load(), run with
    TensorFlow, constructs the model from the recorded layer classes, constructor arguments and functional graph (a
    subclassed model's own classes from the recovered code), assigns every recovered variable by path and returns a
    keras.Model
    (`model.predict(x)` works); check it with `zen verify PKG --python TF_PYTHON --inputs X --expect Y`."""
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the package")
    from zen.represent import case
    from zen.reuse.package import make_patch, write_package

    # the package is built from every case file (weights, code, MR): all must be what zen wrote
    case.require_intact(case_dir, case.load_manifest(case_dir), case.ALL_FILES)
    if case.load_mr(case_dir).framework == "keras":
        _reuse_keras(case_dir, output, base)
        return
    entry = _base(library_for(case_dir, library), base)[0] if base else None
    data, d = make_patch(case_dir, entry)
    pkg = write_package(case_dir, output, data, d.summary() if d else None, dequantize)
    how = f"base {base} + patch" if base else "self-contained (modules synthesised from recovered code)"
    how += "; load() dequantizes (a float copy)" if dequantize else ""
    out.print(f"wrote {escape(str(pkg))}: {how}; {len(data['functions'])} functions, {len(data['classes'])} classes")
    out.print(f"use: import {pkg.name}; model = {pkg.name}.load()   (with {escape(str(pkg.parent))} on sys.path)")
    # values the package cannot rebuild (a lock, a class made inside a function): load() reports them
    # again, by path, and fails only if the model uses them
    problems = json.loads((pkg / "reuse.json").read_text()).get("problems") or []
    for p in problems[:20]:
        err.print(f"[yellow]not rebuildable:[/yellow] {escape(str(p))}", soft_wrap=True)
    if len(problems) > 20:
        err.print(f"[yellow]... and {len(problems) - 20} more (reuse.json lists them all)[/yellow]")
    err.print(f"[yellow]warning:[/yellow] {EXECUTES}")


def _reuse_keras(case_dir: Path, output: Path, base: str | None) -> None:
    from zen.reuse.keras_package import write_keras_package

    if base:
        raise ZenError("--base applies to PyTorch cases", "omit --base: a Keras case is rebuilt from its MR and code")
    pkg, info = write_keras_package(case_dir, output)
    own = f"; classes of {', '.join(info['user_modules'])} synthesised from recovered code" if info["user_modules"] else ""
    out.print(f"wrote {escape(str(pkg))}: Keras model rebuilt from its configuration{escape(own)}")
    out.print(f"use (TensorFlow environment, zen on PYTHONPATH): import {pkg.name}; model = {pkg.name}.load()")
    for p in info["problems"][:20]:
        err.print(f"[yellow]not rebuildable:[/yellow] {escape(str(p))}", soft_wrap=True)
    if info["executes_recovered_code"]:
        err.print(f"[yellow]warning:[/yellow] {EXECUTES}")


def _verify_keras(package: Path, python: str | None, inputs: Path | None, expect: Path | None, save: Path | None,
                  as_json: bool) -> None:  # fmt: skip
    import sys

    from zen.reuse.keras_package import run_verify

    if inputs is None and not (Path(package) / "inputs.safetensors").is_file():
        raise ZenError("no input tensors to run", "pass --inputs FILE.safetensors")
    inputs = inputs if inputs is not None else Path(package) / "inputs.safetensors"
    result = run_verify(package, python or sys.executable, inputs, expect, save)
    rows, report = result["results"], result["report"]
    _record(package, inputs, expect, rows, report)
    summary = f"{report['assigned']} of {report['variables']} variables assigned (by {report['matched_by']})"
    failed = _show_results(rows, report, as_json, [summary], report["notes"][:20] + report["missing"][:20])
    if failed:
        err.print(f"[red]{len(failed)} of {len(rows)} inputs failed or differ[/red]")
        raise typer.Exit(1)


def _show_results(rows: list, report: dict, as_json: bool, lines: list[str], notes: list[str]) -> list:
    """Print verify's per-input results (a table, or JSON) for PyTorch and Keras packages alike;
    returns the rows that failed or differ."""
    failed = [r for r in rows if "error" in r or r.get("equal") is False]
    if as_json:
        out.print_json(json.dumps({"results": rows, "report": report, "ok": not failed}))
        return failed
    t = Table("input", "output", "dtype", "bit-identical", "note")
    for r in rows:
        eq = {True: "[green]yes[/green]", False: "[red]NO[/red]", None: "-"}[r.get("equal")]
        note = r.get("error") or (f"max |diff| {r['max_abs_diff']:.3g}" if "max_abs_diff" in r else "")
        t.add_row(r["input"], str(r.get("shape", "")), r.get("dtype", ""), eq, escape(note))
    out.print(t)
    for line in lines:
        out.print(line)
    for n in notes:
        err.print(f"[dim]note: {escape(n)}[/dim]")
    return failed


def _record(package: Path, inputs: Path, expect: Path | None, rows: list, report: dict) -> None:
    """verify.json in the package: the result a report cites, with the hashes of what was compared."""
    import time

    from zen import __version__
    from zen.represent.case import file_sha256
    from zen.reuse.package import package_hashes

    data = {"kind": "zen-verify", "format": 1, "tool": f"zen {__version__}",
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "inputs": str(inputs),
            "inputs_sha256": file_sha256(inputs), "expect": str(expect) if expect else None,
            "expect_sha256": file_sha256(expect) if expect else None, "results": rows, "load_report": report,
            "package_sha256": package_hashes(Path(package)), "executed_recovered_code": True}  # fmt: skip
    try:
        textio.write_json(Path(package) / "verify.json", _with_history(Path(package) / "verify.json", data), indent=1)
    except OSError as exc:
        err.print(f"[yellow]could not write verify.json: {escape(str(exc))}[/yellow]")


MAX_RUNS = 20  # verifications kept in verify.json


def _with_history(path: Path, run: dict) -> dict:
    """verify.json keeps every verification (`runs`, the last MAX_RUNS) and shows at its top level the strongest:
    the latest that compared outputs with expected ones (the demo's check against the served request) over a later
    run with nothing to compare, which used to overwrite it (issue 51). A file zen cannot read is started afresh."""
    from zen.represent.schema import CaseFileError, parse_json

    runs: list = []
    try:
        old = parse_json(path, str(path)) if path.is_file() else None
    except (CaseFileError, ZenError):
        old = None
    if isinstance(old, dict) and old.get("package_sha256") == run["package_sha256"]:  # the same package's runs
        kept = old.get("runs")
        runs = [r for r in kept if isinstance(r, dict)] if isinstance(kept, list) else [{k: v for k, v in old.items()}]
    runs = [*runs, run][-MAX_RUNS:]
    strongest = next((r for r in reversed(runs) if r.get("expect_sha256")), run)
    return {**strongest, "runs": runs}


def verify(
    package: Path = typer.Argument(..., help="A package written by `zen reuse`."),
    inputs: Path | None = typer.Option(None, "--inputs", help="safetensors file of inputs (default: the package's)."),
    expect: Path | None = typer.Option(None, "--expect", help="safetensors file of expected outputs, same keys."),
    save: Path | None = typer.Option(None, "-o", "--save", help="Write the outputs here (safetensors)."),
    threads: int = typer.Option(1, "--threads", help="torch threads (1 makes CPU results reproducible)."),
    as_json: bool = typer.Option(False, "--json", help="Print results as JSON."),
    device: str = typer.Option(
        "cpu",
        "--device",
        help="PyTorch packages: run the model on this device (cpu, cuda:0); inputs are moved there, outputs compared on the CPU.",
    ),
    python: str | None = typer.Option(
        None,
        "--python",
        help="Keras packages: the TensorFlow environment's python "
        "(the model runs in a child process there; default: this interpreter).",
    ),
) -> None:
    """Run the rebuilt model on each input tensor and compare with expected outputs (bit-exact)."""
    from zen.evidence.outpaths import require_parent

    require_parent(save, "the outputs")
    from zen.reuse.keras_package import is_keras_package

    if is_keras_package(package):
        _verify_keras(package, python, inputs, expect, save, as_json)
        return
    try:
        import torch
    except ImportError:
        raise ZenError("zen verify needs torch", "pip install torch==2.13.0 (see the README)") from None
    from zen.reuse.runtime import first_tensor, import_package, load_tensors

    err.print(f"[yellow]warning:[/yellow] {EXECUTES}")
    torch.set_num_threads(threads)
    pkg = import_package(package)
    model, report = pkg.load_with_report(device=device) if device != "cpu" else pkg.load_with_report()
    given = load_tensors(inputs if inputs is not None else Path(package) / "inputs.safetensors")
    xs = {k: v.to(device) for k, v in given.items()}
    if not xs:
        raise ZenError("no input tensors to run", "pass --inputs FILE.safetensors")
    want = load_tensors(expect) if expect is not None else {}
    rows, outputs = [], {}
    for key in sorted(xs):
        try:
            with torch.no_grad():
                y = first_tensor(model(xs[key]))
                y = y.cpu() if y is not None else None
        except Exception as exc:  # noqa: BLE001 - recovered code or a wrong input: report, don't crash
            rows.append({"input": key, "error": f"{type(exc).__name__}: {exc}"})
            continue
        if y is None:
            rows.append({"input": key, "error": "the model returned no tensor"})
            continue
        outputs[key] = y.detach().contiguous()
        row = {"input": key, "shape": list(y.shape), "dtype": str(y.dtype).replace("torch.", "")}
        if key in want:
            e = want[key]
            row["equal"] = bool(e.shape == y.shape and e.dtype == y.dtype and torch.equal(e, y))
            if not row["equal"] and e.shape == y.shape:
                row["max_abs_diff"] = float((e.double() - y.double()).abs().max())
        elif want:
            row["error"] = "no expected output with this key"
        rows.append(row)
    if save is not None:
        from safetensors.torch import save_file

        save_file(outputs, str(save))
    _record(package, inputs if inputs is not None else Path(package) / "inputs.safetensors", expect, rows, report)
    failed = _show_results(rows, report, as_json, [], report["patch"]["warnings"][:20])
    if failed:
        err.print(f"[red]{len(failed)} of {len(rows)} inputs failed or differ[/red]")
        raise typer.Exit(1)


def report(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    output: Path = typer.Option(..., "-o", "--output", help="Report file: .html (self-contained) or .md."),
    library: str | None = LIB_OPT,
    base: str | None = typer.Option(None, "--base", help="Compare with this base (default: the attributed one)."),
    reuse_dir: Path | None = typer.Option(None, "--reuse", help="A reuse package (its verify.json is reported)."),
    attribute: bool = typer.Option(True, "--attribute/--no-attribute", help="Attribute against the library."),
    source: bool = typer.Option(True, "--source/--listing", help="Diff decompiled source (depyf) where possible."),
    analysis_dir: Path | None = typer.Option(None, "--analysis", help="A `zen analyze` output directory (ART results)."),
    drift_dir: Path | None = typer.Option(None, "--drift", help="A `zen drift -o` directory (weight drift)."),
) -> None:
    """Write a forensic report: evidence, model, attribution, shared artefacts, changes, reuse verification, and
    (--analysis, --drift) white-box analysis and weight drift."""
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the report")
    from zen.report.gather import gather

    suffix = output.suffix.lower()
    if suffix not in (".html", ".htm", ".md"):
        raise ZenError(f"unknown report format {output.suffix!r}", "name the output .html or .md")
    lib = library_for(case_dir, library) if attribute else None
    if attribute and lib is None:  # the user default, if there is one
        from pathlib import Path as _Path

        from zen.library.backends import default_library_spec, describe

        spec = default_library_spec()
        lib = spec if describe(spec) != "sqlite" or _Path(spec).exists() else None
    data = gather(case_dir, library=lib, base=base if lib is not None else None, reuse_dir=reuse_dir, decompile=source,
                  analysis_dir=analysis_dir, drift_dir=drift_dir)  # fmt: skip
    if suffix == ".md":
        from zen.report.markdown import render as render_md

        text = render_md(data)
    else:
        from zen.report.html import render as render_html

        text = render_html(data)
    textio.write_text(output, text)
    textio.write_json(output.with_suffix(".json"), data, indent=1)
    a = data.get("attribution")
    verdict = f"attributed to {a['attributed']}" if a and a.get("attributed") else "no attribution"
    size = output.stat().st_size  # bytes as written (the text's length counts characters)
    out.print(f"wrote {escape(str(output))} ({size:,} bytes; {verdict}) and {escape(str(output.with_suffix('.json')))}")
    integ = data["evidence"].get("integrity") or {}
    for p in integ.get("problems", []):
        err.print(f"[yellow]problem with the case (shown in the report): {escape(p)}[/yellow]", soft_wrap=True)
    for section in ("analysis", "drift"):
        for p in (data.get(section) or {}).get("problems", []):
            err.print(f"[yellow]problem with the {section} (shown in the report): {escape(str(p))}[/yellow]", soft_wrap=True)
    if not integ.get("verified", True):
        raise typer.Exit(EXIT_PARTIAL)
