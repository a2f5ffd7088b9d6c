"""`zen demo`: image a real model-serving process and show what zen recovers from the image alone.

The demo starts `deployed_model.py` (a small classifier with custom code) as its own process,
images it with zen's acquisition, then works only on the image file: finds the interpreter,
counts the heap, finds the model's module objects and their settings, and rebuilds the code of
the model's own classes and helpers. Nothing recovered is executed; the rebuilt code is shown
disassembled. The process's self-description (truth.json) is used only to print the check at the
end.
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

MODULE_BASE = "torch.nn.modules.module.Module"


def run_demo(workdir: Path, console: Console, keep: bool = False) -> dict:
    """Run the demo in `workdir`; returns a summary dict (also printed)."""
    from zen.acquire import acquire
    from zen.cpython.codebuild import can_rebuild, rebuild_code
    from zen.cpython.heap import Heap
    from zen.cpython.interp import Interpreter
    from zen.cpython.readers.dicts import dict_str_items
    from zen.cpython.readers.functions import read_function
    from zen.cpython.readers.instances import read_instance
    from zen.info import image_info
    from zen.memory import open_space

    workdir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    script = Path(__file__).with_name("deployed_model.py")
    console.rule("[bold]1. a deployed model process")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with console.status("starting the model process (imports torch, builds a classifier, runs inference)..."):
            line = proc.stdout.readline().strip()
        if line != "READY":
            raise ZenError(
                f"the demo model process failed to start: {proc.stderr.read()[-500:]}",
                "is torch installed? (the README's install command installs it)",
            )
        console.print(f"PID {proc.pid} is serving a model; zen now images it")
        image = workdir / "deployed.core"
        console.rule("[bold]2. acquisition")
        res = acquire(proc.pid, image, lean=True)
        console.print(f"wrote {image} ({res.bytes_written / 1e6:,.0f} MB, lean) in {res.seconds:.2f} s; the process kept running")
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(30)
    truth = json.loads((workdir / "truth.json").read_text())

    console.rule("[bold]3. the interpreter in the image")
    space = open_space(image)
    info = image_info(space, top=8, threads=True)
    ip = Interpreter.open(space)
    i = info["interpreter"]
    console.print(f"Python {i['version']} found via {i['how']['version']}; _PyRuntime at {i['runtime']:#x}")
    console.print(
        f"{info['sys_modules']} modules loaded; packages: " + ", ".join(f"{k} {v}" for k, v in info["packages"].items() if v)
    )
    c = info["census"]
    console.print(f"heap census: {c['objects']:,} objects of {c['types']:,} types in {c['seconds']} s")

    console.rule("[bold]4. the model's modules, found by type, read from the image")
    heap = Heap(ip)
    module_types = {t.addr: t for t in heap.subclasses_of(MODULE_BASE)}
    instances = []
    for taddr in module_types:
        instances.extend(heap.instances(taddr).tolist())
    table = Table("address", "class", "settings read from the instance")
    custom_classes = {}
    for addr in sorted(instances):
        inst = read_instance(ip, addr)
        t = module_types[inst.type]
        settings = {}
        for name, v in inst.attrs.items():
            if name.startswith("_") or ip.kind(v) not in ("int", "bool", "float", "tuple", "str"):
                continue
            settings[name] = ip.value(v, 2)
        table.add_row(f"{addr:#x}", t.full_name, ", ".join(f"{k}={v}" for k, v in settings.items()))
        if not t.module.startswith("torch."):
            custom_classes[t.addr] = t
    console.print(table)

    console.rule("[bold]5. the model's own code, rebuilt from the image (never executed)")
    rebuilt = []
    for t in custom_classes.values():
        for name, v in dict_str_items(ip, t.dict_addr):
            if ip.kind(v) == "function":
                rebuilt.append((f"{t.full_name}.{name}", read_function(ip, v)))
    helper_globals = rebuilt[0][1].globals if rebuilt else None
    if helper_globals:
        for name, v in dict_str_items(ip, helper_globals):
            if ip.kind(v) == "function" and read_function(ip, v).module == custom_classes[next(iter(custom_classes))].module:
                f = read_function(ip, v)
                if f.qualname == name:
                    rebuilt.append((f"{f.module}.{name}", f))
    shown = 0
    for label, f in rebuilt:
        if can_rebuild(ip):
            code = rebuild_code(ip, f.code)
            console.print(f"[bold]{label}[/bold]{_signature(code)}  ({code.co_filename}:{code.co_firstlineno})")
            if f.qualname.endswith("forward") or f.qualname == "channel_shuffle":
                if shown < 2:
                    buf = io.StringIO()
                    dis.dis(code, file=buf)
                    console.print(buf.getvalue().rstrip(), markup=False)
                    shown += 1
        else:
            console.print(f"[bold]{label}[/bold] (Python {ip.P.minor} code: listed, not rebuilt in this interpreter)")

    console.rule("[bold]6. check against what the process said about itself")
    found_classes = sorted({module_types[read_instance(ip, a).type].qualname for a in instances})
    expected = sorted(set(truth["modules"].values()))
    ok = truth["model_id"] in instances and found_classes == expected
    console.print(
        f"model object at {truth['model_id']:#x} found: {truth['model_id'] in instances}; "
        f"module classes match: {found_classes == expected} ({', '.join(found_classes)})"
    )
    elapsed = time.perf_counter() - t_start
    console.print(f"[bold]{'OK' if ok else 'MISMATCH'}[/bold]: demo finished in {elapsed:.1f} s; image: {image}")
    space.close()
    if not keep:
        image.unlink(missing_ok=True)
    return {"ok": ok, "seconds": elapsed, "image": str(image), "modules": len(instances), "functions": len(rebuilt)}


def _signature(code) -> str:
    args = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return f"({', '.join(args)})"
