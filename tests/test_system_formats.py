"""Container formats of whole-machine images: detection, segment tables, and hostile headers.

The files here are built byte by byte in the formats LiME and QEMU write (the real-guest tests in
test_fullsystem.py cover real images); what is checked is that every malformed header becomes a
clear error or a listed problem, with bounded work, and that detection never mistakes a process
core for a machine image or the other way round.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
from conftest import zen

from zen.memory.system.formats import LIME_MAGIC, MAX_SEGMENTS, open_physical, sniff
from zen.runtime.errors import ImageError

PAGE = 4096


def lime(ranges: list[tuple[int, bytes]], version: int = 1) -> bytes:
    out = bytearray()
    for start, data in ranges:
        out += struct.pack("<IIQQQ", LIME_MAGIC, version, start, start + len(data) - 1, 0) + data
    return bytes(out)


def test_lime_segments_map_physical_to_file(tmp_path):
    a, b = os.urandom(2 * PAGE), os.urandom(3 * PAGE)
    p = tmp_path / "m.lime"
    p.write_bytes(lime([(0x1000, a), (0x100000, b)]))
    assert sniff(p) == "lime"
    img = open_physical(p, "lime")
    assert [(s.start, s.length) for s in img.segments] == [(0x1000, 2 * PAGE), (0x100000, 3 * PAGE)]
    data = p.read_bytes()
    for phys, want in ((0x1000, a), (0x100000 + PAGE, b[PAGE:])):
        off, n = img.file_offset(phys, len(want))
        assert data[off : off + n] == want[:n]
    assert img.file_offset(0x5000, 1) is None  # a hole between ranges is not in the image
    assert not img.problems


def test_lime_truncated_is_a_problem_not_a_crash(tmp_path):
    p = tmp_path / "cut.lime"
    p.write_bytes(lime([(0, os.urandom(4 * PAGE))])[: 32 + 2 * PAGE + 100])
    img = open_physical(p, "lime")
    assert img.segments[0].length == 2 * PAGE + 100
    assert any("truncated" in x for x in img.problems)


@pytest.mark.parametrize(
    "ranges, needle",
    [
        ([(0x2000, b"x" * PAGE), (0x1000, b"y" * PAGE)], "out of order"),
        ([(1 << 60, b"x" * PAGE)], "impossible"),
    ],
)
def test_lime_bad_ranges(tmp_path, ranges, needle):
    p = tmp_path / "bad.lime"
    p.write_bytes(lime(ranges))
    with pytest.raises(ImageError, match=needle):
        open_physical(p, "lime")


def test_lime_header_flood_is_bounded(tmp_path):
    """A file of nothing but 1-byte ranges must be refused after MAX_SEGMENTS headers, quickly."""
    p = tmp_path / "flood.lime"
    p.write_bytes(b"".join(lime([(i * 2, b"z")]) for i in range(MAX_SEGMENTS + 10)))
    t = time.perf_counter()
    with pytest.raises(ImageError, match="corrupt or hostile"):
        open_physical(p, "lime")
    assert time.perf_counter() - t < 10


def test_lime_wrong_version(tmp_path):
    p = tmp_path / "v2.lime"
    p.write_bytes(lime([(0, b"q" * PAGE)], version=7))
    with pytest.raises(ImageError, match="version 7"):
        open_physical(p, "lime")


def elf_physical(segments: list[tuple[int, bytes]], note_name: bytes = b"QEMU") -> bytes:
    """A minimal ELF64 ET_CORE with one PT_NOTE (named like QEMU's) and PT_LOADs at physical addresses."""
    name = note_name + b"\0"
    note = struct.pack("<III", len(name), 8, 1) + name.ljust((len(name) + 3) // 4 * 4, b"\0") + b"\0" * 8
    phnum = 1 + len(segments)
    off = 64 + 56 * phnum
    phdrs = [struct.pack("<IIQQQQQQ", 4, 0, off, 0, 0, len(note), len(note), 4)]
    body = bytearray(note)
    pos = off + len(note)
    for paddr, data in segments:
        phdrs.append(struct.pack("<IIQQQQQQ", 1, 7, pos, 0, paddr, len(data), len(data), 1))
        body += data
        pos += len(data)
    ehdr = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    ehdr += struct.pack("<HHIQQQIHHHHHH", 4, 62, 1, 0, 64, 0, 0, 64, 56, phnum, 0, 0, 0)
    return ehdr + b"".join(phdrs) + bytes(body)


def test_elf_physical_dump_detected_and_mapped(tmp_path):
    a = os.urandom(2 * PAGE)
    p = tmp_path / "qemu.elf"
    p.write_bytes(elf_physical([(0, a), (0x100000, os.urandom(PAGE))]))
    assert sniff(p) == "elf"
    img = open_physical(p, "elf")
    assert img.detail == "QEMU dump-guest-memory"
    off, n = img.file_offset(PAGE, PAGE)
    assert p.read_bytes()[off : off + n] == a[PAGE:]


def test_elf_overlapping_segments_keep_the_first(tmp_path):
    p = tmp_path / "overlap.elf"
    p.write_bytes(elf_physical([(0, b"a" * 2 * PAGE), (PAGE, b"b" * PAGE)]))
    img = open_physical(p, "elf")
    assert len(img.segments) == 1 and any("overlapping" in x for x in img.problems)


def test_process_cores_are_not_machine_images(torch_target_images):
    _, images = torch_target_images
    for core in images.values():
        assert sniff(Path(core)) is None


@pytest.mark.parametrize("size", [100, 1 << 16])
def test_garbage_is_neither_core_nor_machine_image(tmp_path, size):
    p = tmp_path / "junk.bin"
    p.write_bytes(os.urandom(size))
    res = zen("info", p, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "not an ELF core file" in res.stderr


def test_ps_refuses_a_process_core(torch_target_images):
    _, images = torch_target_images
    res = zen("ps", next(iter(images.values())), check=False)
    assert res.returncode == 2 and "core of one process" in res.stderr and "Traceback" not in res.stderr


# -- fuzzing what reads evidence -------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=0, max_size=3 * PAGE), st.sampled_from(["lime", "elf", "avml"]))
def test_fuzz_container_headers(tmp_path, body, fmt):
    """Random bytes behind a real magic: a clear ImageError or a table, nothing else."""
    magic = {
        "lime": struct.pack("<II", LIME_MAGIC, 1),
        "avml": struct.pack("<II", 0x4C4D5641, 2),
        "elf": b"\x7fELF\x02\x01\x01\x00",
    }
    p = tmp_path / f"fuzz.{fmt}"
    p.write_bytes(magic[fmt] + body + b"\0" * PAGE)
    try:
        img = open_physical(p, fmt)
    except ImageError:
        return
    for s in img.segments:
        assert 0 <= s.start and s.length > 0
        assert s.file_offset is None or s.file_offset + s.length <= p.stat().st_size


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=(1 << 64) - 1), min_size=16, max_size=16 * 512), st.integers(0, 15))
def test_fuzz_page_table_walk_is_bounded(words, top):
    """Page tables made of random (often self-referencing) entries over 16 physical pages: the
    walk ends within its budget or says the budget ran out; it never loops or crashes."""
    import numpy as np

    from zen.memory.system.pagetables import PageTableWalker, WalkBudgetExceeded

    mem = np.zeros(16 * 512, dtype=np.uint64)
    mem[: len(words)] = np.array(words, dtype=np.uint64) & np.uint64(0x0000_0000_0000_F1E7)  # frames 0..15, flags

    def read(phys: int):
        page = phys // PAGE
        return mem[page * 512 : page * 512 + 512] if 0 <= page < 16 else None

    walker = PageTableWalker(read, max_tables=2000, max_pages=50_000)
    try:
        runs = walker.run_arrays(top * PAGE, 0, 1 << 47)
    except WalkBudgetExceeded:
        return
    assert walker.tables <= 2000
    for v, n, p in zip(*(a.tolist() for a in runs)):
        assert 0 <= v < 1 << 47 and n > 0 and p >= 0
