"""The sha256 of an image file, computed beside the analysis that reads it, once per evidence file.

A forked child (`zen.runtime.forking`) reads the file sequentially and hashes it while the analysis runs (a thread of
zen's own would wait for the interpreter lock at every block while the analysis runs Python); without fork a thread
does it. It runs at the analysis's own priority and starts first: at the lowest priority it got almost no CPU on a
busy machine, and a 4 s recovery waited a minute for its digest (issue 39). A digest zen computed before for the
same, unchanged file is reused (`zen.evidence.digest_cache`); the manifest says which.

A reused digest leaves nobody reading the file in order: the analysis then pulled the image from disk page fault
by page fault, and a GPT-2 recovery with its digest reused took longer from a cold page cache than one that hashed
the image (4.0 against 3.6 s). `warm_page_cache` has the kernel read the file into the page cache ahead of it,
in order, without copying it to zen (`sendfile` to /dev/null: 0.04 s of CPU for 1.5 GB): 3.72 -> 3.53 s (medians
of six, alternated, cold page cache), and with two reads in flight instead of one the model stage a further
0.07-0.14 s (`WARM_STREAMS`). Beside a digest being computed it gained nothing (the hashing child already reads in
order), so it runs only where the digest is reused.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from zen.evidence import digest_cache
from zen.runtime.forking import Forked, enabled

HASH_BLOCK = 8 << 20  # bytes read at a time where the image cannot be mapped
MAP_BLOCK = 64 << 20  # bytes hashed from the mapping, then released, at a time
NICE_DIGEST = 0  # the analysis's own priority: the digest is on the path to the manifest


class ImageDigest:
    """sha256 of the image file, computed while the analysis runs (or reused); `result()` -> (hex, error).

    `provenance` says how the digest was obtained; `seconds` is how long computing it took and `waited` how long
    the caller waited for it at the end (both 0 for a reused digest)."""

    def __init__(self, path: Path, *, rehash: bool = False) -> None:
        self.path = path
        self._thread: threading.Thread | None = None
        self._job: Forked | None = None
        self._digest: str | None = None
        self._error: str | None = None
        self._display: Callable[[str, int, int], None] | None = None
        self.seconds = self.waited = 0.0
        self._hash_seconds: float | None = None
        self._key = digest_cache.stat_key(path)
        hit = None if rehash else digest_cache.lookup(path)
        if hit is not None:
            self._digest = hit.pop("sha256")
            self.provenance = hit
            warm_page_cache(path)
            return
        self.provenance = {"how": "computed in this run" + (" (--rehash)" if rehash else "")}
        self._t0 = time.perf_counter()
        if enabled():
            self._job = Forked(self._compute_bytes, timeout=None, nice=NICE_DIGEST, progress=self._on_progress)
        else:
            self._thread = threading.Thread(target=self._run_thread, daemon=True, name="zen-image-sha256")
            self._thread.start()

    def _on_progress(self, _stage: str, done: int, total: int) -> None:
        if self._display is not None:
            self._display("evidence sha256", done, total)

    def result(self, display: Callable[[str, int, int], None] | None = None) -> tuple[str | None, str | None]:
        """The digest, waiting for it if needed; `display(stage, done, total)` shows the hashing's progress while
        it is the last thing running."""
        t = time.perf_counter()
        self._display = display
        computed = self._job is not None or self._thread is not None
        if self._job is not None:
            got = json.loads(self._job.result())
            self._digest, self._error = got["sha256"], got["error"]
            self._hash_seconds = got.get("seconds")
            self._job = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if computed:
            self.waited = time.perf_counter() - t
            # the hashing's own time (from start to its last block), not when the analysis came to ask for it
            self.seconds = self._hash_seconds if self._hash_seconds is not None else time.perf_counter() - self._t0
            if self._digest:
                digest_cache.remember(self.path, self._digest, self._key)
        return self._digest, self._error

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()

    def _run_thread(self) -> None:
        got = json.loads(self._compute_bytes(self._on_progress))
        self._digest, self._error, self._hash_seconds = got["sha256"], got["error"], got.get("seconds")

    def _compute_bytes(self, report: Callable[[str, int, int], None] | None = None) -> bytes:
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
                        _hash_mapped(h, mm, report)
                else:
                    if hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                    buf = bytearray(HASH_BLOCK)
                    view = memoryview(buf)
                    while n := fh.readinto(buf):
                        h.update(view[:n])
            return json.dumps({"sha256": h.hexdigest(), "error": None, "seconds": time.perf_counter() - self._t0}).encode()
        except OSError as exc:
            return json.dumps({"sha256": None, "error": str(exc)}).encode()


def _hash_mapped(h, mm: mmap.mmap, report: Callable[[str, int, int], None] | None = None) -> None:
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
        if report is not None:
            report("evidence sha256", pos, n)


WARM_STEP = 64 << 20  # bytes the kernel is asked to read at a time
# Reads kept in flight: the virtual disks measured read a file faster with two requests at a time than with one
# (1.47 GB by `sendfile`: one stream 0.82-1.02 s, two 0.59-0.75 s, four 0.60-0.77 s), and the census needs
# pages from the whole image (the Python heap lies between the tensors) before the model stage can end.
WARM_STREAMS = 2


def warm_page_cache(path: Path) -> list[threading.Thread]:
    """Read `path` into the page cache in daemon threads (the GIL is released in `sendfile`), `WARM_STEP` blocks
    taken in order from its start by `WARM_STREAMS` threads; nothing (no thread) where the file is more than half
    of this machine's memory (it would push out what it read first, and the analysis's own pages) or where
    `sendfile` to /dev/null is not available. GPT-2's process image with its digest reused, from a cold page
    cache, one stream against two in three runs of alternated rounds (8, 8, 16): `zen recover` 3.79 -> 3.61,
    3.78 -> 3.75, 3.49 -> 3.42 s; its model stage 1.24 -> 1.10, 1.26 -> 1.14, 1.15 -> 1.08 s (medians)."""
    try:
        size = os.stat(path).st_size
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return []
    if not size or size > memory // 2 or not hasattr(os, "sendfile"):
        return []
    blocks = iter(range(0, size, WARM_STEP))
    lock = threading.Lock()
    threads = [threading.Thread(target=_send_to_null, args=(path, size, blocks, lock), daemon=True,
                                name="zen-page-cache") for _ in range(WARM_STREAMS)]  # fmt: skip
    for t in threads:
        t.start()
    return threads


def _send_to_null(path: Path, size: int, blocks: Iterator[int], lock: threading.Lock) -> None:
    """Send the blocks this thread takes from `blocks` to /dev/null (the kernel reads them into the page cache)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        os.close(fd)
        return
    try:
        while True:
            with lock:
                start = next(blocks, None)
            if start is None:
                break
            pos, end = start, min(size, start + WARM_STEP)
            while pos < end:
                n = os.sendfile(null, fd, pos, end - pos)
                if n <= 0:
                    return
                pos += n
    except OSError:  # the kernel or the file system does not do it: the analysis reads the pages itself
        pass
    finally:
        os.close(fd)
        os.close(null)
