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
