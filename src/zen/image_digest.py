"""The sha256 of an image file, computed beside the analysis that reads it.

A forked child (`zen.forking`) reads the file sequentially and hashes it, at the lowest priority:
the digest only has to be there when the manifest is written (a thread of zen's own would wait for
the interpreter lock at every block while the analysis runs Python). Without fork a thread does
it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
from pathlib import Path

from zen.forking import NICE_BULK, Forked, background, enabled

HASH_BLOCK = 8 << 20  # bytes read at a time where the image cannot be mapped
MAP_BLOCK = 64 << 20  # bytes hashed from the mapping, then released, at a time


class ImageDigest:
    """sha256 of the image file, computed while the analysis runs; `result()` -> (hex, error)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread: threading.Thread | None = None
        self._job: Forked | None = None
        self._digest: str | None = None
        self._error: str | None = None
        if enabled():
            self._job = Forked(self._compute_bytes, timeout=None, nice=NICE_BULK)
        else:
            self._thread = threading.Thread(target=self._run_thread, daemon=True, name="zen-image-sha256")
            self._thread.start()

    def result(self) -> tuple[str | None, str | None]:
        if self._job is not None:
            got = json.loads(self._job.result())
            self._digest, self._error = got["sha256"], got["error"]
            self._job = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self._digest, self._error

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()

    def _run_thread(self) -> None:
        background(NICE_BULK)
        got = json.loads(self._compute_bytes())
        self._digest, self._error = got["sha256"], got["error"]

    def _compute_bytes(self) -> bytes:
        """The digest of the file's bytes, hashed straight from a read-only mapping, released
        block by block (no copy through a buffer: a third of the system time on a multi-GB image);
        where the file cannot be mapped, read through one reused buffer. Either way the kernel is
        told the reads are sequential (more readahead)."""
        try:
            h = hashlib.sha256()
            with open(self.path, "rb", buffering=0) as fh:
                size = os.fstat(fh.fileno()).st_size
                try:
                    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
                except (OSError, ValueError):
                    mm = None
                if mm is not None:
                    with mm:
                        _hash_mapped(h, mm)
                else:
                    if hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                    buf = bytearray(HASH_BLOCK)
                    view = memoryview(buf)
                    while n := fh.readinto(buf):
                        h.update(view[:n])
            return json.dumps({"sha256": h.hexdigest(), "error": None}).encode()
        except OSError as exc:
            return json.dumps({"sha256": None, "error": str(exc)}).encode()


def _hash_mapped(h, mm: mmap.mmap) -> None:
    if hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_SEQUENTIAL)
    n, pos = len(mm), 0
    while pos < n:
        end = min(n, pos + MAP_BLOCK)
        with memoryview(mm)[pos:end] as view:
            h.update(view)
        if hasattr(mm, "madvise"):  # not resident in zen: the pages stay in the page cache
            mm.madvise(mmap.MADV_DONTNEED, pos, end - pos)
        pos = end
