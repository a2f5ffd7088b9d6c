"""`zen info GPU_CORE`: what a CUDA GPU core holds (devices, contexts, global memory segments)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from zen.runtime.console import consoles

out, err = consoles()
EXIT_PARTIAL = 5
SHOWN_SEGMENTS = 40


def is_gpu_core(image: Path) -> bool:
    from zen.memory import require_image_file
    from zen.memory.gpu import sniff_gpu_core

    return sniff_gpu_core(require_image_file(image)) is not None


def info(image: Path, as_json: bool) -> None:
    from zen.memory.gpu import GpuCoreSpace

    with GpuCoreSpace(image) as g:
        data = g.core.to_json()
        data["path"], data["size"] = str(Path(image).resolve()), Path(image).stat().st_size
        if g.unpacked is not None:
            data["compression"] = {"kind": "gzip", "unpacked_size": g.unpacked.size, "unpacked_sha256": g.unpacked.sha256}
    if as_json:
        out.print_json(json.dumps(data))
    else:
        _render(data)
    for p in data["problems"]:
        err.print(f"[yellow]problem: {escape(p)}[/yellow]", soft_wrap=True)
    if data["problems"]:
        raise typer.Exit(EXIT_PARTIAL)


def _render(d: dict) -> None:
    out.print(f"[bold]{escape(d['path'])}[/bold]: CUDA GPU core, {d['size']:,} bytes, {d['sections']:,} sections"
              + (f" (gzip; {d['compression']['unpacked_size']:,} bytes unpacked)" if "compression" in d else ""))  # fmt: skip
    m = d["meta"]
    if m:
        out.print(f"written by {escape(str(m.get('generator') or '?'))}: driver {m.get('driver', '?')}, "
                  f"CUDA {m.get('cuda', '?')}, flags {', '.join(m.get('flag_names', [])) or m.get('flags')}")  # fmt: skip
    if "zen_acquisition" in d:
        z = d["zen_acquisition"]
        out.print(f"acquired by zen: {escape(str(z.get('how', z.get('route', '?'))))}")
    t = Table("device", "name", "type", "SM", "SMs", "PCI", "contexts", "grids running")
    for dev in d["devices"]:
        sm = f"{escape(dev['sm_type'])} ({dev['sm_version']})"
        t.add_row(f"cuda:{dev['index']}", escape(dev["name"]), escape(dev["type"]), sm, str(dev["sm_count"]), dev["pci"],
                  str(len(dev["contexts"])), str(dev["grids_running"]))  # fmt: skip
    out.print(t if d["devices"] else "devices: no device table in this core")
    for dev in d["devices"]:
        for c in dev["contexts"]:
            out.print(f"  cuda:{dev['index']} context {c['context']}: host thread {c['host_tid']}, {c['modules']} modules, "
                      f"{c['images']} relocated images")  # fmt: skip
    g = d["global_memory"]
    out.print(f"global memory: {g['segments']} segments, {g['bytes']:,} bytes")
    t = Table("section", "address", "end", "size")
    for s in g["ranges"][:SHOWN_SEGMENTS]:
        t.add_row(s["section"], s["address"], f"{int(s['address'], 16) + s['size']:#x}", f"{s['size']:,}")
    out.print(t)
    if g["segments"] > SHOWN_SEGMENTS:
        out.print(f"... and {g['segments'] - SHOWN_SEGMENTS} more (--json lists all)")
