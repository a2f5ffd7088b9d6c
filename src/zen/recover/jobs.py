"""The work `zen recover` does beside its analysis: the tensor files (and the image's sha256,
`zen.evidence.image_digest`).

Both are bulk I/O and sha256 over GBs, and neither needs anything the analysis finds after they
start. Run in threads of zen's own process they would still take the interpreter's lock between
blocks, and while the analysis runs Python a thread waits up to a switch interval (5 ms) for it
each time: the tensor writer took four times as long beside the code stage as alone. So each runs
in a forked child (`zen.runtime.forking`) that has the image's mmap and the tensor records already, at a
lower priority than the analysis; only its result (digests) comes back. Where fork is not
available the image is hashed by a thread and the tensors are written on the calling thread when
their result is asked for, giving the same files.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from zen import __version__
from zen.evidence import digest_cache
from zen.frontends.keras.tensors import TFDataMissing
from zen.frontends.pytorch.tensors import TensorDataMissing
from zen.represent import case
from zen.represent.safetensors_io import Entry, SafetensorsWriter
from zen.represent.tensorfile import REUSE_ABOVE
from zen.runtime.errors import ZenError
from zen.runtime.forking import NICE_BULK, Forked

Progress = Callable[[str, int, int], None]


class TensorFiles:
    """weights.safetensors (and extra.safetensors) written while the analysis goes on.

    Which tensors are written is decided here, on the calling thread, before the child starts
    (`_writable`: a tensor whose pages are missing is marked so), so the records' statuses are the
    same in both processes; the child sends back each written tensor's sha256, the files' sha256
    and its own time, and `result()` puts the tensor digests into the records."""

    def __init__(self, out: Path, reader, slots, extra, progress: Progress | None, fmt: str) -> None:
        self.jobs = [(out / case.WEIGHTS, _writable(reader, slots), True)]
        if extra:
            self.jobs.append((out / case.EXTRA, _writable(reader, extra), False))
        self.reader, self.fmt = reader, fmt
        self.seconds = 0.0
        self._job = Forked(self._write, timeout=None, progress=progress, nice=NICE_BULK)

    def result(self) -> dict[str, str]:
        """File name -> sha256 of each file written (tensor records get their sha256); raises
        what writing raised (computed here again when the child failed, so the error is the
        reader's own)."""
        got = json.loads(self._job.result())
        for (_path, slots, _), shas in zip(self.jobs, got["tensors"]):
            for s, sha in zip(slots, shas):
                s.record.sha256 = sha
        self.seconds = got["seconds"]
        return got["files"]

    def cancel(self) -> None:
        self._job.cancel()

    def _write(self, report: Progress | None = None) -> bytes:
        t = time.perf_counter()
        files, tensors = {}, []
        for path, slots, shows in self.jobs:
            files[path.name] = _write_tensors(path, self.reader, slots, report if shows else None, self.fmt)
            tensors.append([s.record.sha256 for s in slots])
        return json.dumps({"files": files, "tensors": tensors, "seconds": time.perf_counter() - t}).encode()


def _writable(reader, slots) -> list:
    """The slots whose tensor data is in the image; the others are marked missing."""
    writable = []
    for s in slots:
        m, rec = s.meta, s.record
        if m is None or rec.status != "ok":
            continue
        lo, hi = m.extent()
        start, size = m.data_ptr + lo * m.itemsize, (hi - lo) * m.itemsize
        if m.numel and not reader.space_of(m).is_readable(start, size):
            rec.status, rec.note = "missing", reader.missing_range_note(m, start, size)
            continue
        writable.append(s)
    return writable


def _write_tensors(path: Path, reader, writable, progress: Progress | None, fmt: str) -> str:
    """Stream every tensor of `writable` into a safetensors file, in order; returns the file's sha256."""
    total = sum(s.meta.nbytes for s in writable)
    meta = {"format": fmt, "producer": f"zen {__version__}"}
    tied = {s.key: s.record.tied_to for s in writable if s.record.tied_to}
    if tied:
        meta["zen_tied"] = ",".join(f"{k}={v}" for k, v in tied.items())
    w = SafetensorsWriter(path, [Entry(s.key, s.meta.safetensors, s.meta.shape, s.meta.nbytes) for s in writable], meta)
    done = 0
    try:
        ahead = _Readahead([reader.file_span(s.meta) for s in writable], [s.meta.nbytes for s in writable])
        for i, s in enumerate(writable):
            ahead.up_to(i)
            s.record.sha256 = w.write(s.key, reader.iter_bytes(s.meta))
            done += s.meta.nbytes
            if progress:
                progress(path.stem, done, total)
        w.close()
        key = digest_cache.stat_key(path)  # the file as the writer left it: its digests are those of the bytes written
        if key is not None and key[2] >= REUSE_ABOVE:  # for the commands that check the case later (represent.tensorfile)
            digest_cache.remember_tensor_file(path, w.file_sha256, w.sha256, key)  # type: ignore[arg-type]
        return w.file_sha256  # type: ignore[return-value]
    except (TensorDataMissing, TFDataMissing) as exc:
        w.abort()
        raise ZenError(f"tensor data became unreadable while writing {path.name}: {exc}") from None
    except BaseException:
        w.abort()
        raise


READAHEAD = 256 << 20  # bytes of tensor data asked of the disk ahead of the one being written


class _Readahead:
    """Ask the kernel to read the next tensors' bytes from the image while this one is hashed and
    copied (`posix_fadvise(WILLNEED)` starts the reads and returns). The census leaves most tensor
    data unread (`zen.memory.allocations`), so from a cold page cache the writer can be the first
    to read it: left to page faults, the two hashes and the copy of each block would wait for
    the disk in turn, the disk idle while they hash."""

    def __init__(self, spans: list, sizes: list[int]) -> None:
        self.spans, self.sizes = spans, sizes
        self.starts = [0, *itertools.accumulate(sizes)]  # bytes before each tensor, in writing order
        self.next = 0  # first tensor not asked for yet
        self.advise = getattr(os, "posix_fadvise", None)

    def up_to(self, i: int) -> None:
        """Tensor `i` is next to be written: keep READAHEAD bytes asked for beyond its start."""
        self.next = max(self.next, i)
        while self.advise is not None and self.next < len(self.spans) and self.starts[self.next] - self.starts[i] < READAHEAD:
            span, n = self.spans[self.next], self.sizes[self.next]
            if span is not None and n:
                try:  # at most READAHEAD of one tensor: a bigger request blocks until most of it is queued
                    self.advise(span[0], span[1], min(n, READAHEAD), os.POSIX_FADV_WILLNEED)
                except OSError:  # not a file that takes advice: reads go on as page faults
                    self.advise = None
            self.next += 1
