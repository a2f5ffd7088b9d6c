"""Reading safetensors files with numpy alone, lazily, tensor by tensor.

Why not the safetensors library: it is an optional dependency (the `reuse` extra), its numpy loader
has no bfloat16 or float8, and it loads a whole file; drift compares GB-sized models snapshot by
snapshot, so each tensor is memory-mapped and converted to float64 a chunk at a time. The header
comes from a case directory, which is untrusted: its size, every dtype, shape and byte range are
checked against the file before anything is mapped.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zen.runtime.errors import ZenError

MAX_HEADER = 100 << 20
CHUNK = 1 << 20  # elements converted to float64 at once: about 60 MB of working arrays per comparison

# safetensors dtype -> numpy dtype of the stored bytes (bfloat16 and float8 as unsigned ints, decoded below)
STORAGE = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "F8_E4M3": "u1", "F8_E5M2": "u1",
           "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
           "BOOL": "?"}  # fmt: skip


def _float8_table(exp_bits: int, man_bits: int, finite_only: bool) -> np.ndarray:
    """float64 value of every byte of a float8 format (OCP: E4M3 'fn' has no inf, one NaN per sign; E5M2 is IEEE-like)."""
    bias = (1 << (exp_bits - 1)) - 1
    out = np.empty(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> man_bits) & ((1 << exp_bits) - 1)
        m = b & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if finite_only and e == top and m == (1 << man_bits) - 1:
            out[b] = np.nan
        elif not finite_only and e == top:
            out[b] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            out[b] = sign * (m / (1 << man_bits)) * 2.0 ** (1 - bias)
        else:
            out[b] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return out


_F8 = {"F8_E4M3": _float8_table(4, 3, True), "F8_E5M2": _float8_table(5, 2, False)}


@dataclass(frozen=True)
class TensorInfo:
    dtype: str  # safetensors code
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class TensorFile:
    """The tensors of one safetensors file; `raw(key)` maps the stored bytes, `chunks(key)` yields float64."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as fh:
                head = fh.read(8)
                (n,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
                if n is None or n > min(MAX_HEADER, size - 8):
                    raise ZenError(f"{self.path} is not a safetensors file (bad header length)", "recover the case again")
                header = json.loads(fh.read(n))
        except OSError as exc:
            raise ZenError(f"{self.path} cannot be read: {exc.strerror}") from None
        except (ValueError, UnicodeDecodeError):
            raise ZenError(f"{self.path} is not a safetensors file (its header is not JSON)", "recover the case again") from None
        if type(header) is not dict:
            raise ZenError(f"{self.path} is not a safetensors file (header is not an object)")
        self.metadata = header.pop("__metadata__", None)
        base = 8 + n
        self.tensors: dict[str, TensorInfo] = {}
        for key, e in header.items():
            self.tensors[key] = self._entry(key, e, base, size)

    def _entry(self, key: str, e: object, base: int, size: int) -> TensorInfo:
        bad = ZenError(f"{self.path}: tensor {key!r} has a malformed entry", "recover the case again")
        if type(e) is not dict or e.get("dtype") not in STORAGE:
            raise bad
        shape, offs = e.get("shape"), e.get("data_offsets")
        if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape) or len(shape) > 64:
            raise bad
        if type(offs) is not list or len(offs) != 2 or not all(type(o) is int for o in offs):
            raise bad
        info = TensorInfo(e["dtype"], tuple(shape), base + offs[0], offs[1] - offs[0])
        itemsize = np.dtype(STORAGE[info.dtype]).itemsize
        if not 0 <= offs[0] <= offs[1] or base + offs[1] > size or info.nbytes != info.numel * itemsize:
            raise bad
        return info

    def raw(self, key: str) -> np.ndarray:
        """The stored elements, flat, as their storage dtype (bit patterns for bfloat16/float8)."""
        info = self.tensors[key]
        dt = np.dtype(STORAGE[info.dtype])
        if info.numel == 0:
            return np.empty(0, dtype=dt)
        return np.memmap(self.path, dtype=dt, mode="r", offset=info.start, shape=(info.numel,))

    def chunks(self, key: str, count: int = CHUNK):
        """The stored elements in blocks of at most `count`, each read with `pread` into its own buffer: at most one
        block per file is resident at a time (a mapped multi-GB tensor would count every page it touched in the
        process's memory: two snapshots of a 10^9-element claim took 15.8 GB this way, issue 49.4)."""
        info = self.tensors[key]
        dt = np.dtype(STORAGE[info.dtype])
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i in range(0, info.numel, count):
                n = min(count, info.numel - i) * dt.itemsize
                data = os.pread(fd, n, info.start + i * dt.itemsize)
                if len(data) != n:
                    raise ZenError(f"{self.path}: tensor {key!r} ends early (the file changed while it was read)")
                yield np.frombuffer(data, dtype=dt)
        finally:
            os.close(fd)

    def bits(self, key: str) -> np.ndarray:
        """The stored elements as unsigned integers of their width: equal bits, equal values (NaN included)."""
        raw = self.raw(key)
        return raw.view(np.dtype(f"<u{raw.dtype.itemsize}"))


def to_float64(dtype: str, raw: np.ndarray) -> np.ndarray:
    """Values of stored elements as float64 (bfloat16 widened by its bits, float8 by table)."""
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype in _F8:
        return _F8[dtype][raw]
    return raw.astype(np.float64)
