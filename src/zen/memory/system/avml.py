"""AVML v2 images (snappy-compressed ranges): every frame walked and bounded before anything reads the file.

`read_avml` returns the physical ranges and the frame table through which zen reads physical bytes (one
decompression per 64 KiB frame, cached); formats.py wraps them in a `PhysicalImage`.
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from bisect import bisect_right
from collections import OrderedDict
from pathlib import Path

from zen.memory.system.physical import _LIME_HEADER, MAX_PHYS_ADDR, MAX_SEGMENTS, PAGE, PhysicalImage, PhysSegment
from zen.runtime.errors import ImageError

AVML_MAGIC = 0x4C4D5641
# Snappy framing format: a data chunk holds at most 64 KiB; AVML's 8-byte trailer follows a stream.
SNAPPY_MAX_CHUNK = 1 << 16
SNAPPY_STREAM_ID = b"sNaPpY"
_AVML_TRAILER = struct.Struct("<Q")
_AVML_CUT_HINT = (
    "Volatility 3 cannot read an AVML file cut short; re-acquire, or convert what is complete with "
    "`avml convert IMAGE OUT.lime` (zen reads a cut-short LiME file and reports what is missing)"
)


def read_avml(path: Path, size: int) -> PhysicalImage:
    """AVML v2, as microsoft/avml writes it (`src/image.rs`, `src/io/snappy.rs`): for each range a
    32-byte header (magic "AVML", version 2, first and *last* physical address, 8 zero bytes), the
    range's bytes as one snappy framed stream (`snap::write::FrameEncoder`: the stream identifier,
    then chunks of at most 64 KiB), and the stream's length as a little-endian u64. Ranges are at
    most 16 MiB (larger ones are split) and all-zero ones are left out.

    Every chunk is walked here, bounded by the file, and each range's length summed from its chunks
    without decompressing. This is what makes the file safe to hand to Volatility 3 (2.28): its AVML
    layer reads `end - start` bytes after a header and walks chunks until the range is complete,
    spinning forever when they end first (a file cut short, a corrupt chunk length, or a range of
    incompressible data whose stream is longer than the range), and it never checks the trailer.
    Such files are refused here with a sentence naming the range; a cut-short file cannot be
    salvaged by dropping its last range, because Volatility walks the file to its end regardless.
    """
    segs: list[PhysSegment] = []
    problems: list[str] = []
    frames = AvmlFrames(path)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        off, last_end = 0, -1
        while off < size:
            if len(segs) >= MAX_SEGMENTS:
                raise ImageError(f"{path}: more than {MAX_SEGMENTS} AVML ranges: corrupt or hostile file")
            if off + _LIME_HEADER.size > size:
                raise ImageError(
                    f"{path}: truncated, or data appended: the {size - off} bytes after the last complete AVML range "
                    f"(file offset {off:#x}) are too few for a range header",
                    _AVML_CUT_HINT,
                )
            magic, version, start, last, padding = _LIME_HEADER.unpack_from(mm, off)
            if magic != AVML_MAGIC or version != 2:
                raise ImageError(
                    f"{path}: no AVML version 2 range header at file offset {off:#x} (magic {magic:#010x}, version {version})",
                    "the file is corrupt, truncated or has data appended (zen reads AVML version 2)",
                )
            if last < start or start <= last_end or last >= MAX_PHYS_ADDR:
                raise ImageError(
                    f"{path}: AVML range {start:#x}-{last:#x} at file offset {off:#x} is out of order or impossible",
                    "the file is corrupt; re-acquire or check its hash",
                )
            if padding:
                problems.append(f"AVML range {start:#x}-{last:#x}: header padding is {padding:#x}, not zero")
            where = f"{path}: AVML range {start:#x}-{last:#x} at file offset {off:#x}"
            off = _avml_stream(mm, off + _LIME_HEADER.size, size, start, last - start + 1, frames, where)
            segs.append(PhysSegment(start, last - start + 1, None))
            last_end = last
    if not segs:
        raise ImageError(f"{path}: no AVML ranges")
    _snappy()  # zen reads the ranges through it: say now if it is missing
    return PhysicalImage(path, "avml", size, segs, problems, detail="snappy-compressed", avml=frames)


def _avml_stream(mm, stream: int, size: int, start: int, length: int, frames: AvmlFrames, where: str) -> int:
    """Walk one range's snappy framed stream from file offset `stream`; return the offset after its
    trailer. Chunks: 0xFF stream identifier, 0x00 snappy block (4-byte CRC, then the block, whose
    leading varint is its uncompressed length), 0x01 stored bytes (4-byte CRC, then the bytes),
    0x80-0xFE skippable, 0x02-0x7F unskippable. The walk stops, as Volatility's does, with the
    chunk that completes the range; then the stream length must fit Volatility's read of
    `length - 1` bytes and equal the trailer. Chunks must carry a page on average, so the number
    of iterations is bounded by the range's pages, not only by the file size.
    """

    def bad(what: str, hint: str = "the file is corrupt; re-acquire or check its hash") -> ImageError:
        return ImageError(f"{where}: {what}", hint)

    def truncated(inside: str) -> ImageError:
        return bad(f"truncated: the file ends at {size:#x}, inside {inside}", _AVML_CUT_HINT)

    pos, total, count = stream, 0, 0
    while total < length:
        kind, n = (mm[pos], int.from_bytes(mm[pos + 1 : pos + 4], "little")) if pos + 4 <= size else (None, 0)
        body = pos + 4
        if kind is None or body + n > size:
            raise truncated(f"the chunk of its compressed stream at file offset {pos:#x}")
        if count == 0 and kind != 0xFF:
            raise bad(f"corrupt: its compressed stream does not start with the snappy stream identifier (chunk type {kind:#x})")
        if kind == 0xFF:
            if mm[body : body + n] != SNAPPY_STREAM_ID:
                raise bad(f"corrupt: bad snappy stream identifier at file offset {pos:#x}")
        elif kind <= 0x01:
            got = n - 4 if kind == 0x01 else _varint(mm, body + 4, body + n) if n > 4 else None
            if got is None or not 0 < got <= SNAPPY_MAX_CHUNK:
                what = "has no readable length" if got is None else f"claims {got:,} bytes (1 to 65,536 allowed)"
                raise bad(f"corrupt: the snappy chunk at file offset {pos:#x} {what}")
            frames.add(start + total, got, body + 4, n - 4, kind == 0x00)
            total += got
        elif kind < 0x80:
            raise bad(f"corrupt: unskippable snappy chunk of type {kind:#x} at file offset {pos:#x}")
        count += 1
        if count > 16 + total // PAGE:
            raise bad(f"corrupt or hostile: {count} snappy chunks for {total:,} bytes (chunks hold at most 64 KiB)")
        pos = body + n
    if total != length:
        raise bad(f"corrupt: its snappy chunks hold {total:,} bytes but the header says {length:,}")
    if pos - stream >= length:
        raise bad(
            f"its compressed stream ({pos - stream:,} bytes) is not shorter than the range (incompressible data); "
            "Volatility 3's AVML reader loops forever on such a range",
            "convert the image to LiME with `avml convert IMAGE OUT.lime` (or avml-convert) and analyse that",
        )
    if pos + _AVML_TRAILER.size > size:
        raise truncated(f"its trailer at file offset {pos:#x}")
    (trailer,) = _AVML_TRAILER.unpack_from(mm, pos)
    if trailer != pos - stream:
        raise bad(f"corrupt: its trailer gives a stream of {trailer:,} bytes, its chunks span {pos - stream:,}")
    return pos + _AVML_TRAILER.size


def _varint(mm, pos: int, end: int) -> int | None:
    """Snappy's little-endian base-128 length preamble (at most 5 bytes), or None if malformed."""
    value = 0
    for i in range(5):
        if pos + i >= end:
            return None
        byte = mm[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value
    return None


class AvmlFrames:
    """The data chunks of a compressed AVML image by physical address, and reads through them.

    Volatility's AVML layer decompresses a whole 64 KiB chunk for every read, however small, and
    keeps nothing; a recovery's many small reads of a process's heap then spend most of their time
    in snappy. zen reads physical bytes here instead, from the chunk table `_avml` built while
    checking the file: one decompression per chunk, the last CACHE_CHUNKS kept (at most 128 MiB).
    The table costs 25 bytes per 64 KiB of RAM.
    """

    CACHE_CHUNKS = 2048

    def __init__(self, path: Path) -> None:
        self.path = path
        self.phys = array("Q")  # physical address of each chunk's first byte (ascending)
        self.size = array("L")  # its uncompressed bytes
        self.offset = array("Q")  # file offset of its payload (after the CRC)
        self.stored = array("L")  # payload bytes in the file
        self.packed = bytearray()  # 1: a snappy block, 0: stored bytes
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._fd: int | None = None

    def add(self, phys: int, size: int, offset: int, stored: int, packed: bool) -> None:
        self.phys.append(phys)
        self.size.append(size)
        self.offset.append(offset)
        self.stored.append(stored)
        self.packed.append(packed)

    def read(self, phys: int, size: int) -> bytes:
        """Bytes [phys, phys+size) of physical memory; the caller checked that the image holds them."""
        i = bisect_right(self.phys, phys) - 1
        parts = []
        while size > 0:
            if i < 0 or i >= len(self.phys) or not self.phys[i] <= phys < self.phys[i] + self.size[i]:
                raise ImageError(f"{self.path}: physical address {phys:#x} is not in the AVML image")
            data = self._chunk(i)
            lo = phys - self.phys[i]
            piece = data[lo : lo + size]
            parts.append(piece)
            phys += len(piece)
            size -= len(piece)
            i += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _chunk(self, i: int) -> bytes:
        data = self._cache.get(i)
        if data is not None:
            self._cache.move_to_end(i)
            return data
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        raw = os.pread(self._fd, self.stored[i], self.offset[i])
        data = _snappy_uncompress(raw, self.size[i]) if self.packed[i] else raw
        if data is None or len(data) != self.size[i]:
            raise ImageError(
                f"{self.path}: the AVML chunk at file offset {self.offset[i] - 8:#x} (physical {self.phys[i]:#x}) "
                "does not decompress: the file is corrupt"
            )
        self._cache[i] = data
        if len(self._cache) > self.CACHE_CHUNKS:
            self._cache.popitem(last=False)
        return data

    def close(self) -> None:
        self._cache.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_SNAPPY = None


def _snappy():
    """`snappy_uncompress` of the C library Volatility's AVML layer loads too (libsnappy)."""
    global _SNAPPY
    if _SNAPPY is None:
        import ctypes
        import ctypes.util

        for name in filter(None, ("libsnappy.so.1", "libsnappy.1.dylib", ctypes.util.find_library("snappy"))):
            try:
                fn = ctypes.CDLL(name).snappy_uncompress
                break
            except (OSError, AttributeError):
                continue
        else:
            raise ImageError(
                "compressed AVML images need the snappy C library, which is not installed",
                "install it (Debian/Ubuntu: apt-get install libsnappy1v5; Fedora: dnf install snappy)",
            )
        fn.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t))
        fn.restype = ctypes.c_int
        _SNAPPY = fn
    return _SNAPPY


def _snappy_uncompress(data: bytes, size: int) -> bytes | None:
    """One snappy block of `size` uncompressed bytes, or None if it does not decompress to that."""
    import ctypes

    out = ctypes.create_string_buffer(size)
    got = ctypes.c_size_t(size)
    if _snappy()(data, len(data), out, ctypes.byref(got)) != 0 or got.value != size:
        return None
    return out.raw
