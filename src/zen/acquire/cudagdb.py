"""The unprepared route: copy a live process's device memory with cuda-gdb, in one attach.

A process started without core dump settings can still be read by NVIDIA's debugger: `cuda-gdb -p`
attaches, `dump binary value FILE *(@global unsigned char (*)[N])ADDR` writes N bytes of device
global memory (values over 64 KiB need `set max-value-size unlimited`), and the process runs on
after `detach`. zen gives all ranges to one batch run, so the process is attached once (about
8.5 s on an H200), then packs the dumped ranges into a GPU core in the driver's layout
(`zen.memory.gpu.writer`) with a `.zen.acquisition` note naming the route and any range that failed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from zen.acquire.ranges import DeviceRange
from zen.memory.gpu.writer import Range, write_gpu_core
from zen.runtime.errors import ZenError

ATTACH_SECONDS = 120.0  # attaching, reading symbols and detaching, whatever the size
MIN_RATE = 5 << 20  # bytes per second a dump is given at least (measured rates are far higher)


def find_cuda_gdb(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() and os.access(explicit, os.X_OK) else None
    found = shutil.which("cuda-gdb")
    if found:
        return found
    for cand in ("/usr/local/cuda/bin/cuda-gdb", "/opt/nvidia/cuda/bin/cuda-gdb"):
        if Path(cand).is_file():
            return cand
    return None


def commands(ranges: list[DeviceRange], files: list[Path]) -> list[str]:
    """The debugger commands, each given as its own `-ex` (gdb stops a `-x` script at its first error; separate
    commands go on, so one range that cannot be read does not cost the others)."""
    lines = ["set pagination off", "set confirm off", "set max-value-size unlimited", "set print thread-events off",
             "info cuda devices"]  # fmt: skip
    for r, f in zip(ranges, files):
        lines.append(f"dump binary value {f} *(@global unsigned char (*)[{r.size}]){r.start:#x}")
    lines += ["detach", "quit"]
    return lines


def dump(pid: int, ranges: list[DeviceRange], dest: Path, cuda_gdb: str, *, timeout: float | None = None,
         note: dict | None = None) -> dict:  # fmt: skip
    """Dump `ranges` of process `pid` into the GPU core `dest`; returns the acquisition record."""
    total = sum(r.size for r in ranges)
    limit = timeout if timeout is not None else ATTACH_SECONDS + total / MIN_RATE
    with tempfile.TemporaryDirectory(prefix="zen-cudagdb-", dir=dest.parent) as tmp:
        files = [Path(tmp) / f"r{k}.bin" for k in range(len(ranges))]
        argv = [cuda_gdb, "-nx", "-batch", "-p", str(pid)]
        for c in commands(ranges, files):
            argv += ["-ex", c]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="backslashreplace", timeout=limit,
                                  cwd=tmp, stdin=subprocess.DEVNULL)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise ZenError(f"cuda-gdb did not finish dumping {total:,} bytes of PID {pid} within {limit:.0f} s",
                           "raise --gpu-timeout") from None  # fmt: skip
        except OSError as exc:
            raise ZenError(f"cannot run {cuda_gdb}: {exc.strerror}", "pass --cuda-gdb PATH") from None
        seconds = time.monotonic() - t0
        got, failed = [], []
        for r, f in zip(ranges, files):
            size = f.stat().st_size if f.exists() else -1
            if size == r.size:
                got.append(Range(r.start, r.size, f))
            else:
                failed.append(f"{r.device} {r.start:#x}-{r.end:#x} ({r.size:,} bytes): "
                              + ("not dumped" if size < 0 else f"{size:,} bytes dumped"))  # fmt: skip
        if not got and ranges:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
            raise ZenError(f"cuda-gdb dumped none of {len(ranges)} device ranges of PID {pid} (exit {proc.returncode}): {tail}",
                           "cuda-gdb must attach (root, or ptrace allowed) and the process must still run")  # fmt: skip
        devices_text = _section(proc.stdout, "info cuda devices")
        record = {"route": "cuda-gdb", "how": f"{cuda_gdb} -batch -p {pid}: dump binary value of each range, one attach",
                  "cuda_gdb": cuda_gdb, "ranges": len(ranges), "ranges_dumped": len(got), "bytes": sum(r.size for r in got),
                  "failed": failed[:100], "seconds": round(seconds, 3),
                  "mb_per_s": round(sum(r.size for r in got) / 1e6 / seconds, 1) if seconds > 0 else None,
                  "devices_seen": devices_text[:4000], "process_alive_after": os.path.exists(f"/proc/{pid}"),
                  **(note or {})}  # fmt: skip
        record["sha256"] = write_gpu_core(dest, got, devices=device_table(ranges, devices_text), note=record)
    return record


def _section(stdout: str, _label: str) -> str:
    """cuda-gdb's `info cuda devices` table as printed (its header and device rows, kept verbatim for the record;
    the thread notices gdb prints while attaching are left out)."""
    lines = stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if "Dev" in ln and "Name" in ln), None)
    if start is None:
        return ""
    rows = [lines[start]]
    for ln in lines[start + 1 : start + 65]:
        if not re.match(r"^\s*\*?\s*\d+\s", ln):
            break
        rows.append(ln)
    return "\n".join(rows)


_DEVICE_ROW = re.compile(r"^\s*\*?\s*(\d+)\s+\S+\s+(.*?)\s+(sm_\d+[a-z]?)\s+(\d+)\s")


def device_table(ranges: list[DeviceRange], devices_text: str) -> list[dict]:
    """Device-table entries for the GPU core: one per CUDA ordinal the ranges use (so the core serves those
    devices), named from cuda-gdb's `info cuda devices` where a row parses, else "unknown"."""
    rows = {}
    for line in devices_text.splitlines():
        m = _DEVICE_ROW.match(line)
        if m:
            major, minor = m.group(3)[3:-1] or "0", m.group(3)[-1]
            rows[int(m.group(1))] = {"devName": m.group(2).strip()[:120], "smType": m.group(3), "numSMs": int(m.group(4)),
                                     "smMajor": int(major) if major.isdigit() else 0,
                                     "smMinor": int(minor) if minor.isdigit() else 0}  # fmt: skip
    used = sorted({int(r.device.split(":")[1]) for r in ranges if ":" in r.device and r.device.split(":")[1].isdigit()})
    top = max(used, default=0)
    return [rows.get(k, {"devName": "unknown (not in cuda-gdb's device list)"}) for k in range(top + 1)]
