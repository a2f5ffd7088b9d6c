"""`zen symbols`: a Volatility 3 kernel symbol file (ISF) from the kernel's BTF and symbol table."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from zen.runtime.console import consoles
from zen.runtime.errors import KernelSymbolsError

out, err = consoles()


def _banner_arg(banner: str | None) -> bytes | None:
    """--banner takes the text, or a file holding it (a copy of /proc/version)."""
    if banner is None:
        return None
    p = Path(banner)
    if not banner.startswith("Linux version ") and p.is_file():
        return p.read_bytes()[:4096].split(b"\x00")[0]
    return banner.encode("latin-1", "replace")


def symbols(
    kernel: Path | None = typer.Option(
        None, "--kernel", help="vmlinuz (bzImage) or vmlinux of the imaged kernel: BTF, banner and its own symbol table."
    ),
    btf: Path | None = typer.Option(
        None, "--btf", help="Raw BTF (a copy of /sys/kernel/btf/vmlinux), if there is no kernel file."
    ),
    system_map: Path | None = typer.Option(None, "--system-map", help="System.map of the kernel (link-time addresses)."),
    kallsyms: Path | None = typer.Option(
        None, "--kallsyms", help="/proc/kallsyms of the imaged machine, read as root (KASLR is undone)."
    ),
    deb: Path | None = typer.Option(None, "--deb", help="A linux-image-*.deb package; its boot/vmlinuz is used as --kernel."),
    banner: str | None = typer.Option(
        None, "--banner", help="Banner text or a /proc/version copy, when no kernel file gives it."
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Where to write the ISF (.json.xz). Default: zen's symbol cache."
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild even if the cache holds an ISF for these inputs."),
    as_json: bool = typer.Option(False, "--json", help="Print what was built as JSON."),
) -> None:
    """Build a Volatility 3 ISF for a Linux kernel from its BTF and kallsyms (no debug package, no symbol server)."""
    from zen.evidence.outpaths import require_parent

    require_parent(output, "the symbol file")
    from zen.memory.system.symbols.build import build_isf

    given = [p for p in (kernel, btf, system_map, kallsyms, deb) if p is not None]
    for p in given:
        if not p.is_file():
            raise KernelSymbolsError(f"no such file: {p}", "check the path")
    if kernel is not None and deb is not None:
        raise KernelSymbolsError("give --kernel or --deb, not both")
    if system_map is not None and kallsyms is not None:
        raise KernelSymbolsError("give --system-map or --kallsyms, not both")
    if output is not None and not output.name.endswith(".json.xz"):
        raise KernelSymbolsError(f"--output {output}: the ISF is written xz-compressed; name it *.json.xz")
    info = build_isf(kernel, btf, system_map, kallsyms, output, deb=deb, banner=_banner_arg(banner), use_cache=not no_cache)
    if as_json:
        out.print_json(json.dumps({
            "path": str(info.path), "banner": info.banner.rstrip(b"\x00").decode("latin-1") if info.banner else None,
            "sha256": info.sha256, "size": info.size, "counts": info.counts, "sources": info.sources,
            "kaslr_shift": info.kaslr_shift, "cached": info.cached, "seconds": info.seconds, "notes": info.notes,
        }))  # fmt: skip
        return
    shown = info.banner.rstrip(b"\x00").strip().decode("latin-1") if info.banner else "(none)"
    out.print(f"kernel: {shown}")
    for what, src in info.sources.items():
        out.print(f"{what}: {src}")
    c = info.counts
    out.print(
        f"{c['user_types']} structs/unions, {c['enums']} enums, {c['base_types']} base types, "
        f"{c['symbols']} symbols ({c['typed_symbols']} typed)"
    )
    took = info.seconds.get("total", 0.0)
    how = "found in the cache" if info.cached else f"built in {took:.1f} s"
    out.print(f"wrote {info.path} ({info.size / 1e6:.1f} MB, sha256 {info.sha256[:16]}…), {how}")
    for note in info.notes:
        err.print(f"[yellow]note: {note}[/yellow]")
