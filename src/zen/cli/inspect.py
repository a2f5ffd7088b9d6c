"""`zen version`, `zen info`, `zen objects`, `zen show`: looking at an image or a case before and after recovery.

Also the options every image-reading command shares (image, --pid, --symbols, --gpu) and how it opens them.
`zen info GPU_CORE` shows what a CUDA GPU core holds (devices, contexts, global memory segments).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen import __version__
from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

out, err = consoles()
EXIT_PARTIAL = 5  # results were produced, but the evidence is incomplete (see the problems listed)
SHOWN_SEGMENTS = 40
INFO_LIMIT_HELP = "NAME=VALUE: a bound on GPU cores (gpu_inflate=RATIO: how many times its size a gzip core may inflate)."

IMAGE_HELP = "Memory image: a process core (zen acquire, gcore, kernel core) or a whole-machine image (LiME, AVML, raw, ELF)."
PID_HELP = "With IMAGE: a process of a whole-machine image (default: the one Python process with torch). Alone: a live process."
SYMBOLS_HELP = "Kernel symbols (ISF file or directory) for a whole-machine image; repeatable. Default: zen's symbol cache."
MODEL_HELP = "Which model root: address, #RANK, a referencing name, or `all` (one case per root: CASE/RANK-CLASS/)."
LIMIT_HELP = "NAME=VALUE: raise or lower a bound on what is read from the image (max_str, max_items, ...; see README)."
OFFLOAD_HELP = "A folder or file holding tensors accelerate offloaded to disk (repeatable): read, sha256 in evidence."
GPU_HELP = "GPU core of the same process (device memory; `zen acquire --pid` writes IMAGE.gpu0.nvcudmp); repeatable."


def is_gpu_core(image: Path) -> bool:
    from zen.memory import require_image_file
    from zen.memory.gpu import sniff_gpu_core

    return sniff_gpu_core(require_image_file(image)) is not None


def gpu_info(image: Path, as_json: bool, limits=None) -> None:
    from zen.memory.gpu import GpuCoreSpace

    with GpuCoreSpace(image, limits) as g:
        data = g.core.to_json()
        data["path"], data["size"] = str(Path(image).resolve()), Path(image).stat().st_size
        if g.unpacked is not None:
            data["compression"] = {"kind": "gzip", "unpacked_size": g.unpacked.size, "unpacked_sha256": g.unpacked.sha256}
    if as_json:
        out.print_json(json.dumps(data))
    else:
        _render(data)
    for p in data["problems"]:
        err.print(f"[yellow]problem: {escape(p)}[/yellow]", soft_wrap=True)
    if data["problems"]:
        raise typer.Exit(EXIT_PARTIAL)


def _render(d: dict) -> None:
    out.print(f"[bold]{escape(d['path'])}[/bold]: CUDA GPU core, {d['size']:,} bytes, {d['sections']:,} sections"
              + (f" (gzip; {d['compression']['unpacked_size']:,} bytes unpacked)" if "compression" in d else ""))  # fmt: skip
    m = d["meta"]
    if m:
        out.print(f"written by {escape(str(m.get('generator') or '?'))}: driver {m.get('driver', '?')}, "
                  f"CUDA {m.get('cuda', '?')}, flags {', '.join(m.get('flag_names', [])) or m.get('flags')}")  # fmt: skip
    if "zen_acquisition" in d:
        z = d["zen_acquisition"]
        out.print(f"acquired by zen: {escape(str(z.get('how', z.get('route', '?'))))}")
    t = Table("device", "name", "type", "SM", "SMs", "PCI", "contexts", "grids running")
    for dev in d["devices"]:
        sm = f"{escape(dev['sm_type'])} ({dev['sm_version']})"
        t.add_row(f"cuda:{dev['index']}", escape(dev["name"]), escape(dev["type"]), sm, str(dev["sm_count"]), dev["pci"],
                  str(len(dev["contexts"])), str(dev["grids_running"]))  # fmt: skip
    out.print(t if d["devices"] else "devices: no device table in this core")
    for dev in d["devices"]:
        for c in dev["contexts"]:
            out.print(f"  cuda:{dev['index']} context {c['context']}: host thread {c['host_tid']}, {c['modules']} modules, "
                      f"{c['images']} relocated images")  # fmt: skip
    g = d["global_memory"]
    out.print(f"global memory: {g['segments']} segments, {g['bytes']:,} bytes")
    t = Table("section", "address", "end", "size")
    for s in g["ranges"][:SHOWN_SEGMENTS]:
        t.add_row(s["section"], s["address"], f"{int(s['address'], 16) + s['size']:#x}", f"{s['size']:,}")
    out.print(t)
    if g["segments"] > SHOWN_SEGMENTS:
        out.print(f"... and {g['segments'] - SHOWN_SEGMENTS} more (--json lists all)")


def _open(image: Path | None, pid: int | None, symbols: list[Path] | None = None, gpu: list[Path] | None = None,
          gpu_limits=None):  # fmt: skip
    from zen.memory import open_space

    if image is None and pid is None:
        raise ZenError("give an image file or --pid PID", "see `zen COMMAND --help`")
    return open_space(image, pid, symbols=symbols, gpu=gpu, gpu_limits=gpu_limits)


def _print_problems(space) -> None:
    for note in space.notes:
        err.print(f"[dim]note: {note}[/dim]")
    for problem in space.problems:
        err.print(f"[yellow]problem: {problem}[/yellow]")


def version() -> None:
    """Print zen's version, whether its compiled core runs (else pure Python, and why), and what computes the two
    sha256 of every tensor byte (mr.json's and the tensor file's): a report may be asked how its digests were made."""
    from zen import native
    from zen.evidence import hashing

    out.print(f"zen {__version__} ({native.why})", markup=False)
    out.print(f"tensor digests: {hashing.why}", markup=False)


def info(
    image: Path | None = typer.Argument(None, help=IMAGE_HELP),
    pid: int | None = typer.Option(None, "--pid", help=PID_HELP),
    symbols: list[Path] | None = typer.Option(None, "--symbols", help=SYMBOLS_HELP),
    gpu: list[Path] | None = typer.Option(None, "--gpu", help=GPU_HELP),
    top: int = typer.Option(25, help="How many types to list in the census."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    census: bool = typer.Option(True, "--census/--no-census", help="Count objects by type (a scan of the whole heap)."),
    limit: list[str] | None = typer.Option(None, "--limit", help=INFO_LIMIT_HELP),
) -> None:
    """Versions, memory regions, interpreter address, object counts by type, threads; for a GPU core, its devices,
    contexts and global memory segments."""
    from zen.recover.info import image_info
    from zen.recover.limits import gpu_limits

    bounds = gpu_limits(limit)
    if image is not None and is_gpu_core(image):
        gpu_info(image, as_json, bounds)
        return
    space = _open(image, pid, symbols, gpu, bounds)
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
