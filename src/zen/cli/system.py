"""`zen ps`: the processes of a whole-machine image (LiME, AVML, raw, ELF physical dump)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.table import Table

from zen.runtime.console import consoles
from zen.runtime.errors import ImageError

out, err = consoles()


def ps(
    image: Path = typer.Argument(..., help="Whole-machine memory image: LiME, AVML, raw, or an ELF physical dump (QEMU, kdump)."),
    symbols: list[Path] | None = typer.Option(
        None, "--symbols", help="Kernel symbols (ISF file or directory); repeatable. Default: zen's symbol cache."
    ),
    all_tasks: bool = typer.Option(False, "--all", help="Also list kernel threads."),
    as_json: bool = typer.Option(False, "--json", help="Print the kernel facts and processes as JSON."),
) -> None:
    """List the processes of a whole-machine image; Python processes show their version and whether torch is loaded."""
    from zen.memory import require_image_file
    from zen.memory.system.formats import sniff
    from zen.memory.system.image import SystemImage

    require_image_file(image)
    fmt = sniff(image)
    if fmt is None:
        with open(image, "rb") as fh:
            head = fh.read(18)
        e_type = int.from_bytes(head[16:18], "little") if len(head) == 18 else 0
        kind = {1: "an ELF object file", 2: "an ELF executable", 3: "an ELF shared object (library or PIE executable)"}
        if e_type in kind:
            raise ImageError(f"{image} is {kind[e_type]}, not a memory image",
                             "`zen ps` lists the processes of LiME/AVML/raw/ELF RAM images")  # fmt: skip
        raise ImageError(
            f"{image} is a core of one process, not a whole-machine image",
            "`zen info IMAGE` describes a process core; `zen ps` lists the processes of LiME/AVML/raw/ELF RAM images",
        )
    t0 = time.perf_counter()
    img = SystemImage(image, fmt, list(symbols or []))
    try:
        procs = img.processes()
        seconds = time.perf_counter() - t0
        shown = [p for p in procs if all_tasks or not p.kernel_thread]
        if as_json:
            out.print_json(json.dumps({"image": str(image), **img.facts(), "processes": [p.to_json() for p in shown]}))
            return
        f = img.kernel.facts
        out.print(f"[bold]{img.phys.describe()}[/bold]")
        out.print(f"kernel: {f.banner}")
        out.print(f"symbols: {f.isf} ({f.isf_source}); KASLR shift {f.aslr_shift:#x}")
        t = Table("pid", "ppid", "uid", "started (UTC)", "python", "torch", "comm", "command line")
        for p in shown:
            t.add_row(
                str(p.pid), str(p.ppid), "" if p.uid is None else str(p.uid), p.start_time or "", p.python or "",
                "yes" if p.torch else "", p.comm, p.cmdline[:120] or ("[kernel thread]" if p.kernel_thread else ""),
            )  # fmt: skip
        out.print(t)
        kernel_threads = sum(p.kernel_thread for p in procs)
        out.print(
            f"{len(procs) - kernel_threads} processes"
            + (f" and {kernel_threads} kernel threads (--all shows them)" if not all_tasks and kernel_threads else "")
            + f"; listed in {seconds:.1f} s"
        )
        for p in shown:
            for problem in p.problems:
                err.print(f"[yellow]problem: PID {p.pid}: {problem}[/yellow]")
        for problem in img.phys.problems:
            err.print(f"[yellow]problem: {problem}[/yellow]")
    finally:
        img.close()
