"""A GPU core as an address space: device global memory, served from an mmap of the file.

Each `.cudbg.global.N` segment becomes one chunk at its device address, so everything above this
layer reads GPU memory exactly as it reads host memory (`view`, `read`, `file_span` for the tensor
writer's readahead). A gzip-compressed core (the driver's GZIP_COMPRESS flag, or a
`.gz` copy) is unpacked once into a private temporary file, bounded in size and by the free space
of the disk it goes to, and hashed while it is unpacked. Its size is also bounded by the file's own: a gzip core
may inflate to `gpu_inflate` times its size (above a floor), so a few megabytes of gzip bomb cannot fill the disk
evidence is kept on (issue 49.3); a genuine dump of mostly empty memory is allowed with `--limit gpu_inflate=N`.
"""

from __future__ import annotations

import gzip
import hashlib
import mmap
import os
import shutil
import tempfile
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path

from zen.memory.gpu.cudacore import CudaCore, is_cuda_core_header, parse
from zen.memory.regions import Region, Source
from zen.memory.space import AddressSpace, MmapChunk
from zen.runtime.errors import ImageError

GZIP_MAGIC = b"\x1f\x8b"
MAX_UNPACKED = 1 << 40  # 1 TiB: more than any GPU's memory; ZEN_GPU_MAX_UNPACKED lowers or raises it
FREE_MARGIN = 1 << 30  # leave this much free on the disk the unpacked core goes to
INFLATE_FLOOR = 256 << 20  # any gzip core may inflate to this much, whatever its ratio


@dataclass(frozen=True)
class GpuLimits:
    """Bounds on GPU cores, settable with `--limit` (zen.recover.limits). The real H200 core of the shared fixture
    inflates 37x; a gzip bomb of zeros about 1,000x."""

    gpu_inflate: int = 128  # a gzip core may inflate to this many times its own size (and at least INFLATE_FLOOR)


BLOCK = 16 << 20


def sniff_gpu_core(path: str | os.PathLike) -> str | None:
    """ "plain" or "gzip" when `path` is a CUDA GPU core (gzip: checked on the unpacked header), else None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:2] == GZIP_MAGIC:
                fh.seek(0)
                try:
                    with gzip.GzipFile(fileobj=fh) as gz:
                        head = gz.read(64)
                except (OSError, EOFError, zlib.error):
                    return None
                return "gzip" if is_cuda_core_header(head) else None
    except OSError:
        return None
    return "plain" if is_cuda_core_header(head) else None


class Unpacked:
    """A gzip file unpacked into a private temporary file (removed when this object goes)."""

    def __init__(self, src: Path, limits: GpuLimits | None = None) -> None:
        ratio = (limits or GpuLimits()).gpu_inflate
        packed = os.path.getsize(src)
        by_ratio = max(INFLATE_FLOOR, ratio * packed)
        limit = min(int(os.environ.get("ZEN_GPU_MAX_UNPACKED", MAX_UNPACKED)), by_ratio)
        where = os.environ.get("ZEN_TMPDIR") or tempfile.gettempdir()
        fd, name = tempfile.mkstemp(prefix="zen-gpucore-", suffix=".nvcudmp", dir=where)
        self.path = Path(name)
        self._finalizer = weakref.finalize(self, _unlink, name)
        h, n = hashlib.sha256(), 0
        try:
            with os.fdopen(fd, "wb") as out, gzip.open(src, "rb") as gz:
                while True:
                    block = gz.read(BLOCK)
                    if not block:
                        break
                    n += len(block)
                    if n > limit and limit == by_ratio:
                        raise ImageError(f"GPU core {src} inflates to more than {ratio}x its {packed:,} bytes (stopped "
                                         f"at {limit:,} bytes): a gzip bomb, or a dump of mostly empty memory",
                                         f"if the dump is genuine, allow more: `--limit gpu_inflate={ratio * 8}`")  # fmt: skip
                    if n > limit:
                        raise ImageError(f"GPU core {src} unpacks to more than {limit:,} bytes",
                                         "set ZEN_GPU_MAX_UNPACKED (bytes) if the dump is really that large")  # fmt: skip
                    if n % (1 << 30) < BLOCK and shutil.disk_usage(where).free < FREE_MARGIN + BLOCK:
                        raise ImageError(f"not enough free space in {where} to unpack GPU core {src} "
                                         f"({n:,} bytes so far)", "set ZEN_TMPDIR to a directory on a larger disk")  # fmt: skip
                    h.update(block)
                    out.write(block)
        except ImageError:
            self.remove()
            raise
        except (OSError, EOFError, zlib.error) as exc:
            self.remove()
            raise ImageError(f"GPU core {src} is a damaged gzip file: {exc}",
                             "check the copy, or give the uncompressed core") from None  # fmt: skip
        self.size, self.sha256 = n, h.hexdigest()

    def remove(self) -> None:
        self._finalizer()


def _unlink(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


class GpuCoreSpace(AddressSpace):
    """Device global memory of one GPU core file (plain or gzip)."""

    def __init__(self, path: str | os.PathLike, limits: GpuLimits | None = None) -> None:
        self.path = Path(path)
        self.unpacked: Unpacked | None = None
        kind = sniff_gpu_core(self.path)
        if kind is None:
            raise ImageError(f"{self.path} is not a CUDA GPU core (ELF, machine EM_CUDA), plain or gzip",
                             "give the file the CUDA driver or `zen acquire` wrote (*.nvcudmp)")  # fmt: skip
        if kind == "gzip":
            self.unpacked = Unpacked(self.path, limits)
        data_path = self.unpacked.path if self.unpacked else self.path
        self._fh = open(data_path, "rb")
        size = os.fstat(self._fh.fileno()).st_size
        self.file_size = size
        try:
            self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
            self.core: CudaCore = parse(self.path, self._mm, size)
        except BaseException:
            self.close()
            raise
        chunks = [MmapChunk(s.address, s.end, self._mm, s.offset, Source.IMAGE, self._fh.fileno()) for s in self.core.segments]
        regions = [Region(s.address, s.end, "rw-p", f"[gpu {s.name}]") for s in self.core.segments]
        super().__init__(regions, chunks, description=f"GPU core {self.path}")
        self.problems += [f"{self.path.name}: {p}" for p in self.core.problems]

    def evidence(self) -> dict:
        """What the manifest records about this file (its sha256 is computed by the caller)."""
        core = self.core
        ev = {"path": str(self.path.resolve()), "size": self.path.stat().st_size, "kind": "cuda-gpu-core",
              "devices": [{k: v for k, v in d.to_json().items() if k != "contexts"} | {"contexts": len(d.contexts)}
                          for d in core.devices],
              "global_memory": {"segments": len(core.segments), "bytes": core.global_bytes},
              "meta": core.meta_json()}  # fmt: skip
        if core.zen_note is not None:
            ev["acquisition"] = core.zen_note
        if self.unpacked is not None:
            ev["compression"] = "gzip"
            ev["unpacked"] = {"size": self.unpacked.size, "sha256": self.unpacked.sha256}
        return ev

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # views of it are still alive: the mapping goes when they do
                pass
        fh = getattr(self, "_fh", None)
        if fh is not None:
            fh.close()
        if self.unpacked is not None:
            self.unpacked.remove()
