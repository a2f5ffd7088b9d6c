"""ELF core files as address spaces: zen's own cores, gdb's `gcore`, and kernel core dumps.

The three producers differ in what they leave out. Kernel cores (and gcore with the default
coredump filter) omit read-only file-backed mappings, which is where CPython keeps the names of its
static types. Those bytes are unchanged copies of the mapped file, so when the file named in the
NT_FILE note still exists on this machine we map it in, mark the region `Source.DISK`, and say so.
When the image holds any page of the same mapping, we compare it with the file first and refuse a
file that differs: evidence must not be silently completed from the wrong binary.

Headers and notes are decoded with pyelftools; segment bytes are served straight from an mmap of
the core so that numpy scans never copy the image.
"""

from __future__ import annotations

import mmap
import os
import struct
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from zen.memory.regions import Region, Source, perms_from_elf_flags
from zen.memory.space import AddressSpace, BytesChunk, Chunk, MmapChunk
from zen.runtime.errors import ImageError

# Offsets inside the x86_64 `struct elf_prstatus` (336 bytes).
PRSTATUS_PID = 32
PRSTATUS_REG = 112
REG_NAMES = (
    "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs"
).split()
ZEN_NOTE_NAME = "ZEN"
ZEN_NOTE_TYPE = 0x5A454E01  # acquisition metadata written by `zen acquire`
MAX_NOTES_BYTES = 64 << 20  # refuse absurd note segments in hostile files


@dataclass(frozen=True)
class MappedFile:
    """One NT_FILE entry: [start, end) maps `path` from byte `offset`."""

    start: int
    end: int
    offset: int
    path: str


@dataclass
class ThreadInfo:
    """A thread recorded in an NT_PRSTATUS note."""

    tid: int
    registers: dict[str, int] = field(default_factory=dict)


@dataclass
class CoreInfo:
    """What the core's notes say about the process, independent of its memory."""

    files: list[MappedFile] = field(default_factory=list)
    threads: list[ThreadInfo] = field(default_factory=list)
    auxv: dict[int, int] = field(default_factory=dict)
    command: str = ""
    pid: int | None = None
    producer: str = "unknown"  # "zen", "gdb", "kernel"
    acquisition: dict = field(default_factory=dict)  # contents of zen's own note, if any


NT_FILE_TYPE = 0x46494C45


def _check_notes(data: bytes) -> None:
    """Every note of a PT_NOTE segment lies inside it, and an NT_FILE's entry count fits its descriptor; else the
    core is refused before pyelftools decodes it (it allocates what the sizes claim)."""
    pos, n = 0, 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
        name_end = pos + 12 + ((namesz + 3) & ~3)
        end = name_end + ((descsz + 3) & ~3)
        if end > len(data):
            raise ImageError(f"corrupt note in core: note {n} claims {namesz:,} + {descsz:,} bytes past its segment's end")
        if ntype == NT_FILE_TYPE and descsz >= 16:
            count = struct.unpack_from("<Q", data, name_end)[0]
            if 16 + count * 24 > descsz:
                raise ImageError(f"corrupt NT_FILE note in core: {count:,} mappings do not fit its {descsz:,} bytes")
        pos, n = end, n + 1


class ElfCoreSpace(AddressSpace):
    """An ELF core file opened read-only and mmap'ed."""

    def __init__(self, path: str | os.PathLike, *, fill_from_disk: bool = True, file_root: str | None = None) -> None:
        self.path = Path(path)
        self._files_open: list = []
        self._maps: list[mmap.mmap] = []
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            raise ImageError(f"image not found: {self.path}", "check the path") from None
        except IsADirectoryError:
            raise ImageError(f"image is a directory, not a file: {self.path}") from None
        except PermissionError:
            raise ImageError(f"image is not readable (permission denied): {self.path}") from None
        self._files_open.append(fh)
        size = os.fstat(fh.fileno()).st_size
        self.file_size = size
        head = fh.read(64)
        if len(head) < 4 or head[:4] != b"\x7fELF":
            fh.close()
            raise ImageError(
                f"not an ELF core file: {self.path}",
                "zen reads ELF core dumps (zen acquire, gcore, kernel cores)",
            )
        if len(head) < 64:
            fh.close()
            raise ImageError(f"truncated image: {self.path} ends inside the ELF header ({size} bytes)")
        try:
            elf = ELFFile(fh)
            e_type = elf.header["e_type"]
            if e_type != "ET_CORE":
                raise ImageError(
                    f"{self.path} is an ELF file but not a core dump (type {e_type})",
                    "give zen a memory image: `zen acquire --pid PID -o IMAGE`, gcore, or a kernel core",
                )
            if elf.elfclass != 64 or not elf.little_endian:
                raise ImageError(f"{self.path}: only 64-bit little-endian cores are supported")
            phoff, phnum, phentsize = elf.header["e_phoff"], elf.header["e_phnum"], elf.header["e_phentsize"]
            if phoff + phnum * phentsize > size:
                raise ImageError(f"truncated image: program headers of {self.path} run past the end of the file")
            segments = [elf.get_segment(i) for i in range(phnum)]
            info = self._parse_notes(segments, size)
        except ImageError:
            fh.close()
            raise
        except (ELFError, struct.error, ValueError, OSError, KeyError, IndexError, TypeError) as exc:
            fh.close()
            raise ImageError(f"corrupt ELF core {self.path}: {exc}") from None
        except Exception as exc:  # pyelftools' construct raises its own exception types
            fh.close()
            raise ImageError(f"corrupt ELF core {self.path}: {type(exc).__name__}: {exc}") from None
        self.info = info
        problems: list[str] = []
        notes: list[str] = []
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        if mm is not None:
            self._maps.append(mm)
        regions, chunks = self._layout(segments, info, mm, fh.fileno(), size, problems, notes, fill_from_disk, file_root)
        regions = self._label_pseudo(regions, info.acquisition.get("pseudo_regions", []))
        super().__init__(regions, chunks, description=f"ELF core {self.path}")
        self.problems.extend(problems)
        self.notes.extend(notes)

    # -- notes -------------------------------------------------------------------------------
    @staticmethod
    def _parse_notes(segments, file_size: int) -> CoreInfo:
        info = CoreInfo()
        saw_gdb = False
        for seg in segments:
            if seg["p_type"] != "PT_NOTE":
                continue
            if seg["p_filesz"] > MAX_NOTES_BYTES or seg["p_offset"] + seg["p_filesz"] > file_size:
                raise ImageError("truncated or corrupt note segment in core")
            _check_notes(seg.data())  # sizes inside the segment: pyelftools trusts them (a 2^61-entry NT_FILE: GBs)
            for note in seg.iter_notes():
                ntype, name, desc = note["n_type"], note["n_name"], note["n_desc"]
                if ntype == "NT_FILE":
                    page = desc["page_size"] or 1
                    for ent, fname in zip(desc["Elf_Nt_File_Entry"], desc["filename"]):
                        path = fname.decode("utf-8", "surrogateescape") if isinstance(fname, bytes) else str(fname)
                        info.files.append(MappedFile(ent["vm_start"], ent["vm_end"], ent["page_offset"] * page, path))
                elif ntype == "NT_PRSTATUS" and isinstance(desc, bytes) and len(desc) >= PRSTATUS_REG + 8 * 27:
                    tid = struct.unpack_from("<i", desc, PRSTATUS_PID)[0]
                    regs = struct.unpack_from("<27Q", desc, PRSTATUS_REG)
                    info.threads.append(ThreadInfo(tid, dict(zip(REG_NAMES, regs))))
                elif ntype == "NT_AUXV":
                    raw = desc if isinstance(desc, bytes) else b""
                    for i in range(0, len(raw) - 15, 16):
                        k, v = struct.unpack_from("<QQ", raw, i)
                        if k == 0:
                            break
                        info.auxv[k] = v
                elif ntype == "NT_PRPSINFO" and not isinstance(desc, bytes):
                    info.pid = int(desc["pr_pid"])
                    args = desc["pr_psargs"].split(b"\0", 1)[0]
                    info.command = args.decode("utf-8", "replace").strip()
                elif name == ZEN_NOTE_NAME and ntype == ZEN_NOTE_TYPE:
                    import json

                    try:
                        info.acquisition = json.loads(bytes(desc).rstrip(b"\0").decode("utf-8"))
                    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: hostile nesting
                        info.acquisition = {"error": "unreadable zen acquisition note"}
                elif name == "GDB":
                    saw_gdb = True
        if info.acquisition:
            info.producer = "zen"
        elif saw_gdb:
            info.producer = "gdb"
        else:
            info.producer = "kernel"
        if info.pid is None and info.threads:
            info.pid = info.threads[0].tid
        return info

    # -- memory layout -----------------------------------------------------------------------
    def _layout(self, segments, info: CoreInfo, mm, fd, file_size, problems, notes, fill_from_disk, file_root):
        files = sorted(info.files, key=lambda f: f.start)
        file_starts = [f.start for f in files]

        def mapped_file(addr: int) -> MappedFile | None:
            i = bisect_right(file_starts, addr) - 1
            if i >= 0 and addr < files[i].end:
                return files[i]
            return None

        regions: list[Region] = []
        chunks: list[Chunk] = []
        missing: list[tuple[int, int, MappedFile | None, str]] = []
        truncated = 0
        loads = [s for s in segments if s["p_type"] == "PT_LOAD"]
        covered: list[tuple[int, int]] = []
        starts = sorted({s["p_vaddr"] for s in loads if s["p_memsz"]})
        overruns: list[str] = []
        for seg in loads:
            vaddr, memsz = seg["p_vaddr"], seg["p_memsz"]
            if memsz == 0:
                continue
            # A core holds one PT_LOAD per mapping, never two over the same address: a segment that runs into the
            # next one claims memory its process did not have (a forged p_memsz of 2^63 made zen map a whole
            # library from disk over every mapping above it), so it ends where the next one starts.
            i = bisect_right(starts, vaddr)
            if i < len(starts) and vaddr + memsz > starts[i]:
                overruns.append(f"{vaddr:#x} claims {memsz:,} bytes, past the next segment at {starts[i]:#x}")
                memsz = starts[i] - vaddr
            off, filesz = seg["p_offset"], min(seg["p_filesz"], memsz)
            perms = perms_from_elf_flags(seg["p_flags"])
            mf = mapped_file(vaddr)
            path = mf.path if mf else ""
            foff = (mf.offset + vaddr - mf.start) if mf else 0
            have = 0
            if filesz and mm is not None:
                have = max(0, min(filesz, file_size - off))
                if have < filesz:
                    truncated += filesz - have
                if have:
                    chunks.append(MmapChunk(vaddr, vaddr + have, mm, off, Source.IMAGE, fd))
            elif filesz:
                truncated += filesz
            source = Source.IMAGE if have == memsz else (Source.MISSING if have == 0 else Source.IMAGE)
            regions.append(Region(vaddr, vaddr + memsz, perms, path, foff, source))
            covered.append((vaddr, vaddr + memsz))
            if have < memsz and perms.startswith("r"):  # PROT_NONE guard gaps held nothing the process could read
                missing.append((vaddr + have, vaddr + memsz, mf, perms))
        # NT_FILE mappings with no PT_LOAD at all (some producers drop them entirely).
        covered.sort()
        cov_starts = [c[0] for c in covered]
        for f in files:
            i = bisect_right(cov_starts, f.start) - 1
            if i >= 0 and f.start < covered[i][1]:
                continue
            regions.append(Region(f.start, f.end, "r--p", f.path, f.offset, Source.MISSING))
            missing.append((f.start, f.end, f, "r--p"))
        if overruns:
            problems.append(f"{len(overruns)} program header(s) overlap the next segment (a corrupt or forged core: "
                            f"{'; '.join(overruns[:3])}{' ...' if len(overruns) > 3 else ''}); each is read only up "
                            "to the next segment's start")  # fmt: skip
        if truncated:
            problems.append(
                f"image is truncated: {truncated:,} bytes of segment data lie past the end of the file "
                f"({file_size:,} bytes); those ranges are treated as missing"
            )
        filled, unfilled, past_file = 0, {}, 0
        disk_maps: dict[str, tuple[mmap.mmap, int] | None] = {}
        for start, end, mf, _perms in missing:
            if mf is None or not fill_from_disk or not mf.path.startswith("/"):
                continue
            if end > mf.end:  # the file is mapped over [mf.start, mf.end) only, whatever a segment claims
                past_file += end - max(start, mf.end)
                end = mf.end
                if end <= start:
                    continue
            got = self._fill(start, end, mf, file_root, disk_maps, chunks, problems, files)
            if got < 0:  # wholly past the end of the file: pages the process could not read either
                continue
            if got:
                filled += got
                self._mark_disk(regions, start, end)
            else:
                unfilled[mf.path] = unfilled.get(mf.path, 0) + (end - start)
        if filled:
            notes.append(
                f"{filled:,} bytes of read-only file mappings were not in the image and were read from "
                f"the mapped files on this machine (verified against the image where it held a page)"
            )
        if past_file:
            problems.append(f"{past_file:,} bytes of segments run past the end of the file mapping they start in "
                            "(NT_FILE): not read from the file, left missing")  # fmt: skip
        if unfilled:
            shown = ", ".join(sorted(unfilled)[:4]) + (" ..." if len(unfilled) > 4 else "")
            problems.append(
                f"{sum(unfilled.values()):,} bytes of file mappings are neither in the image nor "
                f"available on disk ({len(unfilled)} files: {shown})"
            )
        return regions, chunks

    @staticmethod
    def _label_pseudo(regions: list[Region], pseudo: list) -> list[Region]:
        """Name anonymous regions ([heap], [stack]...) from zen's acquisition note."""
        names = {}
        for item in pseudo if isinstance(pseudo, list) else []:
            if isinstance(item, list) and len(item) == 3 and isinstance(item[2], str):
                names[(item[0], item[1])] = item[2]
        if not names:
            return regions
        return [
            Region(r.start, r.end, r.perms, names.get((r.start, r.end), r.path), r.offset, r.source) if not r.path else r
            for r in regions
        ]

    @staticmethod
    def _mark_disk(regions: list[Region], start: int, end: int) -> None:
        for i, r in enumerate(regions):
            if r.start <= start < r.end:
                regions[i] = Region(r.start, r.end, r.perms, r.path, r.offset, Source.DISK)
                return

    def _fill(self, start, end, mf: MappedFile, file_root, disk_maps, chunks, problems, files) -> int:
        """Map [start, end) from the file on disk if it exists and agrees with the image.

        Returns the bytes mapped, 0 when the file is unavailable, -1 when the range lies wholly
        past the file's end (a reservation such as a loader's alignment gap: never readable)."""
        path = mf.path
        if path.endswith(" (deleted)"):
            return 0
        if path not in disk_maps:
            disk_maps[path] = self._open_disk_file(path, file_root, chunks, problems, files)
        entry = disk_maps[path]
        if entry is None:
            return 0
        dm, fsize = entry
        file_off = mf.offset + (start - mf.start)
        if file_off >= fsize:
            return -1
        avail = min(end - start, fsize - file_off)
        chunks.append(MmapChunk(start, start + avail, dm, file_off, Source.DISK))
        # The kernel zero-fills the rest of the page that holds the end of the file.
        tail_end = min(end, (start + avail + 4095) // 4096 * 4096)
        if tail_end > start + avail:
            chunks.append(BytesChunk(start + avail, bytes(tail_end - start - avail), Source.DISK))
        return tail_end - start

    def _open_disk_file(self, path, file_root, chunks, problems, files):
        """mmap a mapped file from disk after checking it against the image's copy of its first page.

        Producers that omit file mappings still keep the first page of each ELF file (the kernel
        and `zen acquire --lean` both do), so a file that changed since imaging is caught here.
        """
        local = os.path.join(file_root, path.lstrip("/")) if file_root else path
        try:
            if not os.path.isfile(local):
                return None
            size = os.stat(local).st_size
            if size == 0:
                return None
            with open(local, "rb") as fh:
                dm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError:
            return None
        for f in files:
            if f.path != path or f.offset != 0:
                continue
            for c in chunks:
                if c.source is Source.IMAGE and c.start <= f.start < c.end:
                    n = min(4096, c.end - f.start, size)
                    if dm[:n] != c.read(f.start - c.start, n):
                        problems.append(f"mapped file {path} on this machine differs from the image; not used")
                        dm.close()
                        return None
                    break
        self._maps.append(dm)
        return dm, size

    def close(self) -> None:
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass  # a numpy view is still alive; the map is released when it goes away
        for f in self._files_open:
            f.close()
        self._maps.clear()
        self._files_open.clear()
