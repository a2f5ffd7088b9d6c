"""What a whole-machine image's container says: its physical ranges and where each lies in the file.

Shared by the format readers (formats.py for LiME, ELF and raw; avml.py for AVML) and everything that maps physical
addresses to file offsets.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LIME_HEADER = struct.Struct("<IIQQQ")  # LiME's and AVML's range header: magic, version, start, end, reserved
# A real machine has at most a few hundred physical ranges; more is a corrupt or hostile file.
MAX_SEGMENTS = 1 << 16
MAX_PHYS_ADDR = 1 << 52  # x86_64's architectural limit on physical addresses
PAGE = 4096


@dataclass(frozen=True, slots=True)
class PhysSegment:
    """Physical range [start, start+length) stored at `file_offset` (None: not file-contiguous)."""

    start: int
    length: int
    file_offset: int | None

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class PhysicalImage:
    """What the container format says: its name, the physical ranges, problems with the file."""

    path: Path
    format: str  # "lime", "avml", "elf", "raw"
    size: int
    segments: list[PhysSegment] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    detail: str = ""  # e.g. "QEMU dump-guest-memory" or "kdump (VMCOREINFO)"
    avml: Any = None  # compressed AVML: where each frame is, to read physical bytes

    def __post_init__(self) -> None:
        self.segments.sort(key=lambda s: s.start)
        self._starts = [s.start for s in self.segments]

    @property
    def mmappable(self) -> bool:
        return all(s.file_offset is not None for s in self.segments)

    @property
    def physical_bytes(self) -> int:
        return sum(s.length for s in self.segments)

    def file_offset(self, phys: int, length: int) -> tuple[int, int] | None:
        """(file offset, contiguous bytes available from it, at most `length`) of a physical
        address, or None when the image does not hold it."""
        i = bisect_right(self._starts, phys) - 1
        if i < 0:
            return None
        s = self.segments[i]
        if phys >= s.end or s.file_offset is None:
            return None
        return s.file_offset + (phys - s.start), min(length, s.end - phys)

    def physical_run(self, phys: int, length: int) -> tuple[int, int] | None:
        """(phys, bytes held contiguously from it, at most `length`), across adjacent ranges, or
        None: the counterpart of `file_offset` for images read through `avml`, whose "offset" is
        the physical address itself."""
        i = bisect_right(self._starts, phys) - 1
        if i < 0 or phys >= self.segments[i].end:
            return None
        end = self.segments[i].end
        while end < phys + length and i + 1 < len(self.segments) and self.segments[i + 1].start == end:
            i += 1
            end = self.segments[i].end
        return phys, min(length, end - phys)

    @property
    def producer(self) -> str:
        """Who made the image, as far as the container tells (for the evidence record)."""
        what = {"lime": "LiME", "avml": "AVML", "elf": "ELF physical dump", "raw": "raw physical dump"}[self.format]
        return f"{what} ({self.detail})" if self.detail else what

    def describe(self) -> str:
        what = {"lime": "LiME", "avml": "AVML (compressed)", "elf": "ELF physical dump", "raw": "raw physical"}[self.format]
        extra = f", {self.detail}" if self.detail else ""
        return f"{what} image {self.path} ({len(self.segments)} ranges, {self.physical_bytes:,} bytes of RAM{extra})"
