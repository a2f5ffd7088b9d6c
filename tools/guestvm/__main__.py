"""Command line: ``python tools/guestvm ...`` or ``python -m guestvm ...`` (from tools/).

    kernels                      kernels apt offers and those already cached
    build [--kernel V] [--lime]  fetch/build a kernel's assets (cached), print their paths
    image OUTDIR [...] [-- CMD]  boot, run CMD, wait, record, dump (elf/raw/lime) into OUTDIR
    stale [--kill]               list (or end) leftover guestvm QEMU processes

``image`` substitutes ``{share}`` in CMD and ``--wait-file`` with OUTDIR/share, the directory the
guest sees at the same path.  Example (a torch guest, ELF + raw of one instant):

    python tools/guestvm image /tmp/g --memory 1536 --elf --raw --mkdir out --wait-text READY -- \\
        .venv/bin/python tests/targets/family_target.py {share}/out convnet --src {share}/src
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "guestvm"

from guestvm import Guest, build_kernel_assets  # noqa: E402
from guestvm.cache import available_kernels, cached_kernels  # noqa: E402


def cmd_kernels(_: argparse.Namespace) -> None:
    print(json.dumps({"available": available_kernels(), "cached": cached_kernels()}, indent=1))


def cmd_build(a: argparse.Namespace) -> None:
    assets = build_kernel_assets(a.kernel, lime=a.lime)
    print(json.dumps({k: str(v) for k, v in asdict(assets).items()}, indent=1))


def cmd_image(a: argparse.Namespace) -> None:
    out = Path(a.outdir).resolve()
    share = out / "share"
    share.mkdir(parents=True, exist_ok=True)
    for d in a.mkdir:
        (share / d).mkdir(parents=True, exist_ok=True)
    sub = lambda s: s.replace("{share}", str(share))  # noqa: E731
    workload = [sub(x) for x in a.cmd] or None
    assets = build_kernel_assets(a.kernel, lime=bool(a.lime))
    t: dict[str, float] = {}
    with Guest(
        assets, memory_mib=a.memory, share=share, workload=workload, cwd=Path(a.cwd), lime=a.lime_method if a.lime else None
    ) as g:
        t.update(g.timings)
        t0 = time.monotonic()
        if a.wait_file:
            g.wait_for(Path(sub(a.wait_file)), a.timeout)
        if a.wait_text:
            g.wait_for(g.workload_log, a.timeout, contains=a.wait_text)
        t["workload_ready_s"] = time.monotonic() - t0
        summary = g.record(share / "guest")
        for fmt in a.lime:
            name = "guest.lime" if fmt == "lime" else f"guest.lime-{fmt}"
            t[f"lime_{a.lime_method}_{fmt}_s"] = g.dump_lime(out / name, fmt=fmt)
        if a.elf or a.raw:
            with g.paused():
                if a.elf:
                    t["dump_elf_s"] = g.dump_elf(out / "guest.elf")
                if a.raw:
                    t["dump_raw_s"] = g.dump_raw(out / "guest.raw")
    summary["timings"] = {k: round(v, 2) for k, v in t.items()}
    summary["images"] = sorted(p.name for p in out.glob("guest.*"))
    (out / "guest.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


def stale_qemus() -> list[tuple[int, str]]:
    """QEMU processes started by guestvm (their command line carries ``guestvm.share=``)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qemu-system-x86_64") and any(b"guestvm.share=" in x for x in argv):
            found.append((int(p.name), b" ".join(argv).decode(errors="replace")[:200]))
    return found


def cmd_stale(a: argparse.Namespace) -> None:
    for pid, cmd in stale_qemus():
        print(pid, cmd)
        if a.kill:
            os.kill(pid, signal.SIGTERM)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="guestvm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = ap.add_subparsers(dest="command", required=True)
    sp.add_parser("kernels").set_defaults(fn=cmd_kernels)
    b = sp.add_parser("build")
    b.add_argument("--kernel", help="6.1.0-NN-amd64 (default: $ZEN_GUEST_KERNEL / newest cached / newest)")
    b.add_argument("--lime", action="store_true", help="also build lime.ko")
    b.set_defaults(fn=cmd_build)
    i = sp.add_parser("image")
    i.add_argument("outdir")
    i.add_argument("--kernel")
    i.add_argument("--memory", type=int, default=1536, help="guest RAM in MiB")
    i.add_argument("--cwd", default=os.getcwd(), help="workload's working directory")
    i.add_argument("--mkdir", action="append", default=[], help="create SHARE/NAME first")
    i.add_argument("--wait-file", help="wait for this file ({share} substituted)")
    i.add_argument("--wait-text", help="wait for this text in the workload's output")
    i.add_argument("--timeout", type=float, default=1800)
    i.add_argument("--elf", action="store_true", help="QEMU ELF dump (guest.elf)")
    i.add_argument("--raw", action="store_true", help="flat physical dump (guest.raw)")
    i.add_argument(
        "--lime",
        action="append",
        default=[],
        choices=["lime", "padded", "raw"],
        help="LiME format(s), taken before the ELF/raw dumps (guest.lime-FMT)",
    )
    i.add_argument("--lime-method", default="share", choices=["share", "disk", "tcp"])
    i.set_defaults(fn=cmd_image)
    s = sp.add_parser("stale")
    s.add_argument("--kill", action="store_true")
    s.set_defaults(fn=cmd_stale)
    argv = sys.argv[1:] if argv is None else argv
    cmd = argv[argv.index("--") + 1 :] if "--" in argv else []  # the workload, taken verbatim
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    a.cmd = cmd
    a.fn(a)


if __name__ == "__main__":
    main()
