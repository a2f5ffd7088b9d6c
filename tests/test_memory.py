"""Address spaces and bulk scans: provenance of bytes, disk fill checks, numpy scans."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from conftest import zen

from zen.memory import ElfCoreSpace
from zen.memory.regions import Region, Source
from zen.memory.scan import find_u64, find_u64_in, gather_u64
from zen.memory.space import AddressSpace, BytesChunk
from zen.runtime.errors import MemoryReadError


@pytest.fixture(scope="module")
def lean_image(light_target, workdir):
    img = workdir / "mem-lean.core"
    zen("acquire", "--pid", light_target.pid, "-o", img, "--lean")
    yield img
    img.unlink(missing_ok=True)


def test_lean_image_without_disk_fill_reports_missing(lean_image):
    with ElfCoreSpace(lean_image, fill_from_disk=False) as space:
        missing = [r for r in space.regions if r.source is Source.MISSING and r.file_backed]
        assert missing
        r = missing[0]
        with pytest.raises(MemoryReadError, match="mapped .* but not captured"):
            space.read(r.start + r.size - 8, 8)


def test_disk_fill_refuses_a_different_file(lean_image, tmp_path):
    """A file on disk that differs from the image's copy of its first page is not used."""
    with ElfCoreSpace(lean_image) as space:
        lib = next(r.path for r in space.regions if r.source is Source.DISK and "libpython" in r.path)
    root = tmp_path / "sysroot"
    with ElfCoreSpace(lean_image) as space:
        for path in {f.path for f in space.info.files}:
            if os.path.isfile(path):
                dest = root / path.lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, dest)
    tampered = root / lib.lstrip("/")
    data = bytearray(tampered.read_bytes())
    data[100] ^= 0xFF  # inside the ELF header page the image kept
    tampered.write_bytes(bytes(data))
    with ElfCoreSpace(lean_image, file_root=str(root)) as space:
        assert any("differs from the image" in p and lib in p for p in space.problems)
        assert all(r.source is not Source.DISK for r in space.regions if r.path == lib)
        assert any(r.source is Source.DISK for r in space.regions if r.path != lib)


def synthetic() -> tuple[AddressSpace, np.ndarray, int]:
    rng = np.random.default_rng(5)
    words = rng.integers(0, 2**63, size=4096, dtype=np.uint64)
    words[[3, 100, 4000]] = 0xDEADBEEF
    base = 0x7000_0000
    a = BytesChunk(base, words[:2048].tobytes())
    b = BytesChunk(base + 2048 * 8 + 4096, words[2048:].tobytes())  # a gap between the chunks
    regions = [Region(base, base + 2048 * 8, "rw-p"), Region(b.start, b.end, "rw-p")]
    return AddressSpace(regions, [a, b]), words, base


def test_scans_match_naive():
    space, words, base = synthetic()
    addrs = [base + 8 * i if i < 2048 else base + 2048 * 8 + 4096 + 8 * (i - 2048) for i in range(len(words))]
    want = [a for a, w in zip(addrs, words) if w == 0xDEADBEEF]
    assert find_u64(space, 0xDEADBEEF).tolist() == want
    vals = [int(words[7]), int(words[3000]), 0xDEADBEEF]
    got_addrs, got_vals = find_u64_in(space, vals)
    assert sorted(got_addrs.tolist()) == sorted(a for a, w in zip(addrs, words) if int(w) in vals)
    sample = np.array(addrs[::97] + [base - 8, base + 2048 * 8], dtype=np.uint64)
    got, ok = gather_u64(space, sample)
    assert ok.tolist() == [True] * len(addrs[::97]) + [False, False]
    assert got[ok].tolist() == [int(w) for w in words[::97]]


def test_reads_and_gaps():
    space, words, base = synthetic()
    assert space.u64(base + 16) == int(words[2])
    with pytest.raises(MemoryReadError, match="not mapped"):
        space.read(base + 2048 * 8, 8)
    with pytest.raises(MemoryReadError):
        space.read(base + 2048 * 8 - 4, 8)  # runs off the end of the first chunk into the gap
    assert space.is_readable(base, 2048 * 8) and not space.is_readable(base, 2048 * 8 + 1)


def test_prefetch_advises_windows_of_the_image_only(tmp_path, monkeypatch):
    """`prefetch` asks for one window per distinct 64 KB of the image's mmap holding an address, skips addresses
    outside the image, asks nothing of buffers that are not mmaps, and stops at MAX_WINDOWS (a hostile table of
    millions of pointers cannot make zen issue millions of requests)."""
    import mmap

    from zen.memory import prefetch as pf
    from zen.memory.space import MmapChunk

    base, size = 0x7F0000000000, 64 << 20
    path = tmp_path / "img"
    with open(path, "wb") as fh:
        fh.truncate(size)
    fh = open(path, "rb")  # noqa: SIM115 (closed below, after the mmap)
    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    asked = []
    monkeypatch.setattr(pf, "_advise", lambda buf, start, length: asked.append((buf, start, length)))
    try:
        space = AddressSpace([Region(base, base + size, "rw-p", "")], [MmapChunk(base, base + size, mm, 0, Source.IMAGE)])
        addrs = [base + 5, base + 100, base + (64 << 10) + 8, base + size - 8, base + size, base - 8, 1 << 70, -1]
        assert pf.prefetch(space, addrs) == 3
        assert asked == [(mm, 0, 64 << 10), (mm, 64 << 10, 64 << 10), (mm, size - (64 << 10), 64 << 10)]
        asked.clear()
        monkeypatch.setattr(pf, "MAX_WINDOWS", 10)
        assert pf.prefetch(space, range(base, base + size, 4096)) == 10 and len(asked) == 10
        plain = AddressSpace([Region(base, base + 4096, "rw-p", "")], [BytesChunk(base, bytes(4096))])
        assert pf.prefetch(plain, [base]) == 0
        monkeypatch.undo()
        assert pf.prefetch(space, [base + 4096]) == 1  # the real advice, on a real mmap
    finally:
        mm.close()
        fh.close()
