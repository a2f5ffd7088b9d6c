"""Streaming writer for the safetensors format.

Why not `safetensors.numpy.save_file`: it needs every tensor in memory at once (peak memory =
model size) and numpy has no bfloat16/float8, while zen must write any dtype tensor by tensor
straight from the image. The format is tiny and fixed — an 8-byte little-endian header length, a
JSON header mapping names to dtype/shape/byte ranges, then the raw bytes — so the writer lays out
the header from metadata first and then streams each tensor's bytes in order. Files are read back
with the safetensors library (tests do), which validates them.

The bytes go to the file through `_DirectOutput`: page-aligned blocks written with O_DIRECT where
the file system takes it, past the page cache.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from zen.evidence.hashing import sha256, update_both

SLICE = 256 << 10  # bytes staged, then hashed for the tensor and the file: small enough to stay in the CPU's cache
STAGE = 8 << 20  # bytes per write: a multiple of every device's block size
_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # safetensors dtype code: F32, BF16, I8, ...
    shape: tuple[int, ...]
    nbytes: int


class SafetensorsWriter:
    """Write `entries` in order; call `write(name, chunks)` for each, then `close()`."""

    def __init__(self, path: str | os.PathLike, entries: list[Entry], metadata: dict[str, str] | None = None) -> None:
        self.path = path
        self.entries = entries
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        pos = 0
        self._ranges = {}
        seen: set[str] = set()
        for e in entries:
            if e.name in seen or e.name == "__metadata__":  # a dict header would silently keep one
                raise ValueError(f"safetensors entry name {e.name!r} used twice (or reserved)")
            seen.add(e.name)
            header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [pos, pos + e.nbytes]}
            self._ranges[e.name] = (pos, pos + e.nbytes)
            pos += e.nbytes
        # backslashreplace: a name read from an image may hold a lone surrogate; it is written as its JSON escape
        blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")
        blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
        self._executor = None
        self._out = _DirectOutput(path, self._pool)
        head = struct.pack("<Q", len(blob)) + blob
        self._out.put(head)
        # The file's own sha256 (the case manifest records it) is taken from the bytes as they are
        # written: hashing the finished file again would read a multi-GB file a second time.
        self._file_hash = sha256(head)
        self.file_sha256: str | None = None  # set by close()
        self._next = 0
        self.sha256: dict[str, str] = {}

    def write(self, name: str, chunks: Iterable[bytes]) -> str:
        """Stream one tensor's bytes; returns their sha256. Must follow the entries' order.

        Each byte is copied once, into the output's staging block, and hashed for the tensor and
        for the file in one pass (`zen.evidence.hashing.update_both`: the two streams' rounds
        interleaved where the CPU has the SHA instructions), `SLICE` bytes at a time: the pass reads
        what the copy left in the CPU's cache. (Hashing whole 16 MB blocks, the file's digest in a second thread,
        took 25-30% more CPU for the same bytes on this project's machines: each pass read the
        block from memory again. An in-kernel copy from the image, `os.copy_file_range`, was used
        before that: it saved the copy but filled the page cache with the output, which cost more.)"""
        e = self.entries[self._next]
        if e.name != name:
            raise ValueError(f"safetensors entries must be written in order: expected {e.name}, got {name}")
        h, fh, out = sha256(), self._file_hash, self._out
        n = 0
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            for i in range(0, len(view), SLICE):
                part = view[i : i + SLICE]
                out.put(part)
                update_both(h, fh, part)
            n += len(view)
        if n != e.nbytes:
            raise ValueError(f"{name}: wrote {n} bytes, header says {e.nbytes}")
        self._next += 1
        self.sha256[name] = h.hexdigest()
        return self.sha256[name]

    def _pool(self):
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            from zen.runtime.forking import background, background_level

            # at the priority of the thread that writes (lower than the analysis when that runs beside)
            level = background_level()
            self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="zen-safetensors",
                                                initializer=background if level else None, initargs=(level,))  # fmt: skip
        return self._executor

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def close(self) -> None:
        if self._next != len(self.entries):
            self.abort()
            raise ValueError(f"safetensors file incomplete: {self._next} of {len(self.entries)} tensors written")
        try:
            self._out.close()
        except BaseException:
            self.abort()
            raise
        self._shutdown()
        self.file_sha256 = self._file_hash.hexdigest()

    def abort(self) -> None:
        self._shutdown()  # every pending write ends before the file is closed
        self._out.abort()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class _DirectOutput:
    """The file's bytes, in order, through two page-aligned staging blocks written with O_DIRECT.

    A multi-GB weights file written through the page cache costs the kernel a fresh page per 4 KiB
    (allocated, filled, written back, then reclaimed): on this project's machines that was more
    system time than the two sha256 passes over the same bytes, and it pushes the image's pages
    out of the cache. Direct writes of whole blocks skip all of that. Each full block is written
    by a pool thread while the next one fills; the last, partial block (and every block where the
    file system refuses O_DIRECT: tmpfs, some network file systems) is written the ordinary way,
    with O_DIRECT cleared on the same descriptor, so the file is the same bytes either way."""

    def __init__(self, path, pool) -> None:
        self._pool = pool
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self.direct = bool(_DIRECT)
        try:
            self.fd = os.open(path, flags | _DIRECT, 0o666)
        except OSError:
            if not _DIRECT:
                raise
            self.fd, self.direct = os.open(path, flags, 0o666), False
        self._blocks = [mmap.mmap(-1, STAGE), mmap.mmap(-1, STAGE)]  # anonymous maps: page-aligned
        self._pending: list = [None, None]
        self._cur, self._fill, self._offset = 0, 0, 0  # block being filled, bytes in it, its file offset

    def put(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            block = self._blocks[self._cur]
            n = min(len(view), STAGE - self._fill)
            block[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == STAGE:
                # each block at its own offset: two blocks' writes may run at once
                self._pending[self._cur] = self._pool().submit(self._write, self._cur, STAGE, self._offset)
                self._offset += STAGE
                self._cur ^= 1
                self._wait(self._cur)  # its previous write must be done before it is refilled
                self._fill = 0

    def _wait(self, i: int) -> None:
        job = self._pending[i]
        if job is not None:
            try:
                job.result()
            finally:
                if job.done():  # interrupted while it runs: `abort` waits for it before closing the file
                    self._pending[i] = None

    def _write(self, i: int, size: int, offset: int) -> None:
        view = memoryview(self._blocks[i])[:size]
        while view:
            direct = self.direct  # as this write was issued (the other block's thread may clear it)
            try:
                done = os.pwrite(self.fd, view, offset)
            except OSError as exc:
                if not direct or exc.errno != 22:  # EINVAL: this file system refuses direct I/O
                    raise
                self._buffered()
                continue
            if done <= 0:
                raise OSError(f"write returned {done}")
            view, offset = view[done:], offset + done
            if view and self.direct:
                self._buffered()  # a short direct write leaves an unaligned rest

    def _buffered(self) -> None:
        import fcntl

        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~_DIRECT)
        self.direct = False

    def close(self) -> None:
        self._wait(self._cur ^ 1)
        self._wait(self._cur)
        if self._fill:
            if self.direct:
                self._buffered()  # the last block is not a whole number of device blocks
            self._write(self._cur, self._fill, self._offset)
        os.close(self.fd)
        self.fd = -1
        self._free()

    def _free(self) -> None:
        """Unmap the staging blocks now rather than whenever the writer is collected (8 MiB each)."""
        for block in self._blocks:
            try:
                block.close()
            except BufferError:  # a view of it is still alive somewhere: the collector frees it
                pass

    def abort(self) -> None:
        for i in (0, 1):
            try:
                self._wait(i)
            except Exception:  # noqa: BLE001 - the error that led here is the one to report
                pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._free()
