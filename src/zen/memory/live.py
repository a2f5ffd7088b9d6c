"""A running process as an address space, read through /proc/PID/mem.

Reading another process's memory needs ptrace-read access (root, or the same user with a permissive
Yama setting). No attach is needed for /proc/PID/mem reads by root. The process keeps running
unless the caller freezes it (`frozen`), so analysis of a live process can see torn state; the CLI
freezes it for the duration of a recovery.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

from zen.memory.regions import Region, Source
from zen.memory.space import AddressSpace, LiveChunk
from zen.runtime.errors import ProcessError


def parse_maps_line(line: str) -> Region | None:
    """Parse one /proc/PID/maps line into a Region (None for malformed lines)."""
    parts = line.split(None, 5)
    if len(parts) < 5:
        return None
    try:
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        offset = int(parts[2], 16)
    except ValueError:
        return None
    path = parts[5].strip() if len(parts) > 5 else ""
    return Region(lo, hi, parts[1], path, offset, Source.LIVE)


def read_maps(pid: int) -> list[Region]:
    try:
        # file names are bytes to the kernel: carried losslessly (as os.fsdecode does), never a crash
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        raise ProcessError(f"no process with PID {pid}", "check the PID with `ps`") from None
    except PermissionError:
        raise ProcessError(f"permission denied reading /proc/{pid}/maps", "run zen as root or as the process owner") from None
    return [r for r in (parse_maps_line(x) for x in lines) if r is not None]


def process_state(pid: int) -> str:
    """The one-letter state of a process from /proc/PID/stat ('R', 'S', 'T', ...)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="surrogateescape") as fh:
            stat = fh.read()
    except OSError:
        return "?"
    # The command name is parenthesised and may contain spaces; the state follows the last ')'.
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"


def thread_ids(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return [pid]


@contextlib.contextmanager
def frozen(pid: int, timeout: float = 5.0) -> Iterator[bool]:
    """Stop the process (SIGSTOP) for the duration of the block and resume it afterwards.

    Yields True if we stopped it, False if it was already stopped (then it is left stopped). The
    process is resumed on every exit path: normal return, exceptions and Ctrl-C.
    """
    if pid == os.getpid():
        raise ProcessError("zen cannot stop and image its own process", "image another process")
    already = process_state(pid) == "T"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise ProcessError(f"no process with PID {pid}") from None
    except PermissionError:
        raise ProcessError(f"not allowed to signal PID {pid}", "run zen as root or as the process owner") from None
    if not already:
        os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [process_state(t) if t == pid else _task_state(pid, t) for t in thread_ids(pid)]
            if all(s in ("T", "t", "Z", "X", "?") for s in states):
                break
            time.sleep(0.005)
        yield not already
    finally:
        if not already:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _task_state(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8", errors="surrogateescape") as fh:
            stat = fh.read()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"


class LiveSpace(AddressSpace):
    """The memory of a running process; every read goes to /proc/PID/mem."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        regions = read_maps(pid)
        try:
            self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except FileNotFoundError:
            raise ProcessError(f"no process with PID {pid}") from None
        except PermissionError:
            raise ProcessError(
                f"permission denied reading the memory of PID {pid}", "run zen as root or as the process owner"
            ) from None
        chunks = [LiveChunk(r.start, r.end, self._fd) for r in regions if r.readable and r.path not in ("[vvar]", "[vsyscall]")]
        super().__init__(regions, chunks, description=f"live process {pid}")
        self.files = [(r.start, r.end, r.offset, r.path) for r in regions if r.file_backed]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
