"""The census skips the interiors of large glibc allocations (`zen.memory.allocations`).

On constructed memory: headers are followed, forged or damaged ones are not. On real model
processes: no object a whole-image scan finds lies in a skipped range, the tensor storages do,
and the census through the skip finds what the plain scan finds (`test_scan_fast.py` checks the
objects one by one).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from conftest import opened_heap

from zen.cpython.heap import Heap
from zen.frontends.pytorch.modules import MODULE_BASE, TENSOR_BASE
from zen.memory.allocations import HEAD, PAGE, chunk_interiors, without
from zen.memory.regions import Region
from zen.memory.scan import find_u64_in, writable_chunks
from zen.memory.space import AddressSpace, BytesChunk

BASE = 0x7F0000000000


def _header(size: int, flags: int = 2, prev: int = 0) -> bytes:
    return struct.pack("<QQ", prev, size | flags)


def _space(layout: list[tuple[int, bytes]], total: int, path: str = "", perms: str = "rw-p") -> AddressSpace:
    data = bytearray(total)
    for off, blob in layout:
        data[off : off + len(blob)] = blob
    return AddressSpace([Region(BASE, BASE + total, perms, path)], [BytesChunk(BASE, bytes(data))])


def test_walk_follows_headers_and_refuses_forged_ones():
    big = 4 << 20
    layout = [
        (0, b"\x01" * 64),  # an arena: no header at its first page
        (2 * PAGE, _header(big)),  # a chunk of 4 MiB after two pages of arena
        (2 * PAGE + big, _header(big + PAGE)),  # the next one right after it
        (2 * PAGE + 2 * big + PAGE, _header(HEAD)),  # too small to skip anything
        (2 * PAGE + 2 * big + 2 * PAGE, _header(1 << 40)),  # past the region's end
        (2 * PAGE + 2 * big + 3 * PAGE, _header(big, flags=3)),  # not an mmapped chunk's flags
        (2 * PAGE + 2 * big + 4 * PAGE, _header(big, prev=8)),  # a nonzero prev_size at a mapping's start
        (2 * PAGE + 2 * big + 5 * PAGE, _header(big + 17)),  # a size that is no page multiple
    ]
    total = 2 * PAGE + 2 * big + 6 * PAGE + big + PAGE
    layout.append((total - big - PAGE, _header(big)))  # the last one, ending a page before the region
    space = _space(layout, total)
    got = chunk_interiors(space, space.regions)
    first = BASE + 2 * PAGE
    assert got == [
        (first + HEAD, first + big),
        (first + big + HEAD, first + 2 * big + PAGE),
        (BASE + total - big - PAGE + HEAD, BASE + total - PAGE),
    ]
    # file-backed, read-only or pseudo-named regions are never walked
    for path, perms in (("/usr/lib/libx.so", "rw-p"), ("", "r--p"), ("[heap]", "rw-p")):
        other = _space(layout, total, path, perms)
        assert chunk_interiors(other, other.regions) == []


def test_a_region_claiming_more_than_the_image_holds_is_walked_where_it_holds(monkeypatch):
    """A region's extent comes from the image (an ELF program header's p_memsz): one claiming a
    terabyte over a few MiB of data is walked over those MiB, in a few reads, with the same result as
    the true region (the CLI fuzzer's `phdr N +40` inputs hung `zen recover` here before: some 16 M
    windows of page reads)."""
    import zen.memory.allocations as allocations

    real, calls = allocations.gather_u64, []

    def counted(space, addrs):
        calls.append(len(addrs))
        if len(calls) > 1000:
            raise AssertionError("the walk went on past what the image holds")
        return real(space, addrs)

    monkeypatch.setattr(allocations, "gather_u64", counted)
    big = 4 << 20
    total = PAGE + big + PAGE
    true = _space([(PAGE, _header(big))], total)
    data = bytes(true.chunks[0].read(0, total))
    held = [BytesChunk(BASE, data[: total // 2]), BytesChunk(BASE + total // 2, data[total // 2 :])]  # two pieces, adjacent
    forged = AddressSpace([Region(BASE, BASE + (1 << 40), "rw-p", "")], held)
    got = chunk_interiors(forged, forged.regions)
    assert got == chunk_interiors(true, true.regions) == [(BASE + PAGE + HEAD, BASE + PAGE + big)]


def test_pieces_cut_exactly_the_skipped_ranges():
    chunks = [BytesChunk(BASE, bytes(10 * PAGE)), BytesChunk(BASE + 20 * PAGE, bytes(10 * PAGE))]
    skip = [(BASE + 2 * PAGE, BASE + 4 * PAGE), (BASE + 8 * PAGE, BASE + 22 * PAGE), (BASE + 25 * PAGE, BASE + 26 * PAGE)]
    pieces = without(chunks, skip)
    spans = [(p.start - BASE, p.end - BASE) for p in pieces]
    assert spans == [(0, 2 * PAGE), (4 * PAGE, 8 * PAGE), (22 * PAGE, 25 * PAGE), (26 * PAGE, 30 * PAGE)]
    assert all(len(p.array()) == p.end - p.start for p in pieces)
    assert without(chunks, []) == chunks


@pytest.fixture(scope="module")
def hf_heap(hf_image):
    img, target = hf_image
    with opened_heap(img) as (ip, heap):
        yield ip, heap, target


def test_no_object_lies_in_a_skipped_range(hf_heap):
    """On a transformers process: every object of the census's types that a whole-image scan finds
    lies outside the skipped ranges (on this small model they are 8 of 479 writable MB; on GPT-2 XL,
    6.24 of 6.71 GB: bench/results/perf.md)."""
    ip, heap, target = hf_heap
    types = sorted(
        {t.addr for t in heap.subclasses_of(TENSOR_BASE)}
        | {t.addr for t in heap.subclasses_of(MODULE_BASE)}
        | {ip.wk.types["function"], ip.wk.types["code"], ip.wk.types["type"]}
    )
    chunks = writable_chunks(ip.space)
    skip = chunk_interiors(ip.space, ip.space.regions)
    assert skip, "a transformers process has allocations above glibc's mmap threshold"
    hits, _ = find_u64_in(ip.space, types, chunks)
    objects = hits - np.uint64(ip.P.object.ob_type)
    objects = objects[heap._plausible(objects)]  # noqa: SLF001 (the census's own check)
    starts = np.array([a for a, _ in skip], dtype=np.uint64)
    ends = np.array([b for _, b in skip], dtype=np.uint64)
    i = np.searchsorted(starts, objects, side="right") - 1
    inside = (i >= 0) & (objects < ends[np.maximum(i, 0)])
    assert objects.size > 10_000 and not inside.any(), [hex(int(a)) for a in objects[inside][:5]]
    # the census through the skip: the same types, the same tensor classes
    full = Heap(ip)
    full._memo = dict(heap._memo, pointer_span=None, pointer_map=None, all_types=None, mro_names=None)  # noqa: SLF001
    assert full.all_types() == heap.all_types()
    # and against the process's own ground truth: every module it listed is found by the skipping census
    found = heap.instances_of_types({t.addr for t in heap.subclasses_of(MODULE_BASE)})
    addrs = {int(a) for v in found.values() for a in v.tolist()}
    truth = {m["address"] for model in target.truth["models"].values() for m in model["modules"]}
    assert truth and truth <= addrs, sorted(truth - addrs)[:5]
