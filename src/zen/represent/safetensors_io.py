"""Streaming writer for the safetensors format.

Why not `safetensors.numpy.save_file`: it needs every tensor in memory at once (peak memory =
model size) and numpy has no bfloat16/float8, while zen must write any dtype tensor by tensor
straight from the image. The format is tiny and fixed — an 8-byte little-endian header length, a
JSON header mapping names to dtype/shape/byte ranges, then the raw bytes — so the writer lays out
the header from metadata first and then streams each tensor's bytes in order. Files are read back
with the safetensors library (tests do), which validates them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

OVERLAP = 1 << 20  # blocks at least this large are written while they are hashed
_COPY = getattr(os, "copy_file_range", None)  # Linux


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
        blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
        # unbuffered: the file's position is the kernel's, shared by writes and in-kernel copies
        self._fh = open(path, "wb", buffering=0)
        head = struct.pack("<Q", len(blob)) + blob
        self._write_all(head)
        # The file's own sha256 (the case manifest records it) is taken from the bytes as they are
        # written: hashing the finished file again would read a multi-GB file a second time.
        self._file_hash = hashlib.sha256(head)
        self.file_sha256: str | None = None  # set by close()
        self._next = 0
        self._executor = None
        self.sha256: dict[str, str] = {}

    def write(self, name: str, chunks: Iterable[bytes], source: tuple[int, int] | None = None) -> str:
        """Stream one tensor's bytes; returns their sha256. Must follow the entries' order.

        `source`: (file descriptor, offset) of a file that holds exactly these bytes in order (the
        image, when the tensor lies in one mapped segment): they are then copied into the output
        inside the kernel (`os.copy_file_range`) while `chunks` (views of the same bytes) are only
        hashed. That saves copying GBs through zen's address space (a third less system time for
        a 6.5 GB model here); where the copy is refused, the chunk is written as usual."""
        e = self.entries[self._next]
        if e.name != name:
            raise ValueError(f"safetensors entries must be written in order: expected {e.name}, got {name}")
        h = hashlib.sha256()
        n = 0
        for chunk in chunks:
            put = self._write_all if source is None else functools.partial(self._copy, source[0], source[1] + n)
            if len(chunk) >= OVERLAP:
                # write the block, hash it for the file and for the tensor at once: all three
                # release the GIL, and on a multi-GB model each is seconds of a core or of waiting
                # for the disk (a write held back by the kernel's dirty-page limit leaves both
                # cores to the hashes). The block's jobs end before the next block is read, so
                # the file hash sees the bytes in order.
                pool = self._pool()
                jobs = [pool.submit(put, chunk), pool.submit(self._file_hash.update, chunk)]
                h.update(chunk)
                for job in jobs:
                    job.result()
            else:
                put(chunk)
                h.update(chunk)
                self._file_hash.update(chunk)
            n += len(chunk)
        if n != e.nbytes:
            raise ValueError(f"{name}: wrote {n} bytes, header says {e.nbytes}")
        self._next += 1
        self.sha256[name] = h.hexdigest()
        return self.sha256[name]

    def _write_all(self, data) -> None:
        view = memoryview(data)
        while view:
            view = view[self._fh.write(view) :]

    def _copy(self, fd: int, offset: int, chunk) -> None:
        """`chunk`'s bytes, which are the source file's at `offset`, copied in the kernel."""
        done, n = 0, len(chunk)
        if _COPY is not None:
            start = self._fh.tell()
            try:
                while done < n:
                    got = _COPY(fd, self._fh.fileno(), n - done, offset + done)
                    if got <= 0:
                        break
                    done += got
            except OSError:  # another file system, an old kernel, ...: the position says what was copied
                done = self._fh.tell() - start
                self._fh.seek(start + done)
        if done < n:
            self._write_all(memoryview(chunk)[done:])

    def _pool(self):
        if self._executor is None:
            from concurrent.futures import ThreadPoolExecutor

            from zen.forking import background, background_level

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
        self._shutdown()
        if self._next != len(self.entries):
            self._fh.close()
            os.unlink(self.path)
            raise ValueError(f"safetensors file incomplete: {self._next} of {len(self.entries)} tensors written")
        self._fh.close()
        self.file_sha256 = self._file_hash.hexdigest()

    def abort(self) -> None:
        self._shutdown()
        self._fh.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
