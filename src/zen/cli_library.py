"""`zen library ...` and `zen attribute`: the Base Model Library and attribution on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen.console import consoles
from zen.errors import ZenError

library_app = typer.Typer(no_args_is_help=True, help="The Base Model Library: fingerprints of known base models.")
out, err = consoles()

LIB_OPT = typer.Option(None, "--library", help="Library file (default: $ZEN_LIBRARY or ~/.local/share/zen/library.sqlite).")


EXIT_PARTIAL = 5


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


def _library_beside(case_dir: Path) -> Path | None:
    """With no --library and no default library, the one beside the case (where `zen demo` puts it), said aloud."""
    from zen.library.store import default_library_path

    if default_library_path().exists():
        return None
    beside = Path(case_dir).absolute().parent / "library.sqlite"
    if beside.is_file():
        err.print(f"[dim]note: no library at {escape(str(default_library_path()))}; using {escape(str(beside))}, "
                  "the one beside the case (--library chooses)[/dim]")  # fmt: skip
        return beside
    return None


def _open(path: Path | None, create: bool = True):
    from zen.library.store import Library

    return Library(path, create=create)


@library_app.command("add")
def add(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    name: str = typer.Option(..., "--name", help="Ground-truth name of this base model."),
    library: Path | None = LIB_OPT,
    replace: bool = typer.Option(False, "--replace", help="Replace an existing entry of that name."),
    notes: str = typer.Option("", "--notes", help="Free text stored with the entry."),
) -> None:
    """Add a recovered base model's fingerprint (MR, PR, UR) to the library."""
    with _open(library) as lib:
        lib.add_case(case_dir, name, replace=replace, notes=notes)
        out.print(f"added {name} to {lib.path} ({len(lib)} models)")


@library_app.command("list")
def list_(library: Path | None = LIB_OPT, as_json: bool = typer.Option(False, "--json")) -> None:
    """List the base models in the library."""
    with _open(library, create=False) as lib:
        rows = lib.list()
        if as_json:
            out.print_json(json.dumps(rows))
            return
        t = Table("name", "root class", "modules", "code objects", "parameters", "python", "torch", "added")
        for r in rows:
            s = r["summary"]
            t.add_row(r["name"], r["root_class"] or "?", str(s["modules"]), str(s["code_objects"]),
                      f"{s.get('parameter_elements') or 0:,}", r["python"] or "?", r["torch"] or "?", r["created"])  # fmt: skip
        out.print(t)
        out.print(f"{len(rows)} models in {lib.path}")


@library_app.command("show")
def show(name: str = typer.Argument(...), library: Path | None = LIB_OPT, as_json: bool = typer.Option(False, "--json")) -> None:
    """Show one library entry: its architecture and model code."""
    with _open(library, create=False) as lib:
        e = lib.get(name)
        mr, pr = e.mr, e.pr
        info = {"name": e.name, "created": e.created, "source_sha256": e.source_sha256, "python": e.python, "torch": e.torch,
                "root_class": e.root_class, "notes": e.notes, "summary": e.summary, "layer_types": mr.layer_types,
                "modules": pr.modules, "classes": sorted(c.name for c in pr.classes)}  # fmt: skip
        if as_json:
            out.print_json(json.dumps(info))
            return
        out.print(f"[bold]{e.name}[/bold]: {e.root_class} (Python {e.python}, torch {e.torch}, added {e.created})")
        out.print(f"source image sha256: {e.source_sha256}")
        out.print("layers: " + ", ".join(f"{k.rsplit('.', 1)[-1]}×{v}" for k, v in mr.layer_types.items()))
        out.print(f"model code: {len(pr.codes)} code objects, {len(pr.classes)} classes in {len(pr.modules)} modules")
        for m in sorted(pr.modules)[:30]:
            out.print(f"  {m}")


@library_app.command("remove")
def remove(name: str = typer.Argument(...), library: Path | None = LIB_OPT) -> None:
    """Remove a base model from the library."""
    with _open(library, create=False) as lib:
        lib.remove(name)
        out.print(f"removed {name} ({len(lib)} models left)")


@library_app.command("export")
def export(
    output: Path = typer.Option(..., "-o", "--output", help="JSON file to write."),
    names: list[str] = typer.Option(None, "--name", help="Export only these models (repeatable)."),
    library: Path | None = LIB_OPT,
) -> None:
    """Export library entries as JSON, to share a library."""
    from zen.outpaths import require_parent

    require_parent(output, "the export")
    with _open(library, create=False) as lib:
        n = lib.export(output, names or None)
        out.print(f"exported {n} models to {output}")


@library_app.command("import")
def import_(
    file: Path = typer.Argument(..., help="A file written by `zen library export`."),
    library: Path | None = LIB_OPT,
    replace: bool = typer.Option(False, "--replace", help="Replace entries that already exist."),
) -> None:
    """Import entries exported from another library."""
    with _open(library) as lib:
        names = lib.import_(file, replace=replace)
        out.print(f"imported {len(names)} models: {', '.join(names)}")


@library_app.command("build")
def build(
    recipe: Path = typer.Argument(..., help="A recipe (TOML) of base models to deploy, image and add."),
    library: Path | None = LIB_OPT,
    only: list[str] = typer.Option(None, "--only", help="Build only these recipe entries (repeatable)."),
    replace: bool = typer.Option(False, "--replace", help="Replace entries that already exist."),
) -> None:
    """Deploy each recipe model in a fresh process, image it, recover it and add it to the library."""
    from zen.library.recipes import build as do_build

    with _open(library) as lib:
        added = do_build(recipe, lib, only=only or None, replace=replace, log=lambda m: err.print(m))
        out.print(f"built {len(added)} models into {lib.path}: {', '.join(added)}")


def attribute(
    case_dir: Path = typer.Argument(..., help="A case directory written by `zen recover`."),
    library: Path | None = LIB_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print {attributed, candidates} as JSON."),
    optimal: bool = typer.Option(True, "--optimal/--no-optimal", help="Also compute the optimal code assignment."),
) -> None:
    """Attribute a recovered model to a base model in the library (ZEN Algorithm 1)."""
    from zen.attribute.algorithm import attribute as do_attribute
    from zen.represent import case

    problems = check_case(case_dir)
    mr, pr = case.load_mr(case_dir), case.load_pr(case_dir)
    library = library if library is not None else _library_beside(case_dir)
    with _open(library, create=False) as lib:
        if len(lib) == 0:
            raise ZenError(f"the library {lib.path} is empty", "add base models with `zen library add` or `zen library build`")
        res = do_attribute(mr, pr, lib, optimal=optimal)
    if as_json:
        out.print_json(json.dumps(res.to_json()))
        if problems:
            raise typer.Exit(EXIT_PARTIAL)
        return
    t = Table(
        "base model", "UR", "MR", "PR", "Arch", "TS", "OP", "graph", "COs", "CLS", "identical", "changed", "added", "method"
    )
    def n(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"  # None: the PR side of a compiled model

    for c in res.candidates[:15]:
        j = c.to_json()
        t.add_row(c.name, n(j["ur"]), n(j["mr"]), n(j["pr"]), n(j["arch"]), n(j["ts"]),
                  n(j["op"]), n(j["graph"]), n(j["cos"]), n(j["cls"]), str(j.get("exact", "-")),
                  str(j.get("matched", "-")), str(j.get("added", "-")), c.method)  # fmt: skip
    out.print(t)
    if res.attributed:
        out.print(f"[bold]attributed to {res.attributed}[/bold]")
    else:
        out.print(f"[bold]{res.message}[/bold]")
    out.print(res.explanation)
    if problems:
        raise typer.Exit(EXIT_PARTIAL)
