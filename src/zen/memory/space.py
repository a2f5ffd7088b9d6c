"""The one address-space interface every reader above this layer uses.

An address space is a sorted set of *chunks*: contiguous virtual ranges whose bytes are available
from one backing (an mmap of a core file, an mmap of a file on disk, a live process, plain bytes).
Readers ask for bytes at a virtual address; scanners ask for numpy views of whole chunks. Nothing
above this layer knows whether the evidence is a core file or a running process.

Reads are the hottest path of the whole tool (millions of small reads for a heap census), so
`read` does one bisect and one slice in the common case and nothing else.
"""

from __future__ import annotations

import mmap
import os
import struct
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from zen.memory.regions import Region, Source
from zen.runtime.errors import MemoryReadError

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")

MAX_ADDRESS = (1 << 64) - 1  # the last address of a 64-bit space; no chunk may end past it
# Upper bound for a single read request; larger requests are a sign of a corrupt size field.
MAX_READ = 1 << 31
# Block size used when a live process region has to be copied for a bulk scan.
LIVE_BLOCK = 64 << 20
# Bytes handed to a bulk scan at a time (and then released from the resident set).
SCAN_BLOCK = 16 << 20
# zen's resident set above which image pages it means to read again are dropped anyway (gathers,
# scans of the Python heap): below it, dropping them costs a page fault per page on the next read
RESIDENT_SOFT_LIMIT = 1 << 30


def resident_bytes() -> int:
    """zen's current resident set (Linux: /proc/self/statm); unknown elsewhere, taken as large."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return 1 << 62


class Chunk(Protocol):
    """A contiguous range [start, end) of virtual memory with one backing."""

    start: int
    end: int
    source: Source

    def read(self, offset: int, size: int) -> bytes: ...

    def view(self, offset: int, size: int) -> memoryview | bytes: ...

    def array(self) -> np.ndarray: ...

    def release(self, offset: int = 0, size: int | None = None) -> None: ...


class MmapChunk:
    """Bytes that live in an mmap'ed file (a core file's segment, or a file on disk)."""

    __slots__ = ("start", "end", "source", "_mm", "_file_offset", "_fd")

    def __init__(self, start: int, end: int, mm: mmap.mmap, file_offset: int, source: Source, fd: int | None = None) -> None:
        self.start = start
        self.end = end
        self.source = source
        self._mm = mm
        self._file_offset = file_offset
        self._fd = fd  # the open file the mapping was made from (kept open by the space), if known

    def read(self, offset: int, size: int) -> bytes:
        o = self._file_offset + offset
        return self._mm[o : o + size]

    def view(self, offset: int, size: int) -> memoryview:
        """Zero-copy view of the bytes (valid while the space is open)."""
        o = self._file_offset + offset
        return memoryview(self._mm)[o : o + size]

    def array(self) -> np.ndarray:
        return np.frombuffer(self._mm, dtype=np.uint8, count=self.end - self.start, offset=self._file_offset)

    def file_span(self, offset: int, size: int) -> tuple[int, int] | None:
        """(file descriptor, file offset) of bytes [offset, offset + size) of this chunk: lets the
        tensor writer ask the kernel to read them ahead (`posix_fadvise`)."""
        if self._fd is None or offset < 0 or offset + size > self.end - self.start:
            return None
        return self._fd, self._file_offset + offset

    def backing(self) -> tuple[mmap.mmap, int]:
        """The buffer holding this chunk's bytes and the offset of its first byte in it: lets a
        gather over many small chunks of one image index the image once (scan.gather_u64)."""
        return self._mm, self._file_offset

    def release(self, offset: int = 0, size: int | None = None) -> None:
        """Drop pages of this chunk from our resident set; they stay in the page cache and fault back
        in on the next access. Bulk passes call this so that scanning or streaming a multi-GB image
        does not make zen's RSS the size of the image."""
        size = self.end - self.start - offset if size is None else size
        lo = (self._file_offset + offset) & ~(mmap.PAGESIZE - 1)
        hi = self._file_offset + offset + size
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError, AttributeError):
            pass


class BytesChunk:
    """Bytes held in memory (tests, synthetic spaces, small reconstructed ranges)."""

    __slots__ = ("start", "end", "source", "_data")

    def __init__(self, start: int, data: bytes | bytearray, source: Source = Source.IMAGE) -> None:
        self.start = start
        self.end = start + len(data)
        self.source = source
        self._data = bytes(data)

    def read(self, offset: int, size: int) -> bytes:
        return self._data[offset : offset + size]

    def view(self, offset: int, size: int) -> memoryview:
        return memoryview(self._data)[offset : offset + size]

    def array(self) -> np.ndarray:
        return np.frombuffer(self._data, dtype=np.uint8)

    def backing(self) -> tuple[bytes, int]:
        return self._data, 0

    def release(self, offset: int = 0, size: int | None = None) -> None:
        pass


class LiveChunk:
    """A readable mapping of a running process, read through /proc/PID/mem."""

    __slots__ = ("start", "end", "source", "_fd")

    def __init__(self, start: int, end: int, fd: int) -> None:
        self.start = start
        self.end = end
        self.source = Source.LIVE
        self._fd = fd

    def read(self, offset: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, self.start + offset)
        except OSError as exc:
            raise MemoryReadError(self.start + offset, size, f"process memory unreadable ({exc.strerror})") from None
        if len(data) != size:
            raise MemoryReadError(self.start + offset, size, "short read from process memory")
        return data

    def view(self, offset: int, size: int) -> bytes:
        return self.read(offset, size)

    def release(self, offset: int = 0, size: int | None = None) -> None:
        pass

    def array(self) -> np.ndarray:
        size = self.end - self.start
        buf = bytearray(size)
        view = memoryview(buf)
        pos = 0
        while pos < size:
            n = min(LIVE_BLOCK, size - pos)
            try:
                got = os.preadv(self._fd, [view[pos : pos + n]], self.start + pos)
            except OSError as exc:
                raise MemoryReadError(self.start + pos, n, f"process memory unreadable ({exc.strerror})") from None
            if got <= 0:
                raise MemoryReadError(self.start + pos, n, "short read from process memory")
            pos += got
        return np.frombuffer(buf, dtype=np.uint8)


class AddressSpace:
    """Virtual memory of one imaged process: regions (what was mapped) and chunks (what we have)."""

    def __init__(self, regions: Sequence[Region], chunks: Sequence[Chunk], *, description: str = "") -> None:
        # Addresses are 64-bit: a range ending past 2^64 - 1 exists only in a corrupt image, and every bulk reader
        # (numpy uint64 tables of chunk bounds) relies on this bound.
        beyond = [c for c in chunks if c.end > MAX_ADDRESS or c.start < 0]
        chunks = [c for c in chunks if c.end <= MAX_ADDRESS and c.start >= 0]
        regions = [r for r in regions if r.end <= MAX_ADDRESS and r.start >= 0]
        self._regions: list[Region] = sorted(regions, key=lambda r: r.start)
        self._region_starts = [r.start for r in self._regions]
        chunks = sorted((c for c in chunks if c.end > c.start), key=lambda c: c.start)
        self._chunks: list[Chunk] = list(chunks)
        self._starts = [c.start for c in self._chunks]
        self.description = description
        # Problems found while opening the evidence (truncation, missing files...): shown to the user.
        self.problems: list[str] = []
        # Notes about how evidence was completed (e.g. filled from disk): shown to the user.
        self.notes: list[str] = []
        self.problems += [f"memory at {c.start:#x} (+{c.end - c.start:,} bytes) runs past the top of the 64-bit address "
                          "space (a corrupt program header?): left out" for c in beyond[:20]]  # fmt: skip

    # -- regions -----------------------------------------------------------------------------
    @property
    def regions(self) -> list[Region]:
        return self._regions

    def region_of(self, addr: int) -> Region | None:
        i = bisect_right(self._region_starts, addr) - 1
        if i >= 0 and addr < self._regions[i].end:
            return self._regions[i]
        return None

    # -- chunks ------------------------------------------------------------------------------
    @property
    def chunks(self) -> list[Chunk]:
        return self._chunks

    def chunk_of(self, addr: int) -> Chunk | None:
        i = bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._chunks[i].end:
            return self._chunks[i]
        return None

    def run_from(self, start: int, end: int) -> list[Chunk]:
        """The chunks that hold [start, end) without a gap, from the one holding `start` up to the
        first gap or `end` (empty where `start` is not captured): one search for the whole run."""
        i = bisect_right(self._starts, start) - 1
        if i < 0 or start >= self._chunks[i].end:
            return []
        j = i + 1
        while j < len(self._chunks) and self._chunks[j].start < end and self._chunks[j].start == self._chunks[j - 1].end:
            j += 1
        return self._chunks[i:j]

    def is_readable(self, addr: int, size: int = 1) -> bool:
        """True when all of [addr, addr+size) has bytes in this space."""
        end = addr + size
        while addr < end:
            c = self.chunk_of(addr)
            if c is None:
                return False
            addr = c.end
        return True

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The sub-ranges of [start, end) that no chunk covers (mapped but not captured)."""
        out: list[tuple[int, int]] = []
        i = max(0, bisect_right(self._starts, start) - 1)
        pos = start
        while pos < end:
            while i < len(self._chunks) and self._chunks[i].end <= pos:
                i += 1
            if i >= len(self._chunks) or self._chunks[i].start >= end:
                out.append((pos, end))
                break
            c = self._chunks[i]
            if c.start > pos:
                out.append((pos, c.start))
            pos = c.end
        return out

    def iter_arrays(self, chunks: Sequence[Chunk] | None = None, block: int = SCAN_BLOCK, *,
                    keep: bool = False) -> Iterator[tuple[int, np.ndarray]]:  # fmt: skip
        """Yield (start address, uint8 array) pieces of at most `block` bytes, chunk by chunk: the
        bulk-scan view of the space. Each piece's pages are released from the resident set once
        the caller moves on, so a scan's memory cost is one block, not the image; with `keep`
        (memory the caller will read again) only while zen's resident set is above
        `RESIDENT_SOFT_LIMIT`.
        """
        for start, arr, done in self.iter_pieces(chunks, block, keep=keep):
            yield start, arr
            done()

    def iter_pieces(self, chunks: Sequence[Chunk] | None = None, block: int = SCAN_BLOCK, *,
                    keep: bool = False) -> Iterator[tuple[int, np.ndarray, Callable[[], None]]]:  # fmt: skip
        """`iter_arrays` with each piece's release left to the caller (`done()`, once it is finished
        with the piece): a scan that hands pieces to worker threads releases each after its worker."""
        for start, arr, release in self._coalesced(self._chunks if chunks is None else chunks, block, keep):
            head = (-start) % 8  # keep pieces 8-byte aligned in virtual addresses
            for pos in range(0, len(arr), block):
                lo = pos if pos == 0 else pos + head
                hi = min(len(arr), pos + block + head)
                if lo >= hi:
                    continue

                def done(release=release, lo=lo, hi=hi) -> None:
                    if not keep or resident_bytes() > RESIDENT_SOFT_LIMIT:
                        release(lo, hi - lo)

                yield start + lo, arr[lo:hi], done

    @staticmethod
    def _coalesced(chunks: Sequence[Chunk], block: int, keep: bool = False) -> Iterator[tuple[int, np.ndarray, object]]:
        """(start, bytes, release) for scanning, with runs of small virtually adjacent chunks joined.

        A process of a whole-machine image has tens of thousands of one-page chunks (its pages
        are scattered in physical memory); scanning each alone costs more in per-call overhead
        than in comparisons. Small neighbours are copied into one array instead (at most `block`
        bytes, released by the caller's next step). The copy is made from zero-copy views joined
        as bytes (a numpy array per page cost more than the copy). With `keep` the pages copied
        are released only above `RESIDENT_SOFT_LIMIT`, as `iter_arrays` does for large chunks:
        the callers that keep (a scan of the Python heap) go on to read those pages, and releasing
        them page by page was one system call each and a page fault each on the next read.
        """
        small = 1 << 20
        group: list[Chunk] = []
        size = 0

        def joined():
            if len(group) == 1:
                return group[0].start, group[0].array(), group[0].release
            data = np.frombuffer(b"".join([g.view(0, g.end - g.start) for g in group]), dtype=np.uint8)
            if not keep or resident_bytes() > RESIDENT_SOFT_LIMIT:
                for g in group:
                    g.release()
            return group[0].start, data, lambda *_: None

        for c in chunks:
            n = c.end - c.start
            if group and (c.start != group[-1].end or n >= small or size + n > block):
                yield joined()
                group, size = [], 0
            if n >= small:
                yield c.start, c.array(), c.release
                continue
            group.append(c)
            size += n
        if group:
            yield joined()

    def chunk_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list]:
        """Per chunk: start, end, index of its backing buffer (-1: none) and offset in it; and
        the backing buffers. Built once: chunks never change after the space is made."""
        t = getattr(self, "_chunk_table", None)
        if t is None:
            n = len(self._chunks)
            starts = np.fromiter((c.start for c in self._chunks), dtype=np.uint64, count=n)
            ends = np.fromiter((c.end for c in self._chunks), dtype=np.uint64, count=n)
            ids = np.full(n, -1, dtype=np.int64)
            offs = np.zeros(n, dtype=np.int64)
            buffers: list = []
            index: dict[int, int] = {}
            for i, c in enumerate(self._chunks):
                get = getattr(c, "backing", None)
                if get is None:
                    continue
                buf, off = get()
                if id(buf) not in index:
                    index[id(buf)] = len(buffers)
                    buffers.append(buf)
                ids[i], offs[i] = index[id(buf)], off
            t = self._chunk_table = (starts, ends, ids, offs, buffers)
        return t

    def release(self, *, unless_under: int | None = None) -> None:
        """Drop all image pages from zen's resident set (they stay in the page cache); with
        `unless_under`, only when the resident set is above that many bytes."""
        if unless_under is not None and resident_bytes() <= unless_under:
            return
        for c in self._chunks:
            c.release()

    def file_span(self, addr: int, size: int) -> tuple[int, int] | None:
        """(file descriptor, offset) holding bytes [addr, addr+size) when they lie in one chunk
        mapped from a file zen keeps open; None otherwise."""
        i = bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        c = self._chunks[i]
        get = getattr(c, "file_span", None)
        return get(addr - c.start, size) if get is not None and addr + size <= c.end else None

    def view(self, addr: int, size: int) -> memoryview | bytes:
        """Bytes [addr, addr+size) without copying when they lie in one mmap-backed chunk."""
        i = bisect_right(self._starts, addr) - 1
        if i >= 0:
            c = self._chunks[i]
            if addr + size <= c.end:
                return c.view(addr - c.start, size)
        return self._read_spanning(addr, size)

    # -- reads -------------------------------------------------------------------------------
    def read(self, addr: int, size: int) -> bytes:
        """Bytes [addr, addr+size). Raises MemoryReadError if any byte is unavailable."""
        i = bisect_right(self._starts, addr) - 1
        if i >= 0:
            c = self._chunks[i]
            if addr + size <= c.end:
                return c.read(addr - c.start, size)
        return self._read_spanning(addr, size)

    def _read_spanning(self, addr: int, size: int) -> bytes:
        if size < 0 or size > MAX_READ or addr < 0:
            raise MemoryReadError(addr, size, "implausible read request")
        parts = []
        pos, end = addr, addr + size
        while pos < end:
            c = self.chunk_of(pos)
            if c is None:
                region = self.region_of(pos)
                if region is None:
                    raise MemoryReadError(addr, size, f"{pos:#x} is not mapped in the image")
                raise MemoryReadError(addr, size, f"{pos:#x} is mapped ({region.path or 'anonymous'}) but not captured")
            n = min(end, c.end) - pos
            parts.append(c.read(pos - c.start, n))
            pos += n
        return b"".join(parts)

    def u64(self, addr: int) -> int:
        return _U64.unpack(self.read(addr, 8))[0]

    def i64(self, addr: int) -> int:
        return _I64.unpack(self.read(addr, 8))[0]

    def u32(self, addr: int) -> int:
        return _U32.unpack(self.read(addr, 4))[0]

    def cstring(self, addr: int, limit: int = 4096) -> bytes:
        """A NUL-terminated byte string of at most `limit` bytes (without the NUL)."""
        out = bytearray()
        pos = addr
        while len(out) < limit:
            c = self.chunk_of(pos)
            if c is None:
                raise MemoryReadError(pos, 1, "string runs into unmapped memory")
            n = min(256, c.end - pos, limit - len(out))
            block = c.read(pos - c.start, n)
            nul = block.find(b"\0")
            if nul >= 0:
                out += block[:nul]
                return bytes(out)
            out += block
            pos += n
        raise MemoryReadError(addr, limit, f"no string terminator within {limit} bytes")

    def truncation(self) -> str | None:
        """The problem saying that the image is cut short, if it is (errors in what follows are explained by it)."""
        return next((p for p in self.problems if "truncated" in p), None)

    # -- memory of devices (GPUs) ---------------------------------------------------------------
    def attach_devices(self, spaces: dict[str, AddressSpace], evidence: list[dict]) -> None:
        """Give this (host) space the memory of its devices: {"cuda:0": space, ...}; "cuda" stands for
        every CUDA device (a GPU image without a device table). `evidence` describes the files."""
        self._devices = dict(spaces)
        self.device_evidence = list(evidence)

    def attach_device(self, name: str, space: AddressSpace) -> None:
        """Add one device space beside those attached (the files given with `zen recover --offload`)."""
        self._devices = {**(getattr(self, "_devices", None) or {}), name: space}

    def device_space(self, device: str) -> AddressSpace | None:
        """Where the bytes of memory on `device` are: this space for "cpu", an attached device space,
        or None when no evidence of that device's memory was given."""
        if device == "cpu":
            return self
        devices = getattr(self, "_devices", None) or {}
        return devices.get(device) or devices.get(device.split(":", 1)[0])

    @property
    def devices(self) -> dict[str, AddressSpace]:
        return dict(getattr(self, "_devices", None) or {})

    def close(self) -> None:
        """Release file handles; subclasses own them."""

    def close_all(self) -> None:
        """Close this space and the device spaces attached to it."""
        self.close()
        for d in {id(s): s for s in self.devices.values()}.values():
            d.close()

    def __enter__(self) -> AddressSpace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_all()

    @property
    def captured_bytes(self) -> int:
        return sum(c.end - c.start for c in self._chunks)
