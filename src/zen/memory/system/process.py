"""One process of a whole-machine image as zen's `AddressSpace`.

Its regions are the process's VMAs; its chunks are the pages the page tables say are resident,
translated to file offsets of the image. Runs of virtual pages that are also contiguous in the
file become one `MmapChunk`, so bulk scans stay numpy views over the image and nothing is
copied. Pages that are mapped but not resident (swapped out, never touched, or dropped from the
page cache) are "mapped but not captured", exactly as in a truncated core.

Read-only file mappings are completed from the mapped files on this machine when pages are
missing, as for lean cores; a file is used only when every resident page of it in the image
equals the file's bytes at the same offset (checked here, and noted in the manifest).
"""

from __future__ import annotations

import mmap
import os

from zen.memory.elfcore import CoreInfo
from zen.memory.regions import Region, Source
from zen.memory.space import AddressSpace, BytesChunk, Chunk, MmapChunk, resident_bytes
from zen.memory.system.kernel import Kernel
from zen.memory.system.tasks import ProcessEntry, pgd_physical, process_layer, process_vmas
from zen.runtime.errors import ImageError

PAGE = 4096
# Pages the page tables may hand out per process before zen stops believing them: more than
# the image's physical pages times this factor means the tables are cyclic or forged.
MAPPING_BUDGET_FACTOR = 4
# Below this share of resident bytes in anonymous writable mappings, the process's heap is
# effectively gone (swapped out or not imaged): refuse with the missing ranges named.
MIN_RESIDENT_SHARE = 0.02
# Bytes of a mapped file compared with the image before the file may complete missing pages.
VERIFY_BYTES = 1 << 20


class AvmlChunk:
    """Bytes of a compressed AVML image (not file-contiguous), read through the image's frame table
    (`avml.AvmlFrames`: one decompression per 64 KiB frame, cached) at physical `phys`."""

    __slots__ = ("start", "end", "source", "_frames", "_phys")

    def __init__(self, start: int, end: int, frames, phys: int) -> None:
        self.start, self.end, self.source = start, end, Source.IMAGE
        self._frames, self._phys = frames, phys

    def read(self, offset: int, size: int) -> bytes:
        return self._frames.read(self._phys + offset, size)

    def view(self, offset: int, size: int) -> bytes:
        return self.read(offset, size)

    def array(self):
        import numpy as np

        return np.frombuffer(self.read(0, self.end - self.start), dtype=np.uint8)

    def release(self, offset: int = 0, size: int | None = None) -> None:
        pass


class SystemProcessSpace(AddressSpace):
    """The virtual memory of one process of a whole-machine image."""

    def __init__(
        self,
        kernel: Kernel,
        entry: ProcessEntry,
        *,
        fill_from_disk: bool = True,
        file_root: str | None = None,
        walker: str = "numpy",
    ) -> None:
        self.kernel = kernel
        self.entry = entry
        self._disk_maps: list[mmap.mmap] = []
        if entry.kernel_thread:
            raise ImageError(f"PID {entry.pid} ({entry.comm}) is a kernel thread: it has no user address space")
        regions = process_vmas(kernel, entry)
        self._pgd = pgd_physical(kernel, entry)
        numpy_walk = walker == "numpy" and (kernel.mm is not None or kernel.phys.avml is not None) and self._pgd is not None
        # Volatility's process layer only where its page-by-page walk is used (the reference, or no mmap to read)
        layer = None if numpy_walk else process_layer(kernel, entry)
        if (layer is None and not numpy_walk) or not regions:
            raise ImageError(
                f"PID {entry.pid} ({entry.comm}): its page tables or mappings are not readable in the image",
                "the process may have exited while the image was taken; choose another with `zen ps`",
            )
        problems: list[str] = list(entry.problems)
        notes: list[str] = []
        chunks = self._resident_chunks(layer, regions, problems, walker)
        chunks, regions = self._fill(regions, chunks, fill_from_disk, file_root, problems, notes)
        super().__init__(regions, chunks, description=f"PID {entry.pid} ({entry.comm}) of {kernel.phys.describe()}")
        self.problems.extend(kernel.phys.problems)
        self.problems.extend(problems)
        self.notes.extend(notes)
        self.info = CoreInfo(command=entry.cmdline or entry.comm, pid=entry.pid, producer=kernel.phys.producer)
        self._check_resident()
        self.release()  # pages touched while verifying and walking need not stay in zen's RSS

    # -- resident pages ----------------------------------------------------------------------
    def _translations(self, layer_name: str | None, regions: list[Region], walker: str, budget: int):
        """(virtual, size, physical) arrays of resident runs, region by region in order, and the budget's message
        where the walk stopped early (the runs before it are kept).

        `walker` "numpy" reads whole page tables from the image's mmap, or from its AVML frames
        (pagetables.py); "volatility" asks Volatility's layer page by page (the reference)."""
        import numpy as np

        from zen.memory.system.pagetables import PageTableWalker, WalkBudgetExceeded

        kernel = self.kernel
        readable = [r for r in regions if r.readable or r.path]  # PROT_NONE reservations hold nothing
        parts: list = []
        if walker == "numpy" and (kernel.mm is not None or kernel.phys.avml is not None) and self._pgd is not None:
            pt = PageTableWalker(self._read_table, max_tables=budget // 64 + 4096, max_pages=budget)
            try:
                for r in readable:
                    parts.append(pt.run_arrays(self._pgd, r.start, r.end))
            except WalkBudgetExceeded as exc:
                parts.append(exc.partial)  # type: ignore[attr-defined]
                return _concatenated(parts), str(exc)
            return _concatenated(parts), None
        layer = kernel.ctx.layers[layer_name]
        pages = 0
        rows: list[tuple[int, int, int]] = []
        stopped = None
        for r in readable:
            for vaddr, size, paddr, _, _ in layer.mapping(r.start, r.size, ignore_errors=True):
                pages += max(1, size // PAGE)
                if pages > budget:
                    stopped = f"more than {budget:,} resident pages mapped"
                    break
                rows.append((vaddr, size, paddr))
            if stopped:
                break
        cols = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return (cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].copy()), stopped

    def _read_table(self, phys: int):
        import numpy as np

        img = self.kernel.phys
        if self.kernel.mm is None:
            hit = img.physical_run(phys, PAGE)
            if hit is None or hit[1] < PAGE:
                return None
            return np.frombuffer(img.avml.read(phys, PAGE), dtype=np.uint64)
        hit = img.file_offset(phys, PAGE)
        if hit is None or hit[1] < PAGE:
            return None
        return np.frombuffer(self.kernel.mm, dtype=np.uint64, count=512, offset=hit[0])

    def _resident_chunks(self, layer_name: str | None, regions: list[Region], problems: list[str], walker: str) -> list[Chunk]:
        """The resident runs as chunks: each run located in the image (a file offset in the mmap, or for compressed
        AVML the physical address itself, read through the image's frames), and runs that are contiguous both
        virtually and in the image joined. With arrays: a run inside one physical segment (nearly all) is located
        by one search over the segments for all of them; the others (crossing a segment's end, or outside every
        segment: each missing page counted) one by one as before."""
        import numpy as np

        phys = self.kernel.phys
        budget = max(1 << 18, MAPPING_BUDGET_FACTOR * (phys.physical_bytes // PAGE))
        mm = self.kernel.mm
        (v, n, p), stopped = self._translations(layer_name, regions, walker, budget)
        if stopped:
            problems.append(f"the page tables of this process look cyclic or forged ({stopped}): translation stopped there")
        seg_start = np.array([s.start for s in phys.segments], dtype=np.int64)
        seg_end = np.array([s.end for s in phys.segments], dtype=np.int64)
        if mm is not None:  # where a physical address lies in the file (segments not in the file: never simple)
            seg_base = np.array([-1 if s.file_offset is None else s.file_offset for s in phys.segments], dtype=np.int64)
        else:
            seg_base = seg_start
        if len(seg_start):
            i = np.searchsorted(seg_start, p, side="right") - 1  # as `bisect_right` in file_offset
            w = np.maximum(i, 0)
            simple = (i >= 0) & (p + n <= seg_end[w]) & (seg_base[w] >= 0)
            at = np.where(simple, seg_base[w] + (p - seg_start[w]), -1)
        else:
            simple, at = np.zeros(len(p), dtype=bool), np.full(len(p), -1, dtype=np.int64)
        if not simple.all():
            v, n, at = self._located_one_by_one(v, n, p, at, simple, mm is not None)
        missing_phys = int(np.count_nonzero(at < 0)) * PAGE
        chunks: list[Chunk] = []
        if len(v):
            found = at >= 0
            joins = found[:-1] & found[1:] & (v[:-1] + n[:-1] == v[1:]) & (at[:-1] + n[:-1] == at[1:])
            heads = np.concatenate(([0], np.flatnonzero(~joins) + 1))
            sizes = np.add.reduceat(n, heads)
            for va, size, off in zip(v[heads].tolist(), sizes.tolist(), at[heads].tolist()):
                if off < 0:
                    continue  # a page the image does not hold (a run of its own)
                if mm is not None:
                    chunks.append(MmapChunk(va, va + size, mm, off, Source.IMAGE))
                else:
                    chunks.append(AvmlChunk(va, va + size, phys.avml, off))
        if missing_phys:
            problems.append(
                f"{missing_phys:,} bytes of this process's resident pages lie at physical addresses the image does not hold "
                "(truncated image, or ranges the acquisition tool skipped)"
            )
        return chunks

    def _located_one_by_one(self, v, n, p, at, simple, in_file: bool):
        """The runs `simple` leaves out, located a piece at a time (`file_offset` / `physical_run`: a run may continue
        into the next segment, and each page outside every segment is a piece of its own, at -1), spliced in order."""
        import numpy as np

        locate = self.kernel.phys.file_offset if in_file else self.kernel.phys.physical_run
        rows: list[tuple[int, int, int]] = []
        vl, nl, pl, al, sl = v.tolist(), n.tolist(), p.tolist(), at.tolist(), simple.tolist()
        for vaddr, size, paddr, off, ok in zip(vl, nl, pl, al, sl):
            if ok:
                rows.append((vaddr, size, off))
                continue
            pos = 0
            while pos < size:
                hit = locate(paddr + pos, size - pos)
                if hit is None:
                    rows.append((vaddr + pos, PAGE, -1))
                    pos += PAGE
                    continue
                rows.append((vaddr + pos, hit[1], hit[0]))
                pos += hit[1]
        cols = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].copy()

    # -- completion from disk ----------------------------------------------------------------
    def _fill(self, regions, chunks, fill_from_disk, file_root, problems, notes):
        """Map missing pages of read-only file mappings from the files on this machine."""
        space = AddressSpace(regions, chunks)
        if not fill_from_disk:
            return chunks, regions
        filled: dict[str, int] = {}
        refused: set[str] = set()
        opened: dict[str, tuple[mmap.mmap, int] | None] = {}
        out_regions = []
        for r in regions:
            if not (r.file_backed and r.readable and not r.writable) or r.path.endswith(" (deleted)"):
                out_regions.append(r)
                continue
            gaps = _gaps(space, r.start, r.end)
            if not gaps:
                out_regions.append(r)
                continue
            if r.path not in opened:
                opened[r.path] = self._open_verified(r.path, file_root, space, regions, refused)
            entry = opened[r.path]
            if entry is None:
                out_regions.append(r)
                continue
            dm, fsize = entry
            for lo, hi in gaps:
                foff = r.offset + (lo - r.start)
                if foff >= fsize:
                    continue
                n = min(hi - lo, fsize - foff)
                chunks.append(MmapChunk(lo, lo + n, dm, foff, Source.DISK))
                tail = min(hi, (lo + n + PAGE - 1) // PAGE * PAGE)
                if tail > lo + n:
                    chunks.append(BytesChunk(lo + n, bytes(tail - lo - n), Source.DISK))
                filled[r.path] = filled.get(r.path, 0) + (tail - lo)
            out_regions.append(r)
        for path in sorted(refused):
            problems.append(f"mapped file {path} on this machine differs from its pages in the image; not used")
        if filled:
            notes.append(
                f"{sum(filled.values()):,} bytes of read-only file mappings ({len(filled)} files) were not resident in the "
                "image and were read from the mapped files on this machine (each verified against its resident pages)"
            )
        return chunks, out_regions

    def _open_verified(self, path: str, file_root, space: AddressSpace, regions: list[Region], refused: set[str]):
        local = os.path.join(file_root, path.lstrip("/")) if file_root else path
        try:
            if not os.path.isfile(local) or (size := os.stat(local).st_size) == 0:
                return None
            with open(local, "rb") as fh:
                dm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError:
            return None
        # Compare the pages that a process never writes: the ELF header page (offset 0) and
        # executable text. Read-only data at other offsets may legitimately differ (RELRO pages
        # are relocated copy-on-write, then made read-only), so it is kept from the image, never
        # used as evidence that the file is another one.
        # At most VERIFY_BYTES per file: another build differs everywhere, so a sample decides,
        # and comparing all of a large library's resident text would make zen's RSS grow by it.
        checked = 0
        for r in regions:
            if r.path != path or r.writable or not (r.executable or r.offset == 0):
                continue
            for c in _chunks_in(space, r.start, r.end):
                if c.source is not Source.IMAGE or checked >= VERIFY_BYTES:
                    continue
                lo, hi = max(c.start, r.start), min(c.end, r.end, max(c.start, r.start) + VERIFY_BYTES - checked)
                if not r.executable:
                    hi = min(hi, r.start + PAGE)
                foff = r.offset + (lo - r.start)
                n = min(hi - lo, max(0, size - foff))
                if n <= 0:
                    continue
                if dm[foff : foff + n] != c.read(lo - c.start, n):
                    dm.close()
                    refused.add(path)
                    return None
                checked += n
        try:
            dm.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass
        self._disk_maps.append(dm)
        return dm, size

    def _check_resident(self) -> None:
        anon = [r for r in self.regions if r.writable and not r.file_backed and r.size < 1 << 40]
        total = sum(r.size for r in anon)
        have = sum(_captured(self, r.start, r.end) for r in anon)
        if self.captured_bytes == 0 or (total > 64 * PAGE and have < MIN_RESIDENT_SHARE * total):
            worst = sorted(anon, key=lambda r: -(r.size - _captured(self, r.start, r.end)))[:5]
            named = ", ".join(f"{r.start:#x}-{r.end:#x} {r.path or '[anon]'}" for r in worst)
            raise ImageError(
                f"PID {self.entry.pid} ({self.entry.comm}): only {have:,} of {total:,} bytes of its writable memory are "
                f"in the image (largest missing ranges: {named})",
                "the process was swapped out or the image is incomplete; an image taken while the model was serving helps",
            )

    def release(self, *, unless_under: int | None = None) -> None:
        """Drop every image and file page from zen's resident set: one madvise per mapping
        instead of one per chunk (there are tens of thousands of chunks here); with
        `unless_under`, only when the resident set is above that many bytes."""
        if unless_under is not None and resident_bytes() <= unless_under:
            return
        for buf in self.chunk_table()[4]:
            if isinstance(buf, mmap.mmap):
                try:
                    buf.madvise(mmap.MADV_DONTNEED)
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        for m in self._disk_maps:
            try:
                m.close()
            except BufferError:
                pass
        self._disk_maps.clear()
        if self.kernel.phys.avml is not None:
            self.kernel.phys.avml.close()
        img = getattr(self, "system_image", None)
        if img is not None:
            img.close()
            self.system_image = None


def _chunks_in(space: AddressSpace, start: int, end: int) -> list[Chunk]:
    from bisect import bisect_left, bisect_right

    starts = [c.start for c in space.chunks] if not hasattr(space, "_starts") else space._starts
    return space.chunks[max(0, bisect_right(starts, start) - 1) : bisect_left(starts, end)]


def _gaps(space: AddressSpace, start: int, end: int) -> list[tuple[int, int]]:
    return space.gaps(start, end)


def _captured(space: AddressSpace, start: int, end: int) -> int:
    return (end - start) - sum(hi - lo for lo, hi in space.gaps(start, end))


def _concatenated(parts: list) -> tuple:
    """Region-by-region run arrays as one (virtual, size, physical) triple, in order."""
    import numpy as np

    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return tuple(np.concatenate([part[k] for part in parts]) for k in range(3))
