"""Physical memory image formats: which one a file is, and where each physical range lies in it.

A whole-machine image stores *physical* memory. zen needs two things from its container format:
whether the file is one at all (as opposed to a process core, which `ElfCoreSpace` reads), and a
table of physical ranges with the file offset holding each, so that process pages found through
the page tables become numpy views over an mmap of the image instead of copies.

The table is parsed here, not taken from Volatility's layers, for two reasons: every traversal of
untrusted headers must be bounded before anything else touches the file (a LiME file of 32-byte
headers could otherwise make any parser loop fifty million times), and format errors must become
one clear sentence. Volatility still builds its own layers over the same file for page-table
translation; the two are cross-checked when the bridge opens the image.

Formats:
- LiME (`format=lime`, also AVML's default output): a header `EMiL`, version 1, start, end,
  8 reserved bytes before each range.
- AVML compressed (version 2, snappy frames): not file-contiguous. Every frame is walked and
  checked here (Volatility's reader spins forever on streams that end early); the frame table
  then serves zen's reads of physical bytes, one decompression per 64 KiB frame, cached.
- ELF physical dumps: QEMU `dump-guest-memory`, kdump/makedumpfile ELF, VirtualBox: PT_LOAD
  segments keyed by `p_paddr`. Told apart from process cores by their notes (QEMU/VMCOREINFO,
  no NT_FILE/NT_PRPSINFO).
- raw / LiME `padded`: the file offset is the physical address.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from zen.memory.system.avml import AVML_MAGIC, read_avml
from zen.memory.system.physical import _LIME_HEADER, MAX_PHYS_ADDR, MAX_SEGMENTS, PAGE, PhysicalImage, PhysSegment
from zen.runtime.errors import ImageError

LIME_MAGIC = 0x4C694D45
ELF_MAGIC = b"\x7fELF"


def sniff(path: Path) -> str | None:
    """The physical format of a file, or None when it is a process core (or nothing zen knows).

    Cheap: reads the first bytes and, for ELF, the notes. A raw image has no header at all: any
    file that is neither LiME, AVML nor ELF is called raw here, and the kernel banner search that
    follows decides whether it holds a Linux machine at all.
    """
    with open(path, "rb") as fh:
        head = fh.read(8)
    if len(head) >= 8:
        magic, version = struct.unpack("<II", head)
        if magic == LIME_MAGIC:
            return "lime"
        if magic == AVML_MAGIC:
            return "avml"
    if head[:4] == ELF_MAGIC:
        return "elf" if _elf_is_physical(path) else None
    return "raw"


def _elf_is_physical(path: Path) -> bool:
    """An ELF core of a whole machine rather than of one process.

    Process cores (kernel, gdb, zen acquire) carry NT_FILE and NT_PRPSINFO notes; QEMU's
    dump-guest-memory carries "QEMU" notes and kdump's vmcore a VMCOREINFO note, neither has the
    process notes.
    """
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            if elf.header["e_type"] != "ET_CORE" or elf.elfclass != 64:
                return False
            names, types = set(), set()
            size = Path(path).stat().st_size
            notes_cut = False
            for i in range(min(elf.num_segments(), MAX_SEGMENTS)):
                seg = elf.get_segment(i)
                if seg["p_type"] != "PT_NOTE":
                    continue
                if seg["p_offset"] + seg["p_filesz"] > size or seg["p_filesz"] > 64 << 20:
                    notes_cut = True
                    continue
                for n, note in enumerate(seg.iter_notes()):
                    if n > 100_000:
                        break
                    if note["n_type"] in ("NT_FILE", "NT_PRPSINFO"):
                        # a process core: decided here, before a large NT_FILE (hundreds of
                        # mappings, slow to decode) would be read only to be thrown away
                        return False
                    names.add(note["n_name"])
                    types.add(note["n_type"])
    except (ELFError, OSError, ValueError, KeyError, struct.error):
        return False
    except Exception:  # pyelftools' construct raises its own types on garbage
        return False
    if "NT_FILE" in types or "NT_PRPSINFO" in types:
        return False
    if notes_cut and not types:  # notes past the end: a truncated core, told apart by the process-core reader
        return False
    return bool({"QEMU", "VMCOREINFO", "VBCORE", "VBCPU"} & names) or "NT_PRSTATUS" in types or not types


def open_physical(path: Path, fmt: str) -> PhysicalImage:
    """Parse the container of a physical image into its segment table (bounded, validated)."""
    size = path.stat().st_size
    if size < PAGE:
        raise ImageError(f"{path} is too small to be a memory image ({size} bytes)")
    if fmt == "lime":
        return _lime(path, size)
    if fmt == "avml":
        return read_avml(path, size)
    if fmt == "elf":
        return _elf(path, size)
    img = PhysicalImage(path, "raw", size, [PhysSegment(0, size, 0)])
    if size % PAGE:
        img.problems.append(f"raw image size {size:,} is not a multiple of 4096: truncated?")
    return img


def _lime(path: Path, size: int) -> PhysicalImage:
    segs: list[PhysSegment] = []
    problems: list[str] = []
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        off, last_end = 0, -1
        while off + _LIME_HEADER.size <= size:
            if len(segs) >= MAX_SEGMENTS:
                raise ImageError(f"{path}: more than {MAX_SEGMENTS} LiME ranges: corrupt or hostile file")
            magic, version, start, end, _ = _LIME_HEADER.unpack_from(mm, off)
            if magic != LIME_MAGIC:
                problems.append(f"LiME header expected at file offset {off:#x} but not found: data after it is ignored")
                break
            if version != 1:
                raise ImageError(f"{path}: LiME version {version} at file offset {off:#x} (zen reads version 1)")
            if end < start or start <= last_end or end >= MAX_PHYS_ADDR:
                raise ImageError(
                    f"{path}: LiME range {start:#x}-{end:#x} at file offset {off:#x} is out of order or impossible",
                    "the file is corrupt; re-acquire or check its hash",
                )
            length = end - start + 1
            data = off + _LIME_HEADER.size
            have = min(length, max(0, size - data))
            if have < length:
                problems.append(
                    f"image is truncated: LiME range {start:#x}-{end:#x} has {have:,} of {length:,} bytes in the file; "
                    "the rest is treated as missing"
                )
            if have:
                segs.append(PhysSegment(start, have, data))
            last_end = end
            off = data + length
    if not segs:
        raise ImageError(f"{path}: LiME header found but no memory ranges", "the file is corrupt or empty")
    return PhysicalImage(path, "lime", size, segs, problems)


def _elf(path: Path, size: int) -> PhysicalImage:
    from elftools.elf.elffile import ELFFile

    segs: list[PhysSegment] = []
    problems: list[str] = []
    names: set[str] = set()
    truncated = 0
    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            n = elf.num_segments()
            if n > MAX_SEGMENTS:
                raise ImageError(f"{path}: {n} program headers: corrupt or hostile ELF dump")
            for i in range(n):
                seg = elf.get_segment(i)
                if seg["p_type"] == "PT_NOTE" and seg["p_offset"] + seg["p_filesz"] <= size and seg["p_filesz"] < 64 << 20:
                    names.update(note["n_name"] for _, note in zip(range(10_000), seg.iter_notes()))
                if seg["p_type"] != "PT_LOAD" or seg["p_memsz"] == 0:
                    continue
                paddr, off, filesz = seg["p_paddr"], seg["p_offset"], min(seg["p_filesz"], seg["p_memsz"])
                if paddr + seg["p_memsz"] > MAX_PHYS_ADDR:
                    raise ImageError(f"{path}: PT_LOAD at physical {paddr:#x} is beyond any physical address")
                have = max(0, min(filesz, size - off))
                truncated += filesz - have
                if have:
                    segs.append(PhysSegment(paddr, have, off))
    except ImageError:
        raise
    except Exception as exc:  # pyelftools raises many types on garbage
        raise ImageError(f"corrupt ELF memory dump {path}: {type(exc).__name__}: {exc}") from None
    segs = _drop_overlaps(segs, problems)
    if truncated:
        problems.append(
            f"image is truncated: {truncated:,} bytes of physical memory lie past the end of the file; treated as missing"
        )
    if not segs:
        raise ImageError(f"{path}: ELF memory dump without memory segments")
    detail = "QEMU dump-guest-memory" if "QEMU" in names else "kdump vmcore" if "VMCOREINFO" in names else ""
    return PhysicalImage(path, "elf", size, segs, problems, detail=detail)


def _drop_overlaps(segs: list[PhysSegment], problems: list[str]) -> list[PhysSegment]:
    """Keep the first of overlapping physical ranges: two different bytes for one address cannot
    both be evidence, and a hostile dump could otherwise make lookups ambiguous."""
    out: list[PhysSegment] = []
    for s in sorted(segs, key=lambda s: (s.start, -s.length)):
        if out and s.start < out[-1].end:
            problems.append(f"overlapping physical ranges at {s.start:#x}: the later one is ignored")
            continue
        out.append(s)
    return out
