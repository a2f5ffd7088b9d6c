"""The prepared route: make the CUDA driver dump the GPU of a process started for it.

The process was started with `CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1`; its driver listens on a named
pipe. zen writes one byte there, finds the file the driver creates (`CUDA_COREDUMP_FILE`, else the
driver's default name in the process's working directory), waits until the driver has finished it
(the process no longer holds it open and its section table ends the file), bounded by a deadline,
and moves it beside the host image. Without `skip_abort` in the generation flags the driver
aborts the process after the dump: zen refuses unless told that this is acceptable.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import stat
import struct
import time
from pathlib import Path

from zen.acquire.environ import CudaSettings, expand
from zen.runtime.errors import ZenError

POLL = 0.1


def _candidates(settings: CudaSettings) -> list[str]:
    """Glob patterns where the driver will write the dump."""
    if settings.file_pattern:
        pat = expand(settings.file_pattern, settings.pid)
        if not os.path.isabs(pat) and settings.cwd is not None:
            pat = str(settings.cwd / pat)
        return [pat]
    base = str(settings.cwd or ".")
    return [os.path.join(base, "core*.nvcudmp"), os.path.join(base, f"core*cuda*{settings.pid}*")]


def _listing(patterns: list[str]) -> dict[str, float]:
    out = {}
    for pat in patterns:
        for f in glob.glob(pat)[:10000]:
            try:
                st = os.stat(f)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):  # never the trigger pipe itself (opening a FIFO blocks)
                out[f] = st.st_mtime
    return out


def _held_open(pid: int, path: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False  # the process is gone (it aborted): nothing holds the file any more
    real = os.path.realpath(path)
    for fd in fds[:65536]:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == real:
                return True
        except OSError:
            continue
    return False


def _complete(path: str) -> bool:
    """A plain ELF core whose section header table ends the file, or a gzip file with its trailer."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:2] == b"\x1f\x8b":
                fh.seek(max(0, size - 4))
                return size > 18 and len(fh.read(4)) == 4
    except OSError:
        return False
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return False
    (shoff,) = struct.unpack_from("<Q", head, 40)
    shentsize, shnum = struct.unpack_from("<HH", head, 58)
    return shoff > 0 and shoff + shentsize * shnum == size


def trigger(settings: CudaSettings, dest: Path, *, allow_abort: bool = False, timeout: float = 600.0) -> dict:
    """Trigger the driver's dump and move the finished file to `dest`; returns the acquisition record."""
    if not settings.skip_abort and not allow_abort:
        raise ZenError(f"PID {settings.pid} would be killed by its CUDA driver after the GPU dump: "
                       f"its CUDA_COREDUMP_GENERATION_FLAGS ({','.join(settings.flags) or 'unset'}) lack skip_abort",
                       "pass --allow-abort if ending the process is acceptable, or --gpu cuda-gdb")  # fmt: skip
    if settings.pipe is None:
        raise ZenError(f"PID {settings.pid} enables user-triggered GPU dumps but its pipe was not found "
                       f"({settings.pipe_configured or 'default name'})",
                       "pass --gpu cuda-gdb, or check the process")  # fmt: skip
    patterns = _candidates(settings)
    before = _listing(patterns)
    t0 = time.monotonic()
    try:
        fd = os.open(settings.pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        why = "no reader: the driver is not listening" if exc.errno == errno.ENXIO else exc.strerror
        raise ZenError(f"cannot trigger the GPU dump through {settings.pipe}: {why}") from None
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    found = None
    while time.monotonic() - t0 < timeout:
        new = {f: m for f, m in _listing(patterns).items() if f not in before or m > before[f]}
        for f in sorted(new, key=new.get):
            if not _held_open(settings.pid, f) and _complete(f):
                found = f
                break
        if found:
            break
        time.sleep(POLL)
    if found is None:
        raise ZenError(f"the CUDA driver wrote no complete GPU dump within {timeout:.0f} s (looked for {', '.join(patterns)})",
                       "raise --gpu-timeout; check CUDA_COREDUMP_FILE and free disk space where the process runs")  # fmt: skip
    seconds = time.monotonic() - t0
    try:
        os.replace(found, dest)
        moved = "moved"
    except OSError:
        shutil.copyfile(found, dest)
        moved = "copied (the driver's file was left in place)"
    alive = os.path.exists(f"/proc/{settings.pid}")
    return {"route": "driver", "how": "CUDA driver user-triggered GPU core dump (named pipe)", "pipe": str(settings.pipe),
            "driver_file": found, "file_handling": moved, "flags": settings.flags, "seconds": round(seconds, 3),
            "process_alive_after": alive}  # fmt: skip
