"""Hostile and damaged images through the `zen` command (issue 38): never exit 70, never a hang.

Each case reproduces a finding of the whole-CLI fuzzing on real evidence (a family model's process image): a
program header whose segment ends at 2^64, one whose segment runs over the next, random pages written over the heap,
a core cut short, a 1 TiB sparse file, whole-machine container headers claiming a terabyte over a sparse file, and an
executable given to `zen ps`.
The whole-CLI harness itself is bench/fuzz_cli.py (bench/results/fuzz.md).
"""

from __future__ import annotations

import random
import shutil
import struct
import time
from pathlib import Path

import pytest
from conftest import zen
from fuzz_cli import layout  # bench/: the whole-CLI fuzzer's view of a core

TIB = 1 << 40


def _loads(path: Path) -> tuple[int, int, list[tuple[int, int, int, int]]]:
    """(phoff, phentsize, [(index, p_offset, p_filesz, p_memsz)] of PT_LOAD segments with data)."""
    lay = layout(path)
    return lay["phoff"], lay["phentsize"], [(i, off, fsz, msz) for i, off, fsz, _, msz in lay["loads"]]


def _clean(res, *codes) -> None:
    assert res.returncode in codes, (res.returncode, res.stderr[-800:])
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr[-800:]


@pytest.fixture(scope="module")
def core(family_images, tmp_path_factory):
    image, _ = family_images["convnet"]
    return image, tmp_path_factory.mktemp("hostile-images")


def test_segment_ending_at_the_top_of_the_address_space(core):
    image, work = core
    phoff, phentsize, loads = _loads(image)
    bad = work / "top.core"
    for i, _, _, msz in sorted(loads, key=lambda x: -x[2])[:2] + loads[-2:]:
        shutil.copy(image, bad)
        with open(bad, "r+b") as fh:
            fh.seek(phoff + i * phentsize + 16)
            fh.write(struct.pack("<Q", (1 << 64) - msz))
        _clean(zen("info", bad, "--json", check=False, timeout=300), 0, 2, 3, 5, 6)
        _clean(zen("recover", bad, "-o", work / "top-case", check=False, timeout=300), 0, 2, 3, 5, 6)


def _pt_loads(path: Path) -> list[tuple[int, int, int, int, int]]:
    """(index, p_vaddr, p_memsz, p_offset, p_filesz) of every PT_LOAD, in file order, read with struct."""
    lay = layout(path)
    out = []
    with open(path, "rb") as fh:
        for i in range(lay["phnum"]):
            fh.seek(lay["phoff"] + i * lay["phentsize"])
            t, _, off, va, _, fsz, msz, _ = struct.unpack("<IIQQQQQQ", fh.read(56))
            if t == 1 and msz:
                out.append((i, va, msz, off, fsz))
    return out


def test_segment_claiming_memory_past_the_next_one(core):
    """Found by the fuzzer (seed 101, input 764): p_memsz of a segment inside a library's mapping set to 2^63. zen
    said nothing and mapped the rest of the library from disk over every mapping above it (`zen info` of a 244 MB
    image: 709 MiB, "9,223,372,037,591,023,616 bytes mapped", exit 0). The segment now ends where the next one
    starts, the memory above it reads as before, and the forged header is said (exit 5)."""
    from zen.memory.elfcore import ElfCoreSpace

    image, work = core
    lay = layout(image)
    clean = ElfCoreSpace(image)
    files = clean.info.files
    loads = sorted(_pt_loads(image), key=lambda x: x[1])
    # a segment that starts inside a file mapping, followed by a segment the image holds data for
    picks = [(a, b) for a, b in zip(loads, loads[1:]) if any(f.start <= a[1] < f.end for f in files)
             and b[4] >= 4096]  # fmt: skip
    assert picks, "the family image has file-backed segments followed by captured ones"
    (i, vaddr, *_), (_, nxt, _, nxt_off, _) = picks[len(picks) // 2]
    with open(image, "rb") as fh:  # what the core file itself holds for the next segment: the ground truth
        fh.seek(nxt_off)
        truth = fh.read(4096)
    for claim in (1 << 63, nxt - vaddr + 4096):
        bad = work / "memsz.core"
        shutil.copy(image, bad)
        with open(bad, "r+b") as fh:
            fh.seek(lay["phoff"] + i * lay["phentsize"] + 40)
            fh.write(struct.pack("<Q", claim))
        space = ElfCoreSpace(bad)
        assert any("overlap the next segment" in p and f"{vaddr:#x}" in p for p in space.problems), space.problems
        assert [(r.start, r.end) for r in space.regions] == [(r.start, r.end) for r in clean.regions]
        assert space.read(nxt, 4096) == truth == clean.read(nxt, 4096)
        assert sum(c.end - c.start for c in space.chunks) == sum(c.end - c.start for c in clean.chunks)
        res = zen("info", bad, check=False, timeout=300)
        _clean(res, 5)
        assert "overlap the next segment" in res.stdout + res.stderr


def test_random_pages_over_the_heap(core):
    """Pages of random or repeated bytes over writable memory (a smear, a hostile writer): each run recovers what is
    sound or stops with a typed error; the seeds that once raised OverflowError in the bulk readers are among them."""
    image, work = core
    _, _, loads = _loads(image)
    writable = loads
    bad = work / "pages.core"
    for seed in range(6):
        shutil.copy(image, bad)
        rng = random.Random(seed)
        with open(bad, "r+b") as fh:
            for _ in range(16):
                _, off, fsz, _ = rng.choice(writable)
                fh.seek(off + rng.randrange(fsz // 4096) * 4096)
                fh.write(rng.randbytes(4096) if rng.random() < 0.5 else bytes([rng.randrange(256)]) * 4096)
        _clean(zen("recover", bad, "-o", work / f"pages-case{seed}", check=False, timeout=300), 0, 2, 3, 5, 6)


def test_truncated_core_says_so(core):
    image, work = core
    cut = work / "cut.core"
    with open(image, "rb") as src, open(cut, "wb") as dst:
        dst.write(src.read(1 << 20))
    res = zen("recover", cut, "-o", work / "cut-case", check=False, timeout=300)
    _clean(res, 5)
    assert "truncated" in res.stderr and "bytes of segment data lie past the end" in res.stderr
    assert not (work / "cut-case").exists()


def _sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def _qemu_like_dump(length: int) -> bytes:
    """ELF64 CORE with a "QEMU" note and one PT_LOAD of `length` bytes at file offset 4096 (a whole-machine dump)."""
    note = struct.pack("<III", 5, 8, 0) + b"QEMU\0\0\0\0" + b"\0" * 8
    ehdr = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, b"\0" * 7, 4, 62, 1, 0, 64, 0, 0, 64, 56, 2, 0, 0, 0)
    notes = struct.pack("<IIQQQQQQ", 4, 0, 64 + 2 * 56, 0, 0, len(note), len(note), 4)
    load = struct.pack("<IIQQQQQQ", 1, 7, 4096, 0, 0, length, length, 4096)
    return (ehdr + notes + load + note).ljust(4096, b"\0")


@pytest.mark.parametrize("kind", ["raw-1TiB", "elf-dump-1TiB-hole", "lime-range-1TiB"])
def test_sparse_claims_are_bounded_by_the_data_present(kind, tmp_path):
    if kind == "raw-1TiB":
        p = _sparse(tmp_path / "z.img", b"", TIB)
    elif kind == "elf-dump-1TiB-hole":
        p = _sparse(tmp_path / "dump.elf", _qemu_like_dump(TIB), 4096 + TIB)
    else:  # LiME: magic, version 1, start, end (inclusive), reserved
        p = _sparse(tmp_path / "m.lime", struct.pack("<IIQQQ", 0x4C694D45, 1, 0, TIB - 1, 0), 32 + TIB)
    for cmd in (["ps", p], ["info", p], ["recover", p, "-o", tmp_path / "case"]):
        t0 = time.monotonic()
        res = zen(*cmd, check=False, timeout=120)
        _clean(res, 2, 4)
        assert time.monotonic() - t0 < 60, (kind, cmd[0], time.monotonic() - t0)


def test_ps_on_an_executable_says_what_it_is(tmp_path):
    exe = Path(shutil.which("true") or "/bin/true").resolve()
    res = zen("ps", exe, check=False)
    _clean(res, 2)
    assert "ELF" in res.stderr and "not a memory image" in res.stderr
