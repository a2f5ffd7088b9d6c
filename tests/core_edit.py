"""Hand-built hostile images: read and write a word at a virtual address of an ELF core (tests only)."""

from __future__ import annotations

from pathlib import Path


def segment(fh, addr: int, n: int) -> int:
    """File offset of virtual address `addr` in an ELF core (its PT_LOAD segment must hold n bytes there)."""
    from elftools.elf.elffile import ELFFile

    for seg in ELFFile(fh).iter_segments():
        h = seg.header
        if h.p_type == "PT_LOAD" and h.p_vaddr <= addr and addr + n <= h.p_vaddr + h.p_filesz:
            return h.p_offset + addr - h.p_vaddr
    raise AssertionError(f"{addr:#x} is not in the image's data")


def peek(img: Path, addr: int) -> int:
    import struct

    with open(img, "rb") as fh:
        fh.seek(segment(fh, addr, 8))
        return struct.unpack("<Q", fh.read(8))[0]


def poke(img: Path, out: Path, addr: int, data: bytes) -> Path:
    """A copy of an ELF core with `data` written at virtual address `addr` (a hand-built hostile image)."""
    import shutil

    shutil.copyfile(img, out)
    with open(out, "r+b") as fh:
        fh.seek(segment(fh, addr, len(data)))
        fh.write(data)
    return out


def read(img: Path, addr: int, n: int) -> bytes:
    with open(img, "rb") as fh:
        fh.seek(segment(fh, addr, n))
        return fh.read(n)
