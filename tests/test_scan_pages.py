"""Scans over a space made of thousands of one-page chunks, as a process of a whole-machine image is.

A process's pages lie scattered in a physical image: its address space is tens of thousands of
one-page chunks, each a view of the image at an unrelated offset. The scans join runs of them
(`AddressSpace._coalesced`) and cut them to the ranges of a pointer map (`scan.pieces_of`);
none of that may change what is found. Each scan here is checked against reading every word of
the space one by one.
"""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from zen.memory import space as space_mod
from zen.memory.regions import Region, Source
from zen.memory.scan import find_u64_in, find_u64_in_ranges, pieces_of
from zen.memory.space import AddressSpace, MmapChunk

PAGE = 4096
BASE = 0x7F00_0000_0000
PAGES = 3000
GAP = 1700  # the page left out: a range over it stops there


@pytest.fixture()
def paged(tmp_path):
    """A space of PAGES one-page chunks (one left out) whose file offsets are a permutation of
    the pages of a file, the file's words being small values and, here and there, a few
    "pointers" from a known set."""
    rng = np.random.default_rng(7)
    words = rng.integers(0, 1 << 20, size=PAGES * PAGE // 8, dtype=np.uint64)
    values = np.arange(BASE, BASE + 40 * 8, 8, dtype=np.uint64)
    where = rng.choice(words.size, size=500, replace=False)
    words[where] = rng.choice(values, size=where.size)
    path = tmp_path / "phys.img"
    path.write_bytes(words.tobytes())
    fh = open(path, "rb")
    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    order = rng.permutation(PAGES)  # virtual page i lives at file page order[i]
    chunks = [
        MmapChunk(BASE + i * PAGE, BASE + (i + 1) * PAGE, mm, int(order[i]) * PAGE, Source.IMAGE)
        for i in range(PAGES)
        if i != GAP
    ]
    space = AddressSpace([Region(BASE, BASE + PAGES * PAGE, "rw-p")], chunks)
    truth = {BASE + i * PAGE + 8 * k: int(w) for i in range(PAGES) if i != GAP
             for k, w in enumerate(words[order[i] * PAGE // 8 : (order[i] + 1) * PAGE // 8].tolist())}  # fmt: skip
    yield space, values, truth
    mm.close()
    fh.close()


def _expected(truth: dict[int, int], values, ranges) -> list[tuple[int, int]]:
    want = {int(v) for v in values}
    out = []
    for a, b in ranges:
        for addr in range(a - a % 8, b, 8):
            if addr not in truth:
                break  # not captured: a read stops here
            if addr >= a and addr + 8 <= b and truth[addr] in want:
                out.append((addr, truth[addr]))
    return sorted(out)


def test_whole_space_scan_equals_word_by_word(paged):
    space, values, truth = paged
    hits, found = find_u64_in(space, values.tolist())
    want = set(values.tolist())
    assert sorted(zip(hits.tolist(), found.tolist())) == sorted((a, v) for a, v in truth.items() if v in want)
    assert hits.size > 400


def test_ranges_cut_inside_pages_and_across_the_gap(paged):
    """Ranges that begin and end inside pages, span hundreds of pages, and run into the gap."""
    space, values, truth = paged
    ranges = [
        (BASE + 100, BASE + 5 * PAGE + 24),  # starts and ends inside a page
        (BASE + 10 * PAGE, BASE + 900 * PAGE),  # hundreds of whole pages, joined for the scan
        (BASE + (GAP - 3) * PAGE + 8, BASE + (GAP + 50) * PAGE),  # runs into the gap: stops there
        (BASE + (GAP + 1) * PAGE, BASE + PAGES * PAGE),  # after the gap, to the end
        (BASE + PAGES * PAGE, BASE + (PAGES + 4) * PAGE),  # nothing captured
    ]
    hits, found = find_u64_in_ranges(space, values.tolist(), ranges)
    assert sorted(zip(hits.tolist(), found.tolist())) == _expected(truth, values, ranges)
    pieces = pieces_of(space, ranges)
    assert pieces[0].start == BASE + 100 and pieces[-1].end == BASE + PAGES * PAGE
    assert all(p.end <= BASE + GAP * PAGE or p.start >= BASE + (GAP + 1) * PAGE for p in pieces)
    assert bytes(pieces[0].view(0, 8)) == space.read(BASE + 100, 8)


def test_joined_pages_are_kept_for_a_heap_scan_and_released_otherwise(paged, monkeypatch):
    """A scan of the Python heap (`keep`) leaves the pages it joined resident for the readers
    that follow (below the soft limit); a plain scan releases them."""
    space, values, _ = paged
    released: list[int] = []
    monkeypatch.setattr(MmapChunk, "release", lambda self, *a: released.append(self.start))
    monkeypatch.setattr(space_mod, "resident_bytes", lambda: 0)  # whatever ran before in this process
    find_u64_in_ranges(space, values.tolist(), [(BASE, BASE + GAP * PAGE)])
    assert released == []
    find_u64_in(space, values.tolist())
    assert len(released) == PAGES - 1
    released.clear()
    monkeypatch.setattr(space_mod, "resident_bytes", lambda: space_mod.RESIDENT_SOFT_LIMIT + 1)
    find_u64_in_ranges(space, values.tolist(), [(BASE, BASE + GAP * PAGE)])
    assert len(released) == GAP
