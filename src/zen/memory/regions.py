"""Regions of a virtual address space and where their bytes come from.

A region is one mapping of the original process (a line of /proc/PID/maps). Its bytes may be in
the image, may have to be taken from the mapped file on disk (kernel cores and lean images leave
read-only file mappings out), or may be missing entirely. Keeping that provenance per region lets
every later step say exactly which evidence it used.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Source(str, Enum):
    """Where the bytes of a region (or part of it) were taken from."""

    IMAGE = "image"  # captured in the memory image itself
    DISK = "disk"  # filled in from the mapped file on this machine (not in the image)
    LIVE = "live"  # read from a running process
    MISSING = "missing"  # mapped in the process, but no bytes are available


@dataclass(frozen=True, slots=True)
class Region:
    """One mapping of the imaged process."""

    start: int
    end: int
    perms: str  # four characters as in /proc/PID/maps, e.g. "rw-p"
    path: str = ""  # mapped file, or a pseudo name like "[heap]"; "" for anonymous memory
    offset: int = 0  # file offset of `start` in bytes, for file-backed mappings
    source: Source = Source.IMAGE

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def readable(self) -> bool:
        return self.perms[:1] == "r"

    @property
    def writable(self) -> bool:
        return self.perms[1:2] == "w"

    @property
    def executable(self) -> bool:
        return self.perms[2:3] == "x"

    @property
    def file_backed(self) -> bool:
        """True for mappings of a real file (not anonymous, not [heap]/[stack]/[vdso]...)."""
        return self.path.startswith("/")

    def contains(self, addr: int) -> bool:
        return self.start <= addr < self.end

    def describe(self) -> str:
        name = self.path or "[anon]"
        return f"{self.start:#014x}-{self.end:#014x} {self.perms} {self.size:>12,} {self.source.value:<7} {name}"


def perms_from_elf_flags(p_flags: int, shared: bool = False) -> str:
    """Convert ELF program-header flags (PF_R=4, PF_W=2, PF_X=1) to a maps-style string."""
    return (
        ("r" if p_flags & 4 else "-") + ("w" if p_flags & 2 else "-") + ("x" if p_flags & 1 else "-") + ("s" if shared else "p")
    )


def elf_flags_from_perms(perms: str) -> int:
    """Inverse of `perms_from_elf_flags`."""
    flags = 0
    if perms[:1] == "r":
        flags |= 4
    if perms[1:2] == "w":
        flags |= 2
    if perms[2:3] == "x":
        flags |= 1
    return flags
