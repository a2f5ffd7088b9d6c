"""A whole-machine image opened for zen: its kernel, its processes, and the one zen analyses.

`open_system_process` is what `open_space` calls for a file that is not a process core: it finds
the kernel, lists processes, picks the one asked for (`--pid`) or the one Python process that has
torch loaded, and returns that process as an `AddressSpace` carrying a `system` record for the
manifest (format, banner, symbol file and hash, the process chosen and why).
"""

from __future__ import annotations

import time
from pathlib import Path

from zen.memory.system.formats import PhysicalImage, open_physical
from zen.memory.system.kernel import Kernel
from zen.memory.system.tasks import ProcessEntry, fill_details, list_processes
from zen.runtime.errors import ImageError, ZenError


class ProcessChoiceError(ZenError):
    """The image holds no (or more than one) process zen could analyse without `--pid`."""


class SystemImage:
    """A physical memory image with its kernel located (symbols matched, KASLR resolved)."""

    def __init__(self, path: Path, fmt: str, symbols: list[Path] | None = None) -> None:
        t0 = time.perf_counter()
        self.path = Path(path)
        try:
            self.phys: PhysicalImage = open_physical(self.path, fmt)
            self.kernel = Kernel(self.phys, symbols)
        except ImageError as exc:
            if fmt == "raw" and ("banner" in exc.message or "too small" in exc.message):
                size = self.path.stat().st_size
                maybe = "; if it is a raw RAM image, it may be cut short before the kernel" if size >= 64 << 20 else ""
                raise ImageError(
                    f"not an ELF core file, nor a memory image of a Linux machine (no kernel banner): {self.path}{maybe}",
                    "zen reads process cores (zen acquire, gcore, kernel cores) and LiME, AVML, raw or ELF dumps of RAM",
                ) from None
            raise
        self.seconds_kernel = time.perf_counter() - t0
        self._processes: list[ProcessEntry] | None = None

    def processes(self) -> list[ProcessEntry]:
        if self._processes is None:
            self._processes = list_processes(self.kernel)
        return self._processes

    def process(self, pid: int) -> ProcessEntry:
        """The process with this pid (listed without the per-process details the choice needs)."""
        if self._processes is not None:
            found = [p for p in self._processes if p.pid == pid]
        else:
            found = [p for p in list_processes(self.kernel, details=False) if p.pid == pid]
        if not found:
            raise ProcessChoiceError(
                f"no process with PID {pid} in {self.path}", "list the image's processes with `zen ps IMAGE`"
            )
        entry = found[0]
        if not entry.kernel_thread and not entry.cmdline:
            fill_details(self.kernel, entry)
        return entry

    def choose(self, pid: int | None) -> tuple[ProcessEntry, str]:
        """The process to analyse and why it was chosen."""
        if pid is not None:
            return self.process(pid), f"--pid {pid}"
        procs = self.processes()
        torch = [p for p in procs if p.python and p.torch]
        if len(torch) == 1:
            return torch[0], "the only Python process with torch loaded"
        pythons = [p for p in procs if p.python]
        listing = "; ".join(
            f"{p.pid} {p.comm} ({'torch' if p.torch else 'python ' + str(p.python)})" for p in (torch or pythons)[:12]
        )
        if not torch:
            raise ProcessChoiceError(
                f"no Python process with torch loaded in {self.path}"
                + (f" (Python processes: {listing})" if pythons else " (no Python process at all)"),
                "choose one with --pid N; `zen ps IMAGE` lists every process",
            )
        raise ProcessChoiceError(
            f"{len(torch)} Python processes with torch loaded in {self.path}: {listing}",
            "choose one with --pid N (`zen ps IMAGE` shows their command lines)",
        )

    def facts(self) -> dict:
        return {
            "format": self.phys.format,
            "container": self.phys.describe(),
            "physical_bytes": self.phys.physical_bytes,
            **self.kernel.facts.to_json(),
        }

    def close(self) -> None:
        self.kernel.close()


def open_system_process(path: Path, fmt: str, pid: int | None, symbols: list[Path] | None = None, file_root: str | None = None):
    """The chosen process of a whole-machine image as an AddressSpace (see module docstring)."""
    from zen.memory.system.process import SystemProcessSpace

    img = SystemImage(path, fmt, symbols)
    try:
        entry, why = img.choose(pid)
        space = SystemProcessSpace(img.kernel, entry, file_root=file_root)
    except BaseException:
        img.close()
        raise
    space.system = {
        **img.facts(),
        "process": {**entry.to_json(), "chosen_by": why},
    }
    space.system_image = img
    return space
