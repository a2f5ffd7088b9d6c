"""The `zen` command. Thin: parse arguments, call the pipeline, render results.

Every error caused by input arrives here as a `ZenError` and leaves as one clear line on stderr
(plus a hint) and a non-zero exit code; a Python traceback only appears for bugs in zen, and
only with ZEN_DEBUG=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen import __version__
from zen.cli import acquire as cli_acquire
from zen.cli import analyze as cli_analyze
from zen.cli import case as cli_case
from zen.cli import decompile as cli_decompile
from zen.cli import gpu as cli_gpu
from zen.cli import library as cli_library
from zen.cli import reuse as cli_reuse
from zen.cli import serve as cli_serve
from zen.cli import symbols as cli_symbols
from zen.cli import system as cli_system
from zen.evidence.outpaths import require_parent
from zen.runtime.console import consoles
from zen.runtime.errors import ZenError
from zen.runtime.leave import run_and_leave

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="zen: recover deep-learning models, and the code that implements them, from memory images of Python processes "
    "(process cores, live PIDs, or whole-machine RAM images: LiME, AVML, raw, ELF dumps).",
)
profile_app = typer.Typer(
    no_args_is_help=True, help="Calibrate layout profiles (struct offsets) for a Python, torch or TensorFlow version."
)
app.add_typer(profile_app, name="profile")
app.add_typer(cli_library.library_app, name="library")
app.add_typer(cli_serve.serve_app, name="serve")
app.command("attribute")(cli_library.attribute)
app.command("diff")(cli_reuse.diff)
app.command("reuse")(cli_reuse.reuse)
app.command("verify")(cli_reuse.verify)
app.command("report")(cli_reuse.report)
app.command("ps")(cli_system.ps)
app.command("symbols")(cli_symbols.symbols)
app.command("decompile")(cli_decompile.decompile)
app.command("acquire")(cli_acquire.acquire)
app.command("analyze")(cli_analyze.analyze)
app.command("drift")(cli_analyze.drift)
app.command("verify-case")(cli_case.verify_case)
app.command("sign")(cli_case.sign)
app.command("keygen")(cli_case.keygen)
app.command("verify-evidence")(cli_case.verify_evidence)

out, err = consoles()

EXIT_PARTIAL = 5  # results were produced, but the evidence is incomplete (see the problems listed)


IMAGE_HELP = "Memory image: a process core (zen acquire, gcore, kernel core) or a whole-machine image (LiME, AVML, raw, ELF)."
PID_HELP = "With IMAGE: a process of a whole-machine image (default: the one Python process with torch). Alone: a live process."
SYMBOLS_HELP = "Kernel symbols (ISF file or directory) for a whole-machine image; repeatable. Default: zen's symbol cache."
MODEL_HELP = "Which model root: address, #RANK, a referencing name, or `all` (one case per root: CASE/RANK-CLASS/)."
LIMIT_HELP = "NAME=VALUE: raise or lower a bound on what is read from the image (max_str, max_items, ...; see README)."
OFFLOAD_HELP = "A folder or file holding tensors accelerate offloaded to disk (repeatable): read, sha256 in evidence."
GPU_HELP = "GPU core of the same process (device memory; `zen acquire --pid` writes IMAGE.gpu0.nvcudmp); repeatable."


def _open(image: Path | None, pid: int | None, symbols: list[Path] | None = None, gpu: list[Path] | None = None):
    from zen.memory import open_space

    if image is None and pid is None:
        raise ZenError("give an image file or --pid PID", "see `zen COMMAND --help`")
    return open_space(image, pid, symbols=symbols, gpu=gpu)


def _print_problems(space) -> None:
    for note in space.notes:
        err.print(f"[dim]note: {note}[/dim]")
    for problem in space.problems:
        err.print(f"[yellow]problem: {problem}[/yellow]")


@app.command()
def version() -> None:
    """Print zen's version."""
    out.print(f"zen {__version__}")


@app.command()
def info(
    image: Path | None = typer.Argument(None, help=IMAGE_HELP),
    pid: int | None = typer.Option(None, "--pid", help=PID_HELP),
    symbols: list[Path] | None = typer.Option(None, "--symbols", help=SYMBOLS_HELP),
    gpu: list[Path] | None = typer.Option(None, "--gpu", help=GPU_HELP),
    top: int = typer.Option(25, help="How many types to list in the census."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    census: bool = typer.Option(True, "--census/--no-census", help="Count objects by type (a scan of the whole heap)."),
) -> None:
    """Versions, memory regions, interpreter address, object counts by type, threads; for a GPU core, its devices,
    contexts and global memory segments."""
    from zen.recover.info import image_info

    if image is not None and cli_gpu.is_gpu_core(image):
        cli_gpu.info(image, as_json)
        return
    space = _open(image, pid, symbols, gpu)
    with space:
        res = _frozen(image, pid, lambda: image_info(space, top=top, census=census))
        if space.devices:
            res["gpu"] = space.device_evidence
        if as_json:
            out.print_json(json.dumps(res, default=str))
        else:
            _render_info(res)
        _print_problems(space)
        if space.problems:
            raise typer.Exit(EXIT_PARTIAL)


def _frozen(image: Path | None, pid: int | None, fn):
    """Run fn with the live process stopped; with an image, --pid names a process in it instead."""
    if pid is None or image is not None:
        return fn()
    from zen.memory.live import frozen

    with frozen(pid):
        return fn()


def _render_info(res: dict) -> None:
    ip = res["interpreter"]
    mem = res["memory"]
    out.print(f"[bold]{res['source']}[/bold]")
    if "system" in res:
        sy = res["system"]
        out.print(f"machine image: {sy['container']}")
        out.print(f"kernel: {sy['banner']}  (symbols {sy['symbols']['file']}, {sy['symbols']['source']})")
        out.print(f"process chosen: PID {sy['process']['pid']} {sy['process']['comm']} ({sy['process']['chosen_by']})")
    if "process" in res:
        p = res["process"]
        out.print(f"process: pid {p['pid']}  command: {p['command'] or '?'}  producer: {p['producer']}")
    out.print(
        f"memory: {mem['regions']} regions, {mem['mapped_bytes']:,} bytes mapped, "
        f"{mem['captured_bytes']:,} available ({', '.join(f'{k} {v:,}' for k, v in mem['bytes_by_source'].items())})"
    )
    out.print(f"python: {ip['version']}  ({ip['how'].get('version', '?')})")
    out.print(f"_PyRuntime: {ip['runtime'] and hex(ip['runtime'])}  ({ip['how'].get('runtime', 'not found')})")
    out.print(
        f"type type: {ip['type_type'] and hex(ip['type_type'])}  interpreter module: {ip['module']}"
        f"{'  (statically linked)' if ip['static_build'] else ''}"
    )
    out.print(f"profile: {ip['profile']}" + (f"  ({escape(ip['profile_why'])})" if ip.get("profile_why") else ""))
    dbg = ip.get("debug_offsets")
    if dbg and "checked" in dbg:
        agree = "all agree" if not dbg["mismatches"] else f"{len(dbg['mismatches'])} differ, the image's values are used"
        out.print(f"_Py_DebugOffsets: {dbg['checked']} profile fields cross-checked with the image's own table, {agree}")
    for w in ip["warnings"]:
        err.print(f"[yellow]warning: {w}[/yellow]")
    if "sys_modules" in res:
        pk = ", ".join(f"{k} {v}" for k, v in res.get("packages", {}).items() if v)
        out.print(f"sys.modules: {res['sys_modules']} modules" + (f"  ({pk})" if pk else ""))
    if "census" in res:
        c = res["census"]
        out.print(
            f"census: {c['objects']:,} objects of {c['types']:,} types in {c['seconds']} s"
            + (f"; GC lists: {res['gc'].get('generations')}" if "generations" in res.get("gc", {}) else "")
        )
        t = Table("type", "count", "type object")
        for row in c["top"]:
            t.add_row(row["type"], f"{row['count']:,}", row["addr"])
        out.print(t)
    for th in res.get("threads", []):
        out.print(f"thread {th['thread_id']} (native {th['native_id']}):")
        for fr in th["stack"][:20]:
            out.print(f"    {fr}")


@app.command()
def objects(
    image: Path | None = typer.Argument(None, help=IMAGE_HELP),
    type_name: str = typer.Option(..., "--type", help="Type name: 'function', 'dict', 'torch.nn.modules.linear.Linear', ..."),
    pid: int | None = typer.Option(None, "--pid", help=PID_HELP),
    symbols: list[Path] | None = typer.Option(None, "--symbols", help=SYMBOLS_HELP),
    gpu: list[Path] | None = typer.Option(None, "--gpu", help=GPU_HELP),
    limit: int = typer.Option(20, "--limit", help="Show at most this many objects (0: count only)."),
    subclasses: bool = typer.Option(False, "--subclasses", help="Include instances of subclasses."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """List objects of one type found in the image."""
    from zen.cpython.describe import describe
    from zen.cpython.heap import Heap
    from zen.cpython.interp import Interpreter

    space = _open(image, pid, symbols, gpu)
    with space:

        def run():
            ip = Interpreter.open(space)
            heap = Heap(ip)
            if subclasses:
                tinfos = heap.subclasses_of(type_name)
                taddrs = [t.addr for t in tinfos]
            else:
                taddrs = heap.types_named(type_name)
            if not taddrs:
                raise ZenError(
                    f"no type named {type_name!r} in the image",
                    "use the full name (module.qualname), e.g. collections.OrderedDict; `zen info` lists common types",
                )
            addrs = sorted({a for t in taddrs for a in heap.instances(t).tolist()})
            shown = [describe(ip, a) for a in addrs[: max(limit, 0)]]
            return {"type": type_name, "types": [f"{t:#x}" for t in taddrs], "count": len(addrs), "objects": shown}

        res = _frozen(image, pid, run)
        if as_json:
            out.print_json(json.dumps(res, default=str))
        else:
            out.print(f"{res['count']:,} objects of {type_name} ({len(res['types'])} type object(s))")
            for o in res["objects"]:
                rest = {k: v for k, v in o.items() if k not in ("addr", "type", "kind")}
                out.print(f"  {o['addr']}  {o.get('type', '?')}  " + "  ".join(f"{k}={v}" for k, v in rest.items()))
        _print_problems(space)


@app.command()
def recover(
    image: Path | None = typer.Argument(None, help=IMAGE_HELP),
    output: Path = typer.Option(..., "-o", "--output", help="Case directory to write (created if needed)."),
    pid: int | None = typer.Option(None, "--pid", help=PID_HELP + " (A live process is stopped while read.)"),
    symbols: list[Path] | None = typer.Option(None, "--symbols", help=SYMBOLS_HELP),
    gpu: list[Path] | None = typer.Option(None, "--gpu", help=GPU_HELP),
    model: str | None = typer.Option(None, "--model", help=MODEL_HELP),
    limit: list[str] | None = typer.Option(None, "--limit", help=LIMIT_HELP),
    sign: Path | None = typer.Option(None, "--sign", help="Sign the manifest with this Ed25519 key (manifest.sig)."),
    rehash: bool = typer.Option(False, "--rehash", help="Hash the image again even if zen hashed it unchanged before."),
    offload: list[Path] | None = typer.Option(None, "--offload", help=OFFLOAD_HELP),
) -> None:
    """Recover the model in an image: module tree, hyper-parameters, every tensor (bit-exact), inputs.

    The front end follows what the image holds: PyTorch (nn.Module trees) or Keras 3 on TensorFlow (layers, functional
    graph, every variable keyed by its Keras path, optimizer slots in extra.safetensors). The image's sha256, the tensor
    files and parts of the code stage are made by forked copies of zen on the other cores (ZEN_FORK=0: all in one
    process; the case files are the same)."""
    require_parent(output, "the case directory")
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from zen.recover.run import recover as do_recover

    if image is None and pid is None:
        raise ZenError("give an image file or --pid PID", "see `zen recover --help`")
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as prog:  # fmt: skip
        task = prog.add_task("recovering", total=None)

        def tick(stage: str, done: int, total: int) -> None:
            prog.update(task, description=stage, completed=done, total=total)

        opts = dict(progress=tick, symbols=symbols, limits=limit, gpu=gpu, rehash=rehash, offload=offload)
        if model == "all":  # one case per model root (zen.recover.all_models)
            from zen.recover.all_models import recover_all

            every = _frozen(image, pid, lambda: recover_all(image, pid, output, sign, **opts))
            raise typer.Exit(0 if all(r.status == "complete" for r in every) else EXIT_PARTIAL)  # each case says why
        res = _frozen(image, pid, lambda: do_recover(image, pid, output, model=model, **opts))
    _render_recover(res)
    if sign is not None:
        from zen.represent.signature import sign_case

        out.print(f"signed manifest.json with {sign_case(res.case_dir, sign)['key_fingerprint']}")
    if res.status != "complete":
        raise typer.Exit(EXIT_PARTIAL)


def _render_recover(res) -> None:
    mr, man = res.mr, res.manifest
    s = mr.summary
    t = Table("rank", "root", "class", "modules", "params", "elements", "served by / referenced from")
    for r in mr.roots[:10]:
        mark = "*" if r.address == mr.root.address else ""
        t.add_row(f"{r.rank}{mark}", r.address, r.cls, str(r.modules), str(r.parameters), f"{r.parameter_elements:,}",
                  ", ".join([f"served: {x}" for x in r.served_by[:2]] + r.referenced_from[:3]))  # fmt: skip
    out.print(t)
    out.print(f"model: {mr.root.cls} at {mr.root.address} ({man['model']['selected_by']})")
    layers = ", ".join(f"{k.rsplit('.', 1)[-1]}×{v}" for k, v in sorted(mr.layer_types.items(), key=lambda kv: -kv[1])[:8])
    out.print(f"layers: {s['modules']} modules ({layers})")
    out.print(f"tensors: {s['state_dict_entries']} state_dict entries, {s['unique_tensors']} unique, "
              f"{s['parameter_elements']:,} parameter elements, {s['bytes']:,} bytes; dtypes {s['dtypes']}")  # fmt: skip
    if mr.tied:
        out.print(f"tied: {'; '.join(' = '.join(g) for g in mr.tied[:4])}")
    if mr.inputs:
        best = mr.inputs[0]
        out.print(f"inputs: {len(mr.inputs)} candidate(s), best {best['shape']} {best['dtype']} at {best['address']}")
    out.print(f"wrote {res.case_dir} ({man['status']}) in {man['run']['total_seconds']} s")
    for p in res.problems[:20]:
        err.print(f"[yellow]problem: {p}[/yellow]")


@app.command()
def show(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    limit: int = typer.Option(40, help="Functions shown per module."),
) -> None:
    """Table-I-style counts, the model's own classes and functions by module, and its execution context."""
    from zen.cli.library import check_case
    from zen.represent import case

    problems = check_case(case_dir)
    manifest = case.load_manifest(case_dir)
    mr = case.load_mr(case_dir)
    pr = case.load_pr(case_dir)
    by_module: dict[str, dict[str, list[str]]] = {}
    for c in pr.classes:
        by_module.setdefault(c.module, {"classes": [], "functions": []})["classes"].append(c.qualname)
    for c in pr.codes:
        if c.parent is None:
            by_module.setdefault(c.module, {"classes": [], "functions": []})["functions"].append(c.fid.split(":", 1)[1])
    summary = {"model": mr.root.cls, "status": manifest["status"], "counts": pr.counts, "modules": pr.modules,
               "code": by_module, "dependencies": pr.dependencies, "context": pr.context}  # fmt: skip
    if as_json:
        out.print_json(json.dumps(summary, default=str))
    else:
        _print_show(case_dir, manifest, mr, pr, by_module, limit)
    if problems:
        raise typer.Exit(EXIT_PARTIAL)


def _print_show(case_dir, manifest, mr, pr, by_module, limit) -> None:
    """Every name printed here comes from the image: escaped, so `[` in a class name is text, not markup."""
    e = escape
    out.print(f"[bold]{e(str(case_dir))}[/bold]: {e(mr.root.cls)} at {mr.root.address} ({e(manifest['status'])})")
    t = Table("", "functions", "code objects", "classes", "modules")
    for label, key in (("system-wide", "system"), ("model-specific", "model")):
        c = pr.counts.get(key) or {}
        t.add_row(label, *(f"{c.get(k, 0):,}" for k in ("functions", "code_objects", "classes", "modules")))
    out.print(t)
    for module in sorted(by_module):
        entry = by_module[module]
        out.print(f"[bold]{e(module)}[/bold]  {e(str(pr.modules.get(module) or ''))}")
        if entry["classes"]:
            out.print("  classes: " + e(", ".join(sorted(entry["classes"]))))
        funcs = sorted(entry["functions"])
        for f in funcs[:limit]:
            out.print(f"    {e(f)}")
        if len(funcs) > limit:
            out.print(f"    ... {len(funcs) - limit} more")
    deps = ", ".join(f"{k} ({v})" for k, v in sorted(pr.dependencies.items(), key=lambda kv: -kv[1])[:12])
    out.print(f"calls into (not model code): {e(deps)}")
    ctx = pr.context if isinstance(pr.context, dict) else {}
    rt, hw = ctx.get("runtime") or {}, ctx.get("hardware") or {}
    devices = ", ".join(map(str, hw.get("devices") or [])) or "?"
    out.print(e(f"execution context: Python {rt.get('python')} on {rt.get('platform')}, devices {devices}, "
                f"{rt.get('modules_loaded')} modules loaded"))  # fmt: skip
    out.print("requirements.txt:")
    for line in ctx.get("requirements") or []:
        out.print(f"  {e(str(line))}")


@app.command()
def demo(
    workdir: Path = typer.Option(Path("zen-demo"), "--dir", help="Where the demo writes its image and files."),
    keep: bool = typer.Option(False, "--keep", help="Keep the memory image afterwards."),
) -> None:
    """Image a small model-serving process and show what zen recovers from the image alone."""
    from zen.demo import run_demo

    res = run_demo(workdir, out, keep=keep)
    if not res["ok"]:
        raise typer.Exit(1)


@profile_app.command("python")
def profile_python(
    python: str = typer.Option(sys.executable, "--python", help="Interpreter to calibrate (default: the one running zen)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write here instead of the user profile directory."),
) -> None:
    """Measure CPython struct layouts in an interpreter and save them as a layout profile."""
    require_parent(output, "the profile")
    from zen.cpython.layout.profile import parse_profile, profile_filename, user_profile_dir

    data, text = _run_calibrator(python, "zen.cpython.calibration.run")
    prof = parse_profile(data, python)
    # named after the exact release: an image of another patch release may need another layout (releases.py)
    target = output or (user_profile_dir() / profile_filename(prof.version, data["python"]["machine"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    out.print(
        f"calibrated CPython {prof.version}: {sum(len(s.fields()) for s in prof.structs.values())} fields in "
        f"{len(prof.structs)} structs, {data['self_checks']} self-checks passed -> {target}"
    )


@profile_app.command("torch")
def profile_torch(
    python: str = typer.Option(sys.executable, "--python", help="Interpreter with the torch to calibrate (default: zen's)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write here instead of the user profile directory."),
) -> None:
    """Measure PyTorch tensor layouts (TensorImpl, StorageImpl, dtypes) and save a torch layout profile."""
    require_parent(output, "the profile")
    from zen.cpython.layout.profile import user_profile_dir
    from zen.frontends.pytorch.profile import parse_torch_profile, torch_profile_filename

    data, text = _run_calibrator(python, "zen.frontends.pytorch.calibration")
    prof = parse_torch_profile(data, python)
    target = output or (user_profile_dir() / torch_profile_filename(prof.minor, data["torch"]["machine"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    out.print(
        f"calibrated torch {data['torch']['full_version']}: {sum(len(s.fields()) for s in prof.structs.values())} "
        f"fields, {len(prof.dtypes)} dtypes, {data['self_checks']} self-checks passed -> {target}"
    )


@profile_app.command("tf")
def profile_tf(
    python: str = typer.Option(..., "--python", help="Interpreter with the TensorFlow to calibrate (zen's own has none)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write here instead of the user profile directory."),
) -> None:
    """Measure TensorFlow tensor/variable layouts (EagerTensor, ResourceVariable, shapes, dtypes) for Keras models."""
    require_parent(output, "the profile")
    from zen.cpython.layout.profile import user_profile_dir
    from zen.frontends.keras.profile import parse_tf_profile, tf_profile_filename

    data, text = _run_calibrator(python, "zen.frontends.keras.calibration")
    prof = parse_tf_profile(data, python)
    target = output or (user_profile_dir() / tf_profile_filename(prof.minor, data["tensorflow"]["machine"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    out.print(
        f"calibrated TensorFlow {prof.version}: {sum(len(s.fields()) for s in prof.structs.values())} fields, "
        f"{len(prof.dtypes)} dtypes, {data['self_checks']} self-checks passed -> {target}"
    )


def _run_calibrator(python: str, module: str) -> tuple[dict, str]:
    """Run a stdlib-only calibrator module under another interpreter, from zen's own source tree.

    The target interpreter imports it in isolated mode without needing zen's dependencies.
    """
    from zen.runtime import childproc

    boot = f"import sys; from {module} import main; sys.exit(main())"
    try:
        proc = childproc.run(childproc.code_argv(boot, python=python, with_pythonpath=False), capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    except FileNotFoundError:
        raise ZenError(f"interpreter not found: {python}") from None
    except subprocess.TimeoutExpired:
        raise ZenError(f"calibration under {python} did not finish in 300 s") from None
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit code {proc.returncode}"
        raise ZenError(f"calibration under {python} failed: {last}")
    return json.loads(proc.stdout), proc.stdout


def main() -> None:
    """Console entry point: run the app, then leave without freeing its objects one by one (`zen.runtime.leave`)."""
    run_and_leave(_main)


def _main() -> None:
    """Typer handles usage errors itself (exit 2); everything else that escapes a command arrives
    here: zen's own errors become one line plus a hint, anything else is a bug in zen."""
    for stream in (sys.stdout, sys.stderr):  # strings from an image may hold undecodable bytes (surrogates)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        app()
    except ZenError as exc:
        err.print(f"[red]error:[/red] {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            err.print(f"[dim]hint: {escape(exc.hint)}[/dim]", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug in zen, not a user mistake
        if os.environ.get("ZEN_DEBUG") == "1":
            raise
        err.print(f"[red]internal error (a bug in zen):[/red] {type(exc).__name__}: {escape(str(exc))}")
        err.print("[dim]rerun with ZEN_DEBUG=1 for a traceback, and please report it[/dim]")
        sys.exit(70)


if __name__ == "__main__":
    main()
