"""`zen demo`: image a real model-serving process and show what zen recovers from the image alone.

The demo starts `deployed_model.py` (a small classifier with custom code) as its own process,
images it with zen's acquisition, then works only on the image file: finds the interpreter,
recovers the model (module tree, hyper-parameters, every tensor) into a case directory, and
rebuilds the code of the model's own classes and helpers. Nothing recovered is executed; the
rebuilt code is shown disassembled. The process's self-description (truth.json: its module
classes and a sha256 of every state_dict tensor) is used only for the check at the end.
"""

from __future__ import annotations

import dis
import io
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zen.errors import ZenError


def _start(workdir: Path, console: Console) -> tuple[Path, dict]:
    """Run the deployed model process, image it, stop it; returns (image, its truth.json)."""
    from zen.acquire import acquire

    script = Path(__file__).with_name("deployed_model.py")
    console.rule("[bold]1. a deployed model process")
    proc = subprocess.Popen([sys.executable, str(script), str(workdir)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        with console.status("starting the model process (imports torch, builds a classifier, runs inference)..."):
            line = proc.stdout.readline().strip()
        if line != "READY":
            raise ZenError(f"the demo model process failed to start: {proc.stderr.read()[-500:]}",
                           "is torch installed? (the README's install command installs it)")  # fmt: skip
        console.print(f"PID {proc.pid} is serving a model; zen now images it")
        image = workdir / "deployed.core"
        console.rule("[bold]2. acquisition")
        res = acquire(proc.pid, image, lean=True)
        console.print(f"wrote {image} ({res.bytes_written / 1e6:,.0f} MB, lean) in {res.seconds:.2f} s; the process kept running")
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(30)
    return image, json.loads((workdir / "truth.json").read_text())


def run_demo(workdir: Path, console: Console, keep: bool = False) -> dict:
    """Run the demo in `workdir`; returns a summary dict (also printed)."""
    from zen.cpython.codebuild import can_rebuild, rebuild_code
    from zen.cpython.interp import Interpreter
    from zen.cpython.readers.dicts import dict_str_items
    from zen.cpython.readers.functions import read_function
    from zen.memory import open_space
    from zen.recover import recover

    workdir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    image, truth = _start(workdir, console)

    console.rule("[bold]3. recovery from the image alone")
    case_dir = workdir / "case"
    res = recover(image, None, case_dir)
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
    if mr.inputs:
        i = mr.inputs[0]
        console.print(f"last input found in the heap: {i['shape']} {i['dtype']} at {i['address']} ({i['reason']})")
    console.print("data flow recovered from forward bytecode: "
                  + ", ".join(f"{a}->{b}" for a, b in mr.graph.get("dataflow", []) if ":" not in a + b)[:400])  # fmt: skip

    console.rule("[bold]4. the model's own code, rebuilt from the image (never executed)")
    space = open_space(image)
    ip = Interpreter.open(space)
    custom = {}
    for m in mr.modules:
        if not m.cls_module.startswith("torch."):
            custom.setdefault(m.cls, int(m.address, 16))
    rebuilt = []
    helper_globals = None
    for cls, addr in custom.items():
        t = ip.type_info(ip.type_of(addr))
        for name, v in dict_str_items(ip, t.dict_addr):
            if ip.kind(v) == "function":
                f = read_function(ip, v)
                rebuilt.append((f"{cls}.{name}", f))
                helper_globals = f.globals
    module_name = next(iter(custom)).rsplit(".", 1)[0] if custom else None
    if helper_globals:
        for name, v in dict_str_items(ip, helper_globals):
            if ip.kind(v) == "function":
                f = read_function(ip, v)
                if f.module == module_name and f.qualname == name:
                    rebuilt.append((f"{module_name}.{name}", f))
    for label, f in rebuilt:
        if not can_rebuild(ip):
            console.print(f"[bold]{label}[/bold] (Python {ip.P.minor} code: listed, not rebuilt in this interpreter)")
            continue
        code = rebuild_code(ip, f.code)
        args = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        console.print(f"[bold]{label}[/bold]({', '.join(args)})  ({code.co_filename}:{code.co_firstlineno})")
        if f.qualname == "channel_shuffle":
            buf = io.StringIO()
            dis.dis(code, file=buf)
            console.print(buf.getvalue().rstrip(), markup=False)
    space.close()

    console.rule("[bold]5. check against what the process said about itself")
    found_classes = sorted({m.cls_qualname for m in mr.modules})
    expected = sorted(set(truth["modules"].values()))
    exact = sum(1 for t in mr.tensors if t.sha256 == truth["state_sha256"].get(t.key))
    ok = (mr.root.address == hex(truth["model_id"]) and found_classes == expected and exact == len(truth["state_sha256"])
          and any(label.endswith(".channel_shuffle") for label, _ in rebuilt))  # fmt: skip
    same_root = mr.root.address == hex(truth["model_id"])
    console.print(f"model object: {same_root}; module classes match: {found_classes == expected}; "
                  f"tensors bit-exact: {exact}/{len(truth['state_sha256'])}")  # fmt: skip
    elapsed = time.perf_counter() - t_start
    console.print(f"[bold]{'OK' if ok else 'MISMATCH'}[/bold]: demo finished in {elapsed:.1f} s; case: {case_dir}")
    if not keep:
        image.unlink(missing_ok=True)
    return {"ok": ok, "seconds": elapsed, "case": str(case_dir), "functions": len(rebuilt)}
