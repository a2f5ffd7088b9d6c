"""A bounded little-endian reader over untrusted bytes.

TVM's serialisation (dmlc-style streams: u64 length prefixes, POD arrays) trusts its input; a
corrupt count there makes the runtime allocate gigabytes. Every count and length read here is
checked against the bytes that remain before anything is allocated, so a bad file fails fast
with the offset and the field that was wrong.
"""

from __future__ import annotations

import struct

import numpy as np

from zen.compiled.errors import ExecutableError


class Reader:
    """Sequential reads over `data[pos:end]`; `what` names the container in error messages."""

    def __init__(self, data: bytes | memoryview, pos: int = 0, end: int | None = None, what: str = "data") -> None:
        self.data = memoryview(data)
        self.pos = pos
        self.end = len(self.data) if end is None else end
        self.what = what
        if not 0 <= pos <= self.end <= len(self.data):
            raise ExecutableError(f"{what}: range {pos}..{end} lies outside the {len(self.data)} bytes available")

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def fail(self, field: str, reason: str) -> ExecutableError:
        return ExecutableError(
            f"{self.what}: {field} at offset {self.pos}: {reason}",
            "the file is truncated or corrupt, or was written by an unsupported TVM version",
        )

    def take(self, n: int, field: str) -> memoryview:
        if n < 0 or n > self.remaining:
            raise self.fail(field, f"needs {n} bytes, {self.remaining} left")
        view = self.data[self.pos : self.pos + n]
        self.pos += n
        return view

    def _unpack(self, fmt: str, field: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size, field))[0]

    def u8(self, field: str) -> int:
        return self._unpack("<B", field)

    def u16(self, field: str) -> int:
        return self._unpack("<H", field)

    def i32(self, field: str) -> int:
        return self._unpack("<i", field)

    def u64(self, field: str) -> int:
        return self._unpack("<Q", field)

    def i64(self, field: str) -> int:
        return self._unpack("<q", field)

    def f64(self, field: str) -> float:
        return self._unpack("<d", field)

    def count(self, field: str, item_size: int) -> int:
        """A u64 element count, bounded by what the remaining bytes can hold."""
        n = self.u64(field)
        if n * max(item_size, 1) > self.remaining:
            raise self.fail(field, f"count {n} of {item_size}-byte items exceeds the {self.remaining} bytes left")
        return n

    def string(self, field: str, limit: int = 1 << 20) -> str:
        n = self.count(field, 1)
        if n > limit:
            raise self.fail(field, f"string of {n} bytes is implausibly long")
        return bytes(self.take(n, field)).decode("utf-8", errors="replace")

    def blob(self, field: str) -> memoryview:
        return self.take(self.count(field, 1), field)

    def array(self, dtype: str, n: int, field: str) -> np.ndarray:
        """`n` items read in one go (no per-element loop), as a read-only numpy view."""
        item = np.dtype(dtype).itemsize
        if n < 0 or n * item > self.remaining:
            raise self.fail(field, f"{n} items of {item} bytes exceed the {self.remaining} bytes left")
        return np.frombuffer(self.take(n * item, field), dtype=np.dtype(dtype).newbyteorder("<"))

    def vec(self, dtype: str, field: str) -> np.ndarray:
        """A u64-count-prefixed array of POD items."""
        item = np.dtype(dtype).itemsize
        return self.array(dtype, self.count(field, item), field)

    def strings(self, field: str) -> list[str]:
        return [self.string(f"{field}[{i}]") for i in range(self.count(field, 8))]
