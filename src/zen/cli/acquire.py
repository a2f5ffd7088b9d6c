"""`zen acquire`: a live process's memory as an ELF core, and, for a CUDA process, its GPU memory beside it.

The host image is written first (the process is stopped while it is read); then the device memory, along the
route `zen.acquire.gpu` plans: the CUDA driver's own dump for a process started with it enabled, cuda-gdb for any
other. A CUDA process whose GPU side could not be collected still gets its host image, and exit 5 says what is
missing and how to collect it.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from zen.runtime.console import consoles
from zen.runtime.errors import ZenError

out, err = consoles()
EXIT_PARTIAL = 5


def acquire(
    pid: int = typer.Option(..., "--pid", help="PID of the process to image."),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the ELF core file."),
    lean: bool = typer.Option(
        False,
        "--lean/--all",
        help="--lean skips unwritten read-only file mappings (readers take them from disk); "
        "--all (default) copies every mapping.",
    ),
    gpu: str = typer.Option(
        "auto",
        "--gpu",
        help="GPU memory of a CUDA process, written to IMAGE.gpu0.nvcudmp: auto "
        "(the driver's dump if the process enabled it, else cuda-gdb), driver, cuda-gdb or none.",
    ),
    cuda_gdb: str | None = typer.Option(None, "--cuda-gdb", help="The cuda-gdb to use (default: on PATH)."),
    allow_abort: bool = typer.Option(
        False,
        "--allow-abort",
        help="Let the driver's dump end the process (when its CUDA_COREDUMP_GENERATION_FLAGS lack skip_abort).",
    ),
    gpu_timeout: float | None = typer.Option(
        None,
        "--gpu-timeout",
        help="Seconds allowed for the GPU dump (default: 600 for the driver, 120 + 1 s per 5 MB for cuda-gdb).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing file at -o (else refused: it is evidence)."),
) -> None:
    """Image a live process into an ELF core file (the process is stopped while it is read); for a CUDA process,
    also its GPU memory (see README 'Models on GPUs')."""
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the image")
    if output.is_file() and not force:  # an image already written is evidence someone may have hashed and cited
        raise ZenError(f"{output} already exists: imaging into it would replace it",
                       "write the image elsewhere (-o), or give --force to replace it")  # fmt: skip
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from zen.acquire import gpu as acquire_gpu
    from zen.acquire.process import acquire as do_acquire

    plan = acquire_gpu.plan(pid, output, gpu, cuda_gdb, allow_abort)  # refusals come before anything is written
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal) as prog:  # fmt: skip
        task = prog.add_task(f"imaging PID {pid}", total=None)

        def tick(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        res = do_acquire(pid, output, lean=lean, progress=tick, note=plan.note() if plan.route != "not-cuda" else None)
    out.print(
        f"wrote {res.path} ({res.bytes_written:,} bytes of {res.regions} mappings, mode {res.mode}) "
        f"in {res.seconds:.2f} s; sha256 {res.sha256}"
    )
    for f in res.failed_regions:
        err.print(f"[yellow]unreadable: {escape(f)}[/yellow]")
    if plan.route == "not-cuda":
        return
    try:
        with err.status(f"collecting GPU memory of PID {pid} ({plan.route}: {plan.reason})"):
            got = acquire_gpu.collect(plan, res.path, allow_abort=allow_abort, timeout=gpu_timeout)
    except ZenError as exc:  # the host image stands: the GPU side is what is missing (exit 5, not 2)
        got = acquire_gpu.GpuResult(None, None, missing=f"GPU memory not collected: {exc.message}"
                                    + (f" ({exc.hint})" if exc.hint else ""))  # fmt: skip
    if got.path is None and not got.missing:
        err.print(f"[dim]note: {escape(got.note)}[/dim]", soft_wrap=True)
        return
    if got.path is None:
        err.print(f"[yellow]problem: {escape(got.missing)}[/yellow]", soft_wrap=True)
        raise typer.Exit(EXIT_PARTIAL)
    r = got.record
    size = got.path.stat().st_size
    extra = f", {r['mb_per_s']} MB/s" if r.get("mb_per_s") else ""
    out.print(f"wrote {got.path} ({size:,} bytes, GPU memory by {r['route']}, {r['seconds']} s{extra}); sha256 {got.sha256}")
    out.print(f"acquisition note (both sha256): {res.path}.acquisition.json")
    out.print(f"recover with: zen recover {res.path} --gpu {got.path} -o CASE")
    for f in r.get("failed") or []:
        err.print(f"[yellow]problem: device range not dumped: {escape(f)}[/yellow]")
    if r.get("failed"):
        raise typer.Exit(EXIT_PARTIAL)
