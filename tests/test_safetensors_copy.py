"""The weights file is the same whether a tensor's bytes are written by zen or copied by the kernel.

`SafetensorsWriter.write(..., source=(fd, offset))` copies a tensor that lies in one mapped
segment of the image with `os.copy_file_range` and only hashes the views (issue 16). Here a file
plays the image: the output must equal the plain write's byte for byte, with the same digests,
also when the copy is refused at once or part way (another file system, an old kernel).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import safetensors.numpy

from zen.represent import safetensors_io as st
from zen.represent.safetensors_io import Entry, SafetensorsWriter

SIZES = [3 << 20, 17, 1 << 20, 5 << 20, 4096]  # above and below the overlap threshold


def _source(tmp_path: Path) -> tuple[Path, bytes, list[int]]:
    data = os.urandom(sum(SIZES) + 12345)
    path = tmp_path / "image.bin"
    path.write_bytes(data)
    offsets, pos = [], 12345  # not page-aligned: the copy must not care
    for n in SIZES:
        offsets.append(pos)
        pos += n
    return path, data, offsets


def _write(out: Path, data: bytes, offsets: list[int], fd: int | None) -> tuple[str, dict[str, str]]:
    entries = [Entry(f"t{i}", "U8", (n,), n) for i, n in enumerate(SIZES)]
    w = SafetensorsWriter(out, entries, {"format": "pt"})
    view = memoryview(data)
    for i, (n, off) in enumerate(zip(SIZES, offsets)):
        chunks = [view[off + p : off + min(p + (2 << 20), n)] for p in range(0, n, 2 << 20)]
        w.write(f"t{i}", chunks, source=(fd, off) if fd is not None else None)
    w.close()
    return w.file_sha256, dict(w.sha256)


@pytest.mark.parametrize("how", ["copy", "refused", "part-way"])
def test_copied_tensors_equal_written_ones(tmp_path, monkeypatch, how):
    path, data, offsets = _source(tmp_path)
    plain = tmp_path / "plain.safetensors"
    ref = _write(plain, data, offsets, None)
    real = os.copy_file_range
    calls = []

    def flaky(src, dst, count, offset_src=None):
        calls.append(count)
        if how == "refused":
            raise OSError(18, "Invalid cross-device link")
        if how == "part-way" and len(calls) % 2 == 0:
            raise OSError(22, "Invalid argument")
        return real(src, dst, min(count, 1 << 20), offset_src)  # short copies: the writer loops

    monkeypatch.setattr(st, "_COPY", flaky)
    fd = os.open(path, os.O_RDONLY)
    try:
        copied = tmp_path / "copied.safetensors"
        got = _write(copied, data, offsets, fd)
    finally:
        os.close(fd)
    assert copied.read_bytes() == plain.read_bytes()
    assert got == ref and got[0] == hashlib.sha256(plain.read_bytes()).hexdigest()
    loaded = safetensors.numpy.load_file(str(copied))
    assert [loaded[f"t{i}"].tobytes() for i in range(len(SIZES))] == [data[o : o + n] for o, n in zip(offsets, SIZES)]
    assert calls  # the copy was tried
