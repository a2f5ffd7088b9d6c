"""TF tensors and variables in an image, by the measured layout (profile.py) and the shared decoder (layout.py).

EagerTensor object -> TensorHandle -> tensorflow::Tensor -> TensorBuffer -> data (3 loads);
ResourceVariable `_handle` (a resource EagerTensor) -> ResourceHandle -> Var -> Tensor -> TensorBuffer -> data
(6 loads); a Keras 3 Variable holds its ResourceVariable in `_value`. The C++ side is the authority for dtype, shape
and bytes: the Python-side claims (`_dtype`, `_shape`) are checked against it, and a disagreement is reported, never
papered over. TF tensors are dense and row-major, so data is one contiguous run of `numel * itemsize` bytes.
A variable whose ResourceHandle names a device other than the CPU has its bytes in device memory: it is marked
`on-device`, never read as zeros.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from zen.cpython.interp import Interpreter
from zen.cpython.readers.instances import read_instance
from zen.frontends.keras.layout import DecodedTensor, LayoutError, decode_tensor, read_std_string
from zen.frontends.keras.profile import TFProfile
from zen.runtime.errors import MemoryReadError, ObjectError, ZenError

BLOCK = 16 << 20


class TFDataMissing(ObjectError):
    """The tensor's metadata was read but its data is not in the image."""


@dataclass
class TFTensorMeta:
    """What `zen.recover.run` needs to stream a tensor (the same duck type as the torch front end's TensorMeta)."""

    addr: int  # the Python object read (EagerTensor, ResourceVariable or Keras Variable)
    dtype: str
    itemsize: int
    safetensors: str | None
    shape: tuple[int, ...]
    numel: int
    device: str
    buffer: int  # TensorBuffer*
    data_ptr: int
    python_type: str = ""
    storage_offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def stride(self) -> tuple[int, ...]:
        out, step = [], 1
        for d in reversed(self.shape):
            out.append(step)
            step *= d
        return tuple(reversed(out))

    def extent(self) -> tuple[int, int]:
        return 0, self.numel


def device_kind(name: str) -> str:
    """ "cpu" for TF's host devices ("/job:localhost/replica:0/task:0/device:CPU:0"), else the device part ("GPU:0")."""
    tail = name.rsplit("/", 1)[-1]
    tail = tail.split("device:", 1)[-1]
    return "cpu" if tail.upper().startswith("CPU") or not tail else tail


class TFTensorReader:
    """Reads TF tensor metadata and data from an interpreter's image."""

    def __init__(self, ip: Interpreter, prof: TFProfile) -> None:
        self.ip, self.tp, self.L = ip, prof, prof.layout
        self._handle = prof.off("eagertensor", "handle")
        self._in_handle = prof.off("tensorhandle", "tensor")
        self._resource = prof.off("resourcehandle", "resource")
        self._device = prof.off("resourcehandle", "device")
        self._var_tensor = prof.off("var", "tensor")
        self._str = (prof.off("stdstring", "data"), prof.off("stdstring", "size"))

    def _read(self, addr: int, n: int) -> bytes:
        return self.ip.space.read(addr, n)

    def _decode(self, owner: int, at: int, what: str) -> DecodedTensor:
        try:
            return decode_tensor(self.L, at, self._read)
        except MemoryReadError as exc:
            raise ObjectError(owner, f"{what} at {at:#x} not in the image ({exc.reason})") from None
        except LayoutError as exc:
            raise ObjectError(owner, f"{what} at {at:#x} does not decode: {exc}") from None

    def _meta(self, owner: int, t: DecodedTensor, device: str) -> TFTensorMeta:
        dt = self.tp.dtypes.get(t.dtype)
        if dt is None:
            raise ObjectError(owner, f"unknown TF dtype enum {t.dtype}")
        meta = TFTensorMeta(owner, dt.name, dt.itemsize, dt.safetensors, t.shape, t.num_elements, device, t.buffer, t.data)
        try:
            meta.python_type = self.ip.type_name(owner)
        except ObjectError:
            pass
        return meta

    def eager(self, addr: int) -> TFTensorMeta:
        """An EagerTensor object (CPU tensors: TF eager keeps host tensors in host memory)."""
        handle = self.ip.ptr(addr + self._handle)
        if not handle:
            raise ObjectError(addr, "EagerTensor without a TensorHandle")
        return self._meta(addr, self._decode(addr, handle + self._in_handle, "TensorHandle's tensor"), "cpu")

    def resource_variable(self, addr: int) -> TFTensorMeta:
        """A ResourceVariable object: its handle tensor's ResourceHandle leads to the Var holding the value."""
        ip = self.ip
        handle = read_instance(ip, addr).attrs.get("_handle")
        if handle is None:
            raise ObjectError(addr, "ResourceVariable without _handle")
        h = self._decode(addr, ip.ptr(handle + self._handle) + self._in_handle, "variable handle tensor")
        if h.dtype != self.tp.constants["DT_RESOURCE"] or h.shape != () or not h.data:
            raise ObjectError(addr, f"variable handle is not a resource scalar (dtype {h.dtype}, shape {h.shape})")
        try:
            device = device_kind(read_std_string(h.data + self._device, self._read, *self._str))
        except (MemoryReadError, LayoutError) as exc:
            raise ObjectError(addr, f"ResourceHandle at {h.data:#x} unreadable: {exc}") from None
        var = ip.ptr(h.data + self._resource)
        if not var:
            raise ObjectError(addr, "ResourceHandle without a resource (variable destroyed or uninitialised)")
        return self._meta(addr, self._decode(addr, var + self._var_tensor, "Var's tensor"), device)

    def keras_variable(self, addr: int) -> TFTensorMeta:
        """A Keras 3 Variable on the TF backend: its `_value` is the ResourceVariable."""
        value = read_instance(self.ip, addr).attrs.get("_value")
        if value is None or self.ip.is_none(value):
            raise ObjectError(addr, "Keras Variable without a value (never built, or not the TensorFlow backend)")
        meta = self.resource_variable(value)
        meta.addr = addr
        meta.python_type = self.ip.type_name(addr)
        return meta

    def iter_bytes(self, meta: TFTensorMeta, block: int = BLOCK) -> Iterator[bytes | memoryview]:
        """The tensor's data (row-major, contiguous) in blocks of at most `block` bytes."""
        if not meta.on_cpu:
            raise TFDataMissing(meta.addr, f"data is on device {meta.device}, not in this image")
        total, pos = meta.nbytes, 0
        while pos < total:
            n = min(block, total - pos)
            try:
                yield self.ip.space.view(meta.data_ptr + pos, n)
            except MemoryReadError as exc:
                raise TFDataMissing(meta.addr, f"tensor data not in the image ({exc.reason})") from None
            pos += n

    def file_span(self, meta: TFTensorMeta) -> tuple[int, int] | None:
        """(file descriptor, offset) of a file holding the tensor's bytes (one mapped segment of
        the image), for reading it ahead; else None."""
        if not meta.on_cpu or not meta.nbytes:
            return None
        return self.ip.space.file_span(meta.data_ptr, meta.nbytes)

    def space_of(self, meta: TFTensorMeta):
        """The address space holding the tensor's bytes (the recovery jobs ask every reader): the image. TF tensors
        on a GPU are not read (their data is marked missing before this is asked)."""
        return self.ip.space

    @staticmethod
    def missing_range_note(meta: TFTensorMeta, addr: int, n: int, reason: str = "") -> str:
        return f"tensor data not in the image ({reason})" if reason else "tensor data pages are not in the image"

    def sha256(self, meta: TFTensorMeta) -> str:
        h = hashlib.sha256()
        for chunk in self.iter_bytes(meta):
            h.update(chunk)
        return h.hexdigest()


def readable(reader: TFTensorReader, meta: TFTensorMeta) -> bool:
    """Whether every byte of the tensor's data is in the image."""
    try:
        return not meta.numel or reader.ip.space.is_readable(meta.data_ptr, meta.nbytes)
    except ZenError:
        return False
