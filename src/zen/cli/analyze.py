"""`zen analyze` and `zen drift`: what investigators do with a recovered model.

`analyze` EXECUTES code recovered from the image (in a child process) and says so; `drift` reads
case files only.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

out, err = consoles()
EXIT_PARTIAL = 5


def analyze(
    target: Path = typer.Argument(..., help="A case directory (`zen recover`) or a reuse package (`zen reuse`)."),
    output: Path = typer.Option(..., "-o", "--output", help="Directory for analysis.json, adversarial examples and plots."),
    inputs: Path | None = typer.Option(
        None,
        "--inputs",
        help="safetensors file: the batch as 'x' (or its only tensor), "
        "optional integer 'labels'. Default: the inputs recovered from the image, else "
        "inputs made from the model's input spec.",
    ),
    attack: str = typer.Option("fgsm,pgd", "--attack", help="Attacks to run: fgsm, pgd (comma-separated), or none."),
    eps: str = typer.Option("0.01,0.03,0.1", "--eps", help="L-inf epsilons, in input units (comma-separated)."),
    backdoor: bool = typer.Option(False, "--backdoor", help="Also search for backdoors with Neural Cleanse (ART)."),
    clip: str | None = typer.Option(None, "--clip", help="MIN,MAX: the valid input range (e.g. 0,1); default none."),
    seed: int = typer.Option(0, "--seed", help="Seed of PGD's random start, Neural Cleanse and made-up inputs."),
    batch_size: int = typer.Option(32, "--batch-size", help="Batch size of the attacks and of Neural Cleanse."),
    pgd_steps: int = typer.Option(10, "--pgd-steps", help="PGD iterations (step size eps/4, one random start)."),
    nc_steps: int = typer.Option(100, "--nc-steps", help="Neural Cleanse: most optimisation epochs per class."),
    input_shape: str | None = typer.Option(
        None, "--input-shape", help="C,H,W (or F): make inputs of this sample shape (instead of recovered ones)."
    ),
    samples: int = typer.Option(16, "--samples", help="How many inputs to make from the spec."),
    threads: int = typer.Option(1, "--threads", help="torch threads (1 makes CPU results reproducible)."),
    device: str = typer.Option("cpu", "--device", help="Run the model on this device (cpu, cuda:0)."),
    timeout: float = typer.Option(3600.0, "--timeout", help="Seconds allowed for the analysis process."),
    as_json: bool = typer.Option(False, "--json", help="Print analysis.json."),
    memory_check: bool = typer.Option(
        True,
        "--memory-check/--no-memory-check",
        help="Refuse a model needing more memory than is available (its tensors' bytes, plus 1 GiB).",
    ),  # fmt: skip
) -> None:
    """Rebuild the model and run ART on it: FGSM and PGD robustness, and (--backdoor) Neural Cleanse.

    EXECUTES code recovered from the image, in a child process. Writes DIR/analysis.json, adversarial.safetensors,
    robustness.png, and with --backdoor triggers.safetensors, anomaly.png and trigger_class_K.png."""
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the analysis")
    from zen.analyze.run import EXECUTES, parse_attacks, parse_floats
    from zen.analyze.run import analyze as do_analyze

    shape = None
    if input_shape is not None:
        try:
            shape = [int(v) for v in input_shape.split(",") if v.strip()]
        except ValueError:
            shape = []
        if not shape or any(v < 1 for v in shape):
            raise ZenError(f"--input-shape {input_shape!r}: give positive integers, e.g. 3,32,32")
    doc = do_analyze(target, output, inputs=inputs, attacks=parse_attacks(attack), eps=parse_floats(eps, "--eps"),
                     backdoor=backdoor, seed=seed, clip=parse_floats(clip, "--clip", 2) if clip else None,
                     batch_size=batch_size, pgd_steps=pgd_steps, nc_steps=nc_steps, input_shape=shape, samples=samples,
                     threads=threads, device=device, timeout=timeout, memory_check=memory_check,
                     on_execute=lambda: err.print(f"[yellow]warning:[/yellow] {EXECUTES}"))  # fmt: skip
    if as_json:
        out.print_json(json.dumps(doc))
        return
    _show_analysis(doc, output)


def _show_analysis(doc: dict, output: Path) -> None:
    s = doc["subject"]
    out.print(f"[bold]{escape(s['model'])}[/bold] ({s['kind']}; {doc['model']['classes']} classes, input "
              f"{doc['model']['input_shape']})")  # fmt: skip
    out.print(f"inputs: {escape(doc['inputs']['describe'])}")
    rob = doc.get("robustness")
    if rob:
        lab = rob["labelled"]
        t = Table("attack", "eps", "accuracy" if lab else "predictions changed", "max |delta|", "mean L2")
        if lab:
            t.add_row("clean", "0", f"{rob['clean_accuracy']:.3f}", "", "")
        for name, rows in rob["attacks"].items():
            for r in rows:
                t.add_row(name.upper(), f"{r['eps']:g}", f"{r['accuracy'] if lab else r['changed']:.3f}", f"{r['max_linf']:.4g}",
                          f"{r['mean_l2']:.4g}")  # fmt: skip
        out.print(t)
    bd = doc.get("backdoor")
    if bd:
        t = Table("class", "trigger L1", "anomaly index", "flagged")
        for c in bd["classes"]:
            t.add_row(str(c["class"]), f"{c['l1']:.2f}", f"{c['anomaly_index']:.2f}", "[red]YES[/red]" if c["flagged"] else "")
        out.print(t)
        verdict = (f"[red]backdoor suspected at class {', '.join(map(str, bd['flagged']))}[/red] (anomaly index > "
                   f"{bd['threshold']:g})") if bd["flagged"] else "no class flagged by Neural Cleanse"  # fmt: skip
        out.print(verdict)
    for p in doc.get("load_problems") or []:
        err.print(f"[yellow]not rebuildable:[/yellow] {escape(str(p))}", soft_wrap=True)
    out.print(f"wrote {escape(str(output / 'analysis.json'))} and {len(doc['files'])} files")


def drift(
    cases: list[Path] = typer.Argument(..., help="Cases recovered from snapshots of one process, oldest first."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Directory for drift.json and drift_timeline.png."),
    as_json: bool = typer.Option(False, "--json", help="Print drift.json."),
    top: int = typer.Option(30, "--top", help="Layers shown (the whole table is in drift.json)."),
) -> None:
    """Weight drift between snapshots of one model: per tensor and layer, L2, relative change, cosine, elements
    changed and the first snapshot where it changed. Refuses cases that are not one model (exit 2)."""
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the drift results")
    from zen.analyze import plots
    from zen.analyze.drift import compute
    from zen.represent import textio
    from zen.represent.case import file_sha256

    if output is not None and output.exists() and not output.is_dir():
        raise ZenError(f"{output} exists and is not a directory", "choose a new directory")
    doc = compute(cases)
    if output is not None:
        output.mkdir(parents=True, exist_ok=True)
        png = output / "drift_timeline.png"
        png.write_bytes(plots.drift_timeline(doc))
        doc["files"] = {png.name: file_sha256(png)}
        textio.write_json(output / "drift.json", doc, indent=1)
    if as_json:
        out.print_json(json.dumps(doc))
    else:
        _show_drift(doc, output, top)
    for p in doc["problems"]:
        err.print(f"[yellow]problem: {escape(p)}[/yellow]", soft_wrap=True)
    if doc["not_compared"]:
        raise typer.Exit(EXIT_PARTIAL)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def _show_drift(doc: dict, output: Path | None, top: int) -> None:
    snaps = doc["snapshots"]
    out.print(f"[bold]{escape(doc['model'])}[/bold]: {len(snaps)} snapshots, one model (architecture and code identical)")
    for s in snaps:
        out.print(f"  {s['index']}: {escape(s['case'])}  acquired {s.get('acquired_at') or '?'}")
    t = Table("layer", "elements", "L2 vs snapshot 0", "relative", "cosine", "changed", "first changed")
    for lay in [doc["model_drift"]] + doc["layers"][:top]:
        last = lay["snapshots"][-1]
        first = lay["first_changed"]
        t.add_row(escape(lay["name"]), f"{lay['elements']:,}", _fmt(last["l2"]), _fmt(last["relative"]), _fmt(last["cosine"]),
                  f"{100 * last['changed']:.1f}%", "never" if first is None else f"snapshot {first}")  # fmt: skip
    out.print(t)
    if len(doc["layers"]) > top:
        out.print(f"... {len(doc['layers']) - top} more layers in drift.json")
    for c in doc["counters"][:10]:
        last = c["snapshots"][-1]
        out.print(f"integer tensor {escape(c['name'])}: L2 {_fmt(last['l2'])} vs snapshot 0, first changed "
                  + ("never" if c["first_changed"] is None else f"at snapshot {c['first_changed']}"))  # fmt: skip
    for h in doc["hyperparameters_changed"][:10]:
        out.print(f"hyper-parameter {escape(h['module'])}.{escape(h['name'])}: {escape(' -> '.join(map(str, h['values'])))}")
    moved = [e for e in doc["extra"] if e["first_changed"] is not None]
    if doc["extra"]:
        out.print(f"tensors outside the state_dict: {len(doc['extra'])} compared, {len(moved)} changed")
    out.print(f"optimizer: {escape(doc['optimizer']['note'])}")
    if output is not None:
        out.print(f"wrote {escape(str(output / 'drift.json'))} and drift_timeline.png")
