"""`zen demo`: the whole method on real processes, checked against what they say about themselves.

1. a *base* model process (tiny_base.py: the public code) is imaged and recovered, and its
   fingerprint added to a fresh base-model library in the demo directory;
2. the *deployed* process (deployed_model.py: a customised fork) is imaged; everything after
   works on that image file alone: the interpreter is found, the model recovered (module tree,
   hyper-parameters, every tensor) with the code implementing it;
3. the model is attributed to the library's base, and diffed against it (what the fork changed);
4. a reuse package is written (base code + patch + recovered weights) and, in a separate process
   because this step EXECUTES recovered code, rebuilt and run on the request the deployed process
   served: its output must be bit-identical to the response the process returned;
5. a forensic report (report.html) puts it together.

The processes' self-descriptions (truth.json, request/response files) are used only for checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zen.represent import textio
from zen.runtime import childproc
from zen.runtime.errors import ZenError

BASE_NAME = "tiny-base"
MARKER = ".zen-demo"  # marks a directory `zen demo` may write into again


def _serve_and_image(cmd: list[str], outdir: Path, image: Path, console: Console, what: str) -> dict:
    """Run a model process, image it (lean), stop it; returns its truth.json."""
    from zen.acquire.process import acquire

    outdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd + [str(outdir.resolve())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=outdir)  # fmt: skip
    try:
        with console.status(f"starting the {what} process (imports torch, builds the model, serves a request)..."):
            line = proc.stdout.readline().strip()
        if line != "READY":
            raise ZenError(f"the demo's {what} process failed to start: {proc.stderr.read()[-500:]}",
                           "is torch installed? (the README's install command installs it)")  # fmt: skip
        res = acquire(proc.pid, image, lean=True)
        console.print(f"PID {proc.pid} ({what}) imaged to {image.name}: {res.bytes_written / 1e6:,.0f} MB (lean) "
                      f"in {res.seconds:.2f} s; the process kept running")  # fmt: skip
    finally:
        childproc.stop_process(proc)
    return json.loads((outdir / "truth.json").read_text())


def _library(workdir: Path, console: Console, keep: bool) -> Path:
    from zen.library.store import Library
    from zen.recover.run import recover

    console.rule("[bold]1. the public base model, into a base-model library")
    image = workdir / "base.core"
    _serve_and_image(childproc.code_argv("import sys; from zen.demo.tiny_base import serve; serve(sys.argv[1])"),
                     workdir / "base-process", image, console, "base model")  # fmt: skip
    res = recover(image, None, workdir / "base-case", force=True)  # the demo owns its --dir: a rerun replaces it
    if not keep:
        image.unlink(missing_ok=True)
        console.print(f"recovered; {image.name} deleted (--keep keeps the images)")
    lib_path = workdir / "library.sqlite"
    lib_path.unlink(missing_ok=True)
    from zen.attribute.invariants import packed

    with Library(lib_path, invariants=packed) as lib:
        lib.add_case(workdir / "base-case", BASE_NAME)
    console.print(f"recovered {res.mr.root.cls} ({len(res.mr.modules)} modules) and added it as {BASE_NAME!r} to {lib_path}")
    return lib_path


def _recover(workdir: Path, console: Console, keep: bool):
    from zen.recover.run import recover

    console.rule("[bold]2. the deployed model process, recovered from its image alone")
    image = workdir / "deployed.core"
    truth = _serve_and_image(childproc.script_argv(Path(__file__).with_name("deployed_model.py")), workdir / "deployed-process",
                             image, console, "deployed model")  # fmt: skip
    case_dir = workdir / "case"
    res = recover(image, None, case_dir, force=True)
    if not keep:
        image.unlink(missing_ok=True)
        console.print(f"recovered; {image.name} deleted (--keep keeps the images)")
    mr = res.mr
    console.print(f"Python {res.manifest['python']['version']}, torch {res.manifest['torch']['version']}; "
                  f"{len(mr.roots)} model root(s); chose {mr.root.cls} at {mr.root.address} "
                  f"(referenced from {', '.join(mr.root.referenced_from) or 'nowhere'})")  # fmt: skip
    table = Table("module", "class", "hyper-parameters")
    for m in mr.modules:
        hp = ", ".join(f"{k}={v}" for k, v in m.hyperparameters.items() if k != "training")
        table.add_row(m.path or "<root>", m.cls_qualname, hp)
    console.print(table)
    s = mr.summary
    console.print(f"{s['state_dict_entries']} tensors, {s['parameter_elements']:,} parameter elements, dtypes {s['dtypes']} "
                  f"-> {case_dir / 'weights.safetensors'}")  # fmt: skip
    from zen.represent import case

    pr = case.load_pr(case_dir)
    mine = [c for c in pr.codes if c.module == "__main__" and c.parent is None]
    console.print("the model's own code, rebuilt from the image (never executed): "
                  + ", ".join(f"{c.qualname}{c.signature.text() if c.signature else ''}" for c in mine))  # fmt: skip
    return case_dir, truth, mr, pr


def _attribute_and_diff(case_dir: Path, lib_path: Path, mr, pr, console: Console):
    from zen.attribute.algorithm import attribute
    from zen.library.store import Library
    from zen.reuse.package import make_patch

    console.rule("[bold]3. attribution and what the fork changed")
    with Library(lib_path) as lib:
        att = attribute(mr, pr, lib)
        entry = lib.get(BASE_NAME)
        patch, d = make_patch(case_dir, entry)
    best = att.candidates[0] if att.candidates else None
    if best is not None:
        j = best.to_json()
        console.print(f"attributed to [bold]{att.attributed}[/bold]: UR {j['ur']:.2f} (MR {j['mr']:.2f}, PR {j['pr']:.2f})")
    console.print(att.explanation)
    for f in d.changed:
        console.print(f"  ~ {f.target_module}:{f.target_qualname} <- {f.recovered.qualname}: {', '.join(f.changes)}")
    for f in d.added:
        console.print(f"  + {f.target_module}:{f.target_qualname} (new: {f.recovered.fid})")
    return att, patch, d


def _rebuild(case_dir: Path, workdir: Path, patch: dict, d, truth_dir: Path, console: Console) -> dict:
    from zen.reuse.package import write_package

    console.rule("[bold]4. a runnable copy: the base's code patched, recovered weights loaded")
    pkg = write_package(case_dir, workdir / "rebuilt_model", patch, d.summary())
    console.print(f"wrote the package {pkg} (import rebuilt_model; rebuilt_model.load())")
    console.print("[yellow]running it EXECUTES code recovered from the image: done in a separate process[/yellow]")
    cmd = childproc.module_argv("zen", ["verify", pkg.resolve(), "--inputs", (truth_dir / "request.safetensors").resolve(),
                                        "--expect", (truth_dir / "response.safetensors").resolve(), "--json"])  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    proc = childproc.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    try:
        res = json.loads(proc.stdout)
    except ValueError:
        raise ZenError(f"rebuilding the model failed: {proc.stderr.strip()[-800:]}") from None
    r = res["results"][0]
    console.print(f"rebuilt {res['report']['graph']['modules']} modules, {res['report']['graph']['parameters']} parameters; "
                  f"patch replaced {len(res['report']['patch']['replaced'])} and created {res['report']['patch']['created']} "
                  f"objects; output on the served request bit-identical to the deployed response: {r.get('equal')}")  # fmt: skip
    return res


def run_demo(workdir: Path, console: Console, keep: bool = False) -> dict:
    """Run the demo in `workdir`; returns a summary dict (also printed)."""
    workdir = Path(workdir)
    marker = workdir / MARKER
    if workdir.exists() and (not workdir.is_dir() or (any(workdir.iterdir()) and not marker.exists())):
        raise ZenError(f"refusing to write the demo into {workdir}: it exists and is not a previous demo's directory",
                       "give a new directory with --dir DIR")  # fmt: skip
    if marker.exists():
        console.print(f"replacing the previous demo in {workdir}")
    workdir.mkdir(parents=True, exist_ok=True)
    marker.write_text("written by `zen demo`; a later `zen demo --dir` here replaces this directory's files\n")
    t_start = time.perf_counter()
    lib_path = _library(workdir, console, keep)
    case_dir, truth, mr, pr = _recover(workdir, console, keep)
    att, patch, d = _attribute_and_diff(case_dir, lib_path, mr, pr, console)
    rebuilt = _rebuild(case_dir, workdir, patch, d, workdir / "deployed-process", console)

    console.rule("[bold]5. checks against what the processes said about themselves")
    found_classes = sorted({m.cls_qualname for m in mr.modules})
    expected = sorted(set(truth["modules"].values()))
    exact = sum(1 for t in mr.tensors if t.sha256 == truth["state_sha256"].get(t.key))
    same_root = mr.root.address == hex(truth["model_id"])
    helper = any(c.qualname == "channel_shuffle" for c in pr.codes)
    identical = bool(rebuilt["results"][0].get("equal"))
    ok = (same_root and found_classes == expected and exact == len(truth["state_sha256"]) and helper
          and att.attributed == BASE_NAME and identical)  # fmt: skip
    attributed = att.attributed == BASE_NAME
    console.print(f"model object: {same_root}; module classes match: {found_classes == expected}; "
                  f"tensors bit-exact: {exact}/{len(truth['state_sha256'])}; helper code recovered: {helper}; "
                  f"attributed to the base: {attributed}; rebuilt output bit-identical: {identical}")  # fmt: skip
    from zen.report.gather import gather
    from zen.report.html import render

    report = workdir / "report.html"
    textio.write_text(report, render(gather(case_dir, library=lib_path, base=BASE_NAME, reuse_dir=workdir / "rebuilt_model")))
    console.print(f"forensic report: {report}")
    elapsed = time.perf_counter() - t_start
    console.print(f"[bold]{'OK' if ok else 'MISMATCH'}[/bold]: demo finished in {elapsed:.1f} s; case: {case_dir}")
    return {
        "ok": ok,
        "seconds": elapsed,
        "case": str(case_dir),
        "attributed": att.attributed,
        "identical": identical,
        "report": str(report),
    }
