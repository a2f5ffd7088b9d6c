"""`zen recover` and `zen demo`: from an image (or a live process) to a case directory."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen.cli.inspect import GPU_HELP, IMAGE_HELP, PID_HELP, SYMBOLS_HELP, _frozen
from zen.evidence.outpaths import require_parent
from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

out, err = consoles()
EXIT_PARTIAL = 5
MODEL_HELP = "Which model root: address, #RANK, a referencing name, or `all` (one case per root: CASE/RANK-CLASS/)."
LIMIT_HELP = "NAME=VALUE: raise or lower a bound on what is read from the image (max_str, max_items, ...; see README)."
OFFLOAD_HELP = "A folder or file holding tensors accelerate offloaded to disk (repeatable): read, sha256 in evidence."


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
    force: bool = typer.Option(False, "--force", help="Replace an existing case at -o (a signed one loses its signature)."),
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

        if force and (output / "manifest.json").is_file():  # replacing a case is never silent
            err.print(f"[dim]note: replacing the case in {escape(str(output))}[/dim]", soft_wrap=True)
        opts = dict(progress=tick, symbols=symbols, limits=limit, gpu=gpu, rehash=rehash, offload=offload, force=force)
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


def demo(
    workdir: Path = typer.Option(Path("zen-demo"), "--dir", help="Where the demo writes its image and files."),
    keep: bool = typer.Option(False, "--keep", help="Keep the memory image afterwards."),
) -> None:
    """Image a small model-serving process and show what zen recovers from the image alone."""
    from zen.demo import run_demo

    res = run_demo(workdir, out, keep=keep)
    if not res["ok"]:
        raise typer.Exit(1)
