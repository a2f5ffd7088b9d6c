"""The work `zen recover` does beside its analysis: the image's sha256 and the tensor files.

Both are bulk I/O and sha256 over GBs, and neither needs anything the analysis finds after they
start. Run in threads of zen's own process they would still take the interpreter's lock between
blocks, and while the analysis runs Python a thread waits up to a switch interval (5 ms) for it
each time: the tensor writer took four times as long beside the code stage as alone. So each runs
in a forked child (`zen.forking`) that has the image's mmap and the tensor records already, at a
lower priority than the analysis; only its result (digests) comes back. Where fork is not
available the image is hashed by a thread and the tensors are written on the calling thread when
their result is asked for, giving the same files.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from zen import __version__
from zen.errors import ZenError
from zen.forking import NICE_BULK, Forked, background, enabled
from zen.frontends.keras.tensors import TFDataMissing
from zen.frontends.pytorch.tensors import TensorDataMissing
from zen.represent import case
from zen.represent.safetensors_io import Entry, SafetensorsWriter

Progress = Callable[[str, int, int], None]
HASH_BLOCK = 8 << 20


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
        """The digest read through one reused buffer: a fresh 16 MB `bytes` per read would cost a
        page fault per 4 KB of image. The kernel is told the read is sequential (more readahead)."""
        try:
            h = hashlib.sha256()
            buf = bytearray(HASH_BLOCK)
            view = memoryview(buf)
            with open(self.path, "rb", buffering=0) as fh:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
                while n := fh.readinto(buf):
                    h.update(view[:n])
            return json.dumps({"sha256": h.hexdigest(), "error": None}).encode()
        except OSError as exc:
            return json.dumps({"sha256": None, "error": str(exc)}).encode()


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
    space = reader.ip.space
    writable = []
    for s in slots:
        m, rec = s.meta, s.record
        if m is None or rec.status != "ok":
            continue
        lo, hi = m.extent()
        if m.numel and not space.is_readable(m.data_ptr + lo * m.itemsize, (hi - lo) * m.itemsize):
            rec.status, rec.note = "missing", "tensor data pages are not in the image"
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
        for s in writable:
            s.record.sha256 = w.write(s.key, reader.iter_bytes(s.meta))
            done += s.meta.nbytes
            if progress:
                progress(path.stem, done, total)
        w.close()
        return w.file_sha256  # type: ignore[return-value]
    except (TensorDataMissing, TFDataMissing) as exc:
        w.abort()
        raise ZenError(f"tensor data became unreadable while writing {path.name}: {exc}") from None
    except BaseException:
        w.abort()
        raise
