"""What a live CUDA process says about its GPU core dump settings (its environment and open files).

The CUDA driver reads its core dump settings from the environment at initialisation:
`CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1` makes it listen on a named pipe (`CUDA_COREDUMP_PIPE`,
default `corepipe.cuda.HOSTNAME.PID` in the process's working directory) and dump the GPU when
anything is written there, to `CUDA_COREDUMP_FILE` (`%h` host, `%p` PID, `%t` time), with
`CUDA_COREDUMP_GENERATION_FLAGS` (`skip_abort` keeps the process alive afterwards). zen reads
them from /proc/PID/environ; the pipe the driver really opened is also looked up among the
process's open files, so a default name zen did not predict is still found.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

ENABLE = "CUDA_ENABLE_USER_TRIGGERED_COREDUMP"
PIPE = "CUDA_COREDUMP_PIPE"
FILE = "CUDA_COREDUMP_FILE"
FLAGS = "CUDA_COREDUMP_GENERATION_FLAGS"
MAX_ENVIRON = 4 << 20


@dataclass
class CudaSettings:
    pid: int
    uses_cuda: bool  # libcuda is mapped
    user_trigger: bool  # CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1
    pipe: Path | None  # the named pipe to write to (absolute), when it exists
    pipe_configured: str | None
    file_pattern: str | None  # CUDA_COREDUMP_FILE as set (None: the driver's default name)
    flags: list[str] = field(default_factory=list)
    cwd: Path | None = None

    @property
    def skip_abort(self) -> bool:
        return "skip_abort" in self.flags

    def to_json(self) -> dict:
        return {"uses_cuda": self.uses_cuda, "user_trigger": self.user_trigger, "pipe": str(self.pipe) if self.pipe else None,
                "pipe_configured": self.pipe_configured, "file": self.file_pattern, "flags": self.flags}  # fmt: skip


def read_environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read(MAX_ENVIRON)
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
    return out


def uses_cuda(pid: int) -> bool:
    """Whether the process has the CUDA driver library mapped."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:  # bytes: mapped file names need not be UTF-8
            return any(b"libcuda.so" in line for line in fh)
    except OSError:
        return False


def expand(pattern: str, pid: int, host: str | None = None) -> str:
    """The driver's name pattern with %h and %p filled in (%t, the dump's time, stays a wildcard)."""
    host = host or os.uname().nodename
    return pattern.replace("%h", host).replace("%p", str(pid)).replace("%t", "*")


def _in_cwd(name: str, cwd: Path | None) -> Path:
    p = Path(name)
    return p if p.is_absolute() or cwd is None else cwd / p


def _open_fifos(pid: int) -> list[Path]:
    """Named pipes the process has open (the driver keeps its trigger pipe open for reading)."""
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds[:65536]:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/"):
            try:
                if stat.S_ISFIFO(os.stat(target).st_mode):
                    out.append(Path(target))
            except OSError:
                continue
    return out


def _is_fifo(p: Path) -> bool:
    try:
        return stat.S_ISFIFO(p.stat().st_mode)
    except OSError:
        return False


def cuda_settings(pid: int) -> CudaSettings:
    env = read_environ(pid)
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        cwd = None
    trigger = env.get(ENABLE, "").strip() in ("1", "true", "True", "yes")
    configured = env.get(PIPE)
    pipe = None
    if trigger:
        name = expand(configured or f"corepipe.cuda.%h.{pid}", pid)
        first = _in_cwd(name, cwd)
        if _is_fifo(first):
            pipe = first
        else:
            fifos = _open_fifos(pid)
            pipe = next((f for f in fifos if "corepipe" in f.name), None) or (fifos[0] if len(fifos) == 1 else None)
    flags = [f.strip() for f in env.get(FLAGS, "").replace(";", ",").split(",") if f.strip()]
    return CudaSettings(pid, uses_cuda(pid), trigger, pipe, configured, env.get(FILE), flags, cwd)
