"""Tensors in an image: THPVariable -> at::Tensor -> TensorImpl -> StorageImpl -> data.

Metadata (dtype, sizes, strides, storage offset, device, requires_grad) comes from the C++
objects, with offsets from the torch layout profile; sizes beyond the inline slots are followed
out of line. Data is read from the storage's data pointer, in bounded blocks, and produced in C
(row-major) order whatever the tensor's strides, so a transposed parameter comes out exactly as
`tensor.contiguous()` would. Every field is checked against the others (numel == prod(shape),
the strided extent fits in the storage) before a byte of data is trusted.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from zen.cpython.interp import Interpreter
from zen.frontends.pytorch.profile import TorchProfile
from zen.runtime.errors import MemoryReadError, ObjectError

MAX_DIMS = 64
BLOCK = 16 << 20
_RAW = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8", 16: "V16"}


class TensorDataMissing(ObjectError):
    """The tensor's metadata was read but its data is not in the image."""


@dataclass
class TensorMeta:
    addr: int  # the Python object (THPVariable)
    impl: int  # TensorImpl*
    dtype: str
    itemsize: int
    safetensors: str | None
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    numel: int
    device: str
    requires_grad: bool
    storage: int  # StorageImpl*
    data_ptr: int
    storage_nbytes: int
    python_type: str = "torch.Tensor"

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def contiguous(self) -> bool:
        expected = 1
        for size, st in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and st != expected:
                return False
            expected *= size
        return True

    def extent(self) -> tuple[int, int]:
        """(first, last+1) element index touched in the storage (empty tensors: (offset, offset))."""
        if self.numel == 0:
            return self.storage_offset, self.storage_offset
        lo = self.storage_offset + sum(st * (n - 1) for n, st in zip(self.shape, self.stride) if st < 0)
        hi = self.storage_offset + sum(st * (n - 1) for n, st in zip(self.shape, self.stride) if st > 0)
        return lo, hi + 1


class TensorReader:
    """Reads tensor metadata and data from an interpreter's image."""

    def __init__(self, ip: Interpreter, prof: TorchProfile) -> None:
        self.ip = ip
        self.tp = prof
        T = prof.tensorimpl
        self._impl_fields = T.reader(
            "storage", "autograd_meta", "ndim", "storage_offset", "numel", "dtype", "device_type", "device_index"
        )
        self._span = max(T.sizes + 8 * 2 * prof.constants["SIZES_INLINE"], T.device_index + 1)

    def device_object(self, addr: int) -> str:
        """The device a `torch.device` object names ("cpu", "cuda:1", "meta")."""
        D = self.tp.thpdevice
        raw = self.ip.read_within(addr + D.type, 2, addr, "torch.device")
        name = self.tp.device_types.get(raw[0], f"device{raw[0]}")
        index = raw[1] - 256 if raw[1] > 127 else raw[1]
        return f"{name}:{index}" if index >= 0 else name

    def meta(self, addr: int) -> TensorMeta:
        """The metadata of the Python tensor at `addr` (its TensorImpl, read by `impl_meta`)."""
        meta = self.impl_meta(self.ip.ptr(addr + self.tp.variable.cdata), addr)
        try:
            meta.python_type = self.ip.type_name(addr)
        except ObjectError:
            pass
        return meta

    def impl_meta(self, impl: int, addr: int) -> TensorMeta:
        """The metadata of a TensorImpl; `addr` names the tensor in errors and records (a Python tensor, or the
        TensorImpl itself where no Python object holds it, as in TorchScript modules)."""
        ip, tp = self.ip, self.tp
        try:
            raw = ip.space.read(impl, max(self._span, self._impl_fields.size))
        except MemoryReadError:
            raise ObjectError(addr, f"TensorImpl at {impl:#x} not in the image") from None
        f = self._impl_fields.unpack(raw)
        ndim = f.ndim
        if not 0 <= ndim <= MAX_DIMS:
            raise ObjectError(addr, f"implausible tensor rank {ndim}")
        T = tp.tensorimpl
        inline = tp.constants["SIZES_INLINE"]
        if ndim <= inline:
            shape = struct.unpack_from(f"<{ndim}q", raw, T.sizes)
            stride = struct.unpack_from(f"<{ndim}q", raw, T.strides)
        else:
            ext = struct.unpack_from("<Q", raw, T.sizes)[0]
            vals = struct.unpack(f"<{2 * ndim}q", ip.read_within(ext, 16 * ndim, addr, "out-of-line sizes"))
            shape, stride = vals[:ndim], vals[ndim:]
        dt = tp.dtypes.get(f.dtype)
        if dt is None:
            raise ObjectError(addr, f"unknown dtype index {f.dtype}")
        if any(n < 0 for n in shape) or f.numel != math.prod(shape) or f.storage_offset < 0:
            raise ObjectError(addr, f"inconsistent tensor metadata (shape {shape}, numel {f.numel}, offset {f.storage_offset})")
        device = tp.device_types.get(f.device_type, f"device{f.device_type}")
        if device != "cpu" and f.device_index >= 0:
            device = f"{device}:{f.device_index}"
        requires_grad = False
        if f.autograd_meta:
            try:
                requires_grad = bool(ip.space.read(f.autograd_meta + tp.autogradmeta.requires_grad, 1)[0])
            except MemoryReadError:
                requires_grad = False
        storage = f.storage
        data_ptr = nbytes = 0
        if storage:
            S = tp.storageimpl
            try:
                data_ptr = ip.space.u64(storage + S.data)
                nbytes = ip.space.i64(storage + S.nbytes)
            except MemoryReadError:
                raise ObjectError(addr, f"StorageImpl at {storage:#x} not in the image") from None
        meta = TensorMeta(addr, impl, dt.name, dt.itemsize, dt.safetensors, tuple(shape), tuple(stride), f.storage_offset,
                          f.numel, device, requires_grad, storage, data_ptr, nbytes)  # fmt: skip
        if meta.numel and (meta.on_cpu or data_ptr):  # a meta-device tensor has no bytes to bound
            lo, hi = meta.extent()
            if lo < 0 or hi * meta.itemsize > nbytes:
                raise ObjectError(addr, f"tensor extent {lo}..{hi} exceeds its storage of {nbytes} bytes")
        return meta

    def space_of(self, meta: TensorMeta):
        """The address space holding the tensor's bytes: the image for CPU tensors, the attached
        GPU image for CUDA tensors (zen.memory.gpu), None when that device's memory was not given."""
        return self.ip.space.device_space(meta.device)

    def has_data(self, meta: TensorMeta) -> bool:
        return self.space_of(meta) is not None

    @staticmethod
    def missing_device_note(meta: TensorMeta) -> str:
        if meta.device.startswith("cuda"):
            return (
                f"data on device {meta.device}, not in this image: give the GPU image of the process "
                "(`zen recover IMAGE --gpu GPU_CORE`; `zen acquire --pid N` collects one, see README 'Models on GPUs')"
            )
        return f"data on device {meta.device}, not in this image"

    def iter_bytes(self, meta: TensorMeta, block: int = BLOCK) -> Iterator[bytes | memoryview]:
        """The tensor's data in C order, in blocks of at most `block` bytes (contiguous case)."""
        if not self.has_data(meta):
            raise TensorDataMissing(meta.addr, self.missing_device_note(meta))
        if meta.numel == 0:
            return
        start = meta.data_ptr + meta.storage_offset * meta.itemsize
        if meta.contiguous:
            total = meta.nbytes
            pos = 0
            while pos < total:
                n = min(block, total - pos)
                yield self._read(meta, start + pos, n)
                self._release(meta, start + pos, n)
                pos += n
            return
        # Strided: gather from the storage span the view touches (bounded by the storage size).
        if meta.itemsize not in _RAW:
            raise ObjectError(meta.addr, f"strided tensors of {meta.itemsize}-byte elements are not supported")
        lo, hi = meta.extent()
        base = meta.data_ptr + lo * meta.itemsize
        span = np.frombuffer(self._read(meta, base, (hi - lo) * meta.itemsize), dtype=_RAW[meta.itemsize])
        view = np.lib.stride_tricks.as_strided(
            span[meta.storage_offset - lo :], shape=meta.shape, strides=[s * meta.itemsize for s in meta.stride], writeable=False
        )
        data = np.ascontiguousarray(view).tobytes()
        for pos in range(0, len(data), block):
            yield data[pos : pos + block]

    def file_span(self, meta: TensorMeta) -> tuple[int, int] | None:
        """(file descriptor, offset) of a file holding the tensor's bytes in C order (a contiguous
        tensor inside one mapped segment of the image), for reading it ahead; else None."""
        space = self.space_of(meta)
        if space is None or not meta.contiguous or not meta.numel:
            return None
        return space.file_span(meta.data_ptr + meta.storage_offset * meta.itemsize, meta.nbytes)

    def _release(self, meta: TensorMeta, addr: int, n: int) -> None:
        c = self.space_of(meta).chunk_of(addr)
        if c is not None and n >= 1 << 20:
            c.release(addr - c.start, min(n, c.end - addr))

    def _read(self, meta: TensorMeta, addr: int, n: int) -> bytes | memoryview:
        space = self.space_of(meta)
        try:
            return space.view(addr, n)
        except MemoryReadError as exc:
            raise TensorDataMissing(meta.addr, self.missing_range_note(meta, addr, n, exc.reason)) from None

    def missing_range_note(self, meta: TensorMeta, addr: int, n: int, reason: str = "") -> str:
        """Why [addr, addr+n) of the tensor's data is not readable; for device memory, which
        segments of the GPU image lie nearest."""
        space = self.space_of(meta)
        near = getattr(space, "near", None)
        if meta.on_cpu or near is None:
            return f"tensor data not in the image ({reason})" if reason else "tensor data pages are not in the image"
        return f"device range {addr:#x}-{addr + n:#x} ({n:,} bytes on {meta.device}) is not in the GPU image; {near(addr, n)}"

    def sha256(self, meta: TensorMeta) -> str:
        h = hashlib.sha256()
        for chunk in self.iter_bytes(meta):
            h.update(chunk)
        return h.hexdigest()
