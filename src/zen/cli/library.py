"""`zen library ...` and `zen attribute`: the Base Model Library and attribution on the command line."""

from __future__ import annotations

import contextlib
import gc
import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

library_app = typer.Typer(no_args_is_help=True, help="The Base Model Library: fingerprints of known base models.")
out, err = consoles()

LIB_OPT = typer.Option(
    None,
    "--library",
    help="Library: a SQLite file, a postgresql:// URL or the http(s):// URL of a zen "
    "serve (token in $ZEN_LIBRARY_TOKEN). Default: $ZEN_LIBRARY or ~/.local/share/zen/library.sqlite.",
)


EXIT_PARTIAL = 5
EMPTY_HINT = "add base models with `zen library add` or `zen library build`"


def check_case(case_dir: Path) -> list[str]:
    """Verify a case before a command uses it: its manifest (schema) and every file against the
    manifest's hashes. Files the command reads are checked again where they are loaded (a mismatch
    there is an error); problems with the others are printed here, and the command, whose results
    do not depend on them, finishes with exit code 5."""
    from zen.represent import case

    problems = case.integrity(case_dir, case.load_manifest(case_dir), code=True)
    for p in problems:
        err.print(f"[yellow]problem with the case: {escape(p)}[/yellow]", soft_wrap=True)
    return problems


def library_for(case_dir: Path, library: str | None) -> str | None:
    """The one rule for which library a command about a case uses (attribute, diff, reuse --base, report; issue 51):
    `--library`, else `$ZEN_LIBRARY` when it names one that exists (a file, or a server or database URL), else the
    `library.sqlite` beside the case (where `zen demo` puts it: said aloud), else the user default (None: the caller's
    default). The choice of a library is never silent when it is not the one given."""
    import os

    from zen.library.backends import default_library_path, describe

    if library is not None:
        return library
    env = os.environ.get("ZEN_LIBRARY")
    if env and (describe(env) != "sqlite" or Path(env).exists()):
        return env
    beside = Path(case_dir).absolute().parent / "library.sqlite"
    if beside.is_file() and beside.resolve() != default_library_path().resolve():
        why = f"$ZEN_LIBRARY ({env}) does not exist" if env else "no --library given"
        err.print(f"[dim]note: {escape(why)}; using {escape(str(beside))}, the library beside the case "
                  "(--library chooses)[/dim]", soft_wrap=True)  # fmt: skip
        return str(beside)
    return None


def invariants(mr, pr) -> tuple:
    """Attribution's invariants of a new entry, imported only when an entry is added (0.8 s of imports)."""
    from zen.attribute.invariants import packed

    return packed(mr, pr)


def _open(spec: str | None, create: bool = True, any_thread: bool = False):
    from zen.library.backends import open_library

    return open_library(spec, create=create, invariants=invariants, any_thread=any_thread)


def _attribute_with(lib, case_dir: Path, optimal: bool) -> tuple[list[str], dict]:
    """(the case's problems, the attribution). Against a local SQLite library, candidate selection runs in
    a thread while the case is checked (`early_selection`), inside the read transaction the whole
    attribution sees; against any other, the case is checked first, as always."""
    local = lib.kind == "sqlite" and not lib.remote
    entries = len(lib) if local else None
    early = None
    with lib.snapshot() if local and entries else contextlib.nullcontext():
        early = _early_sharing(lib, case_dir) if local and entries else None
        try:
            problems = check_case(case_dir)
        finally:
            if early is not None:
                early.wait()
        if entries is None:
            entries = len(lib)
        if entries == 0:
            raise ZenError(f"the library {lib.path} is empty", EMPTY_HINT)
        if lib.remote:  # the server attributes; attribution's own modules (0.8 s of imports) are not needed here
            return problems, lib.attribute_case(case_dir, optimal=optimal)
        from zen.attribute.algorithm import attribute_case

        return problems, attribute_case(case_dir, lib, optimal=optimal, parallel=True, early=early)  # parallel_compare


def _early_sharing(lib, case_dir: Path):
    from zen.attribute.early_selection import EarlySharing

    return EarlySharing(lib, Path(case_dir) / "pr.json")


@library_app.command("add")
def add(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    name: str = typer.Option(..., "--name", help="Ground-truth name of this base model."),
    library: str | None = LIB_OPT,
    replace: bool = typer.Option(False, "--replace", help="Replace an existing entry of that name."),
    notes: str = typer.Option("", "--notes", help="Free text stored with the entry."),
) -> None:
    """Add a recovered base model's fingerprint (MR, PR, UR) to the library."""
    with _open(library) as lib:
        lib.add_case(case_dir, name, replace=replace, notes=notes)
        out.print(f"added {escape(name)} to {escape(str(lib.path))} ({len(lib)} models)")


@library_app.command("list")
def list_(library: str | None = LIB_OPT, as_json: bool = typer.Option(False, "--json")) -> None:
    """List the base models in the library."""
    with _open(library, create=False) as lib:
        _print_rows(lib.list(), as_json, str(lib.path))


@library_app.command("search")
def search(
    name: str | None = typer.Option(None, "--name", help="Name contains this (case-insensitive)."),
    framework: str | None = typer.Option(None, "--framework", help="pytorch or keras."),
    architecture: str | None = typer.Option(None, "--architecture", help="Root class contains this (e.g. GPT2, ResNet)."),
    added_by: str | None = typer.Option(None, "--added-by", help="Added by (a user@host, or token:NAME via zen serve)."),
    since: str | None = typer.Option(None, "--since", help="Added at or after (ISO date or time, UTC)."),
    until: str | None = typer.Option(None, "--until", help="Added before (ISO date or time, UTC)."),
    library: str | None = LIB_OPT,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Find base models by name, framework, architecture, who added them and when."""
    with _open(library, create=False) as lib:
        rows = lib.search(name=name, framework=framework, architecture=architecture, added_by=added_by, since=since,
                          until=until)  # fmt: skip
        _print_rows(rows, as_json, str(lib.path))


def _print_rows(rows: list[dict], as_json: bool, where: str) -> None:
    if as_json:
        out.print_json(json.dumps(rows))
        return
    t = Table("name", "root class", "modules", "code objects", "parameters", "python", "torch", "added", "by")
    for r in rows:
        s = r["summary"]
        pe = s.get("parameter_elements")
        t.add_row(escape(r["name"]), escape(r["root_class"] or "?"), str(s.get("modules")), str(s.get("code_objects")),
                  f"{pe if isinstance(pe, int) else 0:,}", escape(r["python"] or "?"), escape(r["torch"] or "?"),
                  escape(r["created"] or ""), escape(r.get("added_by") or ""))  # fmt: skip
    out.print(t)
    out.print(f"{len(rows)} models in {escape(where)}")


@library_app.command("show")
def show(name: str = typer.Argument(...), library: str | None = LIB_OPT, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show one library entry: its architecture and model code."""
    with _open(library, create=False) as lib:
        info = lib.show(name)
    if as_json:
        out.print_json(json.dumps(info))
        return
    e = {k: escape(str(v)) for k, v in info.items() if isinstance(v, str | None)}
    out.print(f"[bold]{e['name']}[/bold]: {e['root_class']} (Python {e['python']}, torch {e['torch']}, added {e['created']}"
              + (f" by {e['added_by']}" if info.get("added_by") else "") + ")")  # fmt: skip
    out.print(f"source image sha256: {e['source_sha256']}")
    out.print("layers: " + escape(", ".join(f"{k.rsplit('.', 1)[-1]}×{v}" for k, v in info["layer_types"].items())))
    out.print(
        f"model code: {info['code_objects']} code objects, {len(info['classes'])} classes in {len(info['modules'])} modules"
    )
    for m in sorted(info["modules"])[:30]:
        out.print(f"  {escape(m)}")


@library_app.command("remove")
def remove(name: str = typer.Argument(...), library: str | None = LIB_OPT) -> None:
    """Remove a base model from the library (through zen serve: a curate token)."""
    with _open(library, create=False) as lib:
        lib.remove(name)
        out.print(f"removed {escape(name)} ({len(lib)} models left)")


@library_app.command("audit")
def audit(
    name: str | None = typer.Option(None, "--name", help="Only the writes of this entry."),
    limit: int = typer.Option(50, "--limit", help="How many of the latest writes."),
    library: str | None = LIB_OPT,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The library's latest writes: who added, replaced, removed or imported what, when, with which digests."""
    with _open(library, create=False) as lib:
        rows = lib.audit_log(name=name, limit=limit)
    if as_json:
        out.print_json(json.dumps(rows))
        return
    t = Table("when", "who", "action", "name", "digests")
    for r in rows:
        d = r["digests"]
        short = ", ".join(f"{k} {v[:12]}" for k, v in sorted(d.items()) if isinstance(v, str)) or r["detail"]
        t.add_row(r["at"], escape(r["who"]), r["action"], escape(r["name"]), escape(short))
    out.print(t)


@library_app.command("export")
def export(
    output: Path = typer.Option(..., "-o", "--output", help="JSON file to write."),
    names: list[str] = typer.Option(None, "--name", help="Export only these models (repeatable)."),
    library: str | None = LIB_OPT,
) -> None:
    """Export library entries as JSON, to share a library."""
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the export")
    with _open(library, create=False) as lib:
        n = lib.export(output, names or None)
        out.print(f"exported {n} models to {output}")


@library_app.command("import")
def import_(
    file: Path = typer.Argument(..., help="A file written by `zen library export`."),
    library: str | None = LIB_OPT,
    replace: bool = typer.Option(False, "--replace", help="Replace entries that already exist."),
) -> None:
    """Import entries exported from another library."""
    with _open(library) as lib:
        names = lib.import_(file, replace=replace)
        out.print(f"imported {len(names)} models: {', '.join(names)}")


@library_app.command("build")
def build(
    recipe: Path = typer.Argument(..., help="A recipe (TOML) of base models to deploy, image and add."),
    library: str | None = LIB_OPT,
    only: list[str] = typer.Option(None, "--only", help="Build only these recipe entries (repeatable)."),
    replace: bool = typer.Option(False, "--replace", help="Replace entries that already exist."),
) -> None:
    """Deploy each recipe model in a fresh process, image it, recover it and add it to the library."""
    from zen.library.build import build as do_build

    with _open(library) as lib:
        added = do_build(recipe, lib, only=only or None, replace=replace, log=lambda m: err.print(m))
        out.print(f"built {len(added)} models into {lib.path}: {', '.join(added)}")


def attribute(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    library: str | None = LIB_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print {attributed, candidates} as JSON."),
    optimal: bool = typer.Option(True, "--optimal/--no-optimal", help="Also compute the optimal code assignment."),
) -> None:
    """Attribute a recovered model to a base model in the library (ZEN Algorithm 1). Against a zen serve, only the
    case's mr.json and pr.json are sent; the server ranks its whole library."""
    library = library_for(case_dir, library)
    try:
        lib = _open(library, create=False, any_thread=True)
    except ZenError:
        check_case(case_dir)  # a problem with the case is reported first, as always
        raise
    # No cyclic collection during this command: the case records (a transformers pr.json is a million
    # objects) and the candidates' views are acyclic and live to the end, and where a full collection fell
    # depended on unrelated allocations (one module more imported made a CNN query 0.1 s slower: a full
    # pass, and 45 MB of memory freed and faulted back in).
    collecting = gc.isenabled()
    gc.disable()
    try:
        with lib:
            problems, res = _attribute_with(lib, case_dir, optimal)
    finally:
        if collecting:
            gc.enable()
    if as_json:
        out.print_json(json.dumps(res))
        if problems:
            raise typer.Exit(EXIT_PARTIAL)
        return
    from zen.cli.tables import print_rows

    def n(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"  # None: the PR side of a compiled model

    rows = [[escape(j["name"]), n(j["ur"]), n(j["mr"]), n(j["pr"]), n(j["arch"]), n(j["ts"]), n(j["op"]), n(j["graph"]),
             n(j["cos"]), n(j["cls"]), str(j.get("exact", "-")), str(j.get("matched", "-")), str(j.get("added", "-")),
             escape(j["method"])] for j in res["candidates"][:15]]  # fmt: skip
    print_rows(out, ["base model", "UR", "MR", "PR", "Arch", "TS", "OP", "graph", "COs", "CLS", "identical", "changed",
                     "added", "method"], rows)  # fmt: skip
    if res["attributed"]:
        out.print(f"[bold]attributed to {escape(res['attributed'])}[/bold]")
    else:
        out.print(f"[bold]{escape(res['message'])}[/bold]")
    out.print(escape(res["explanation"]))
    if problems:
        raise typer.Exit(EXIT_PARTIAL)
