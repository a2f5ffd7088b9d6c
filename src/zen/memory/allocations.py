"""Large glibc allocations in a process image: the interiors a census of Python objects skips.

glibc serves every allocation above its mmap threshold (128 KiB at first, at most 32 MiB) with a
mapping of its own and writes a header at the start of that mapping: a zero `prev_size` word and
the mapping's size with the IS_MMAPPED bit (2). One such *mmapped chunk* holds one allocation: a
tensor's storage, a numpy buffer, a big list's item array, or one big object. A Python object in it
can only start at the allocation's first bytes (after the header, an alignment gap and the GC
header), never deep inside: CPython's own arenas and pools are separate mappings (`mmap`, not
`malloc`), and so are mimalloc's segments.

The census (`zen.cpython.heap`) looks for type pointers word by word in all writable memory. On a
process serving a model nearly all of that memory is tensor data in such chunks (6.24 of 6.71
writable GB in a GPT-2 XL process), and from a cold page cache reading it is most of a recovery's
time before the weights are written. So anonymous writable regions are walked here from header to
header, without reading what lies between, and the census reads only the first `HEAD` bytes of each
chunk. A region position that holds no header is stepped over page by page (in growing windows,
one vectorised read of the page-start words each): arenas, thread heaps and stacks are scanned in
full as before.

What the skip gives up: an object whose header lies past the first `HEAD` bytes of a chunk. In a
real process there is none; a forged image can hide objects this way, as it can by zeroing them.
Ordinary data that happens to look like a header at a page start of an anonymous region (a zero
word, then a page-multiple size above `HEAD` with only bit 1 set below the page, fitting the region)
would be followed too; the tests check on real processes that no object a whole-memory scan finds
is skipped.
Every header read is bounded by its region and checked (page-aligned size, inside the region,
larger than `HEAD`); a position that fails any check is scanned. Only the parts of a region that the
image holds are walked (`_held`): a header's claim about a region's size is not trusted.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from zen.memory.scan import Slice, gather_u64
from zen.memory.space import AddressSpace, Chunk

PAGE = 4096
HEAD = 64 << 10  # bytes of each chunk the census still reads: header, alignment gap, one object's start
IS_MMAPPED = 2
FIRST_WINDOW, MAX_WINDOW = 16, 4096  # pages checked for a header per step, doubling between headers


def chunk_interiors(space: AddressSpace, regions) -> list[tuple[int, int]]:
    """Sorted, disjoint (start, end) ranges inside glibc mmapped chunks, past each one's first
    `HEAD` bytes, in the anonymous writable `regions` of `space`."""
    out: list[tuple[int, int]] = []
    starts = [c.start for c in space.chunks]
    for r in regions:
        if r.writable and not r.path and r.end - r.start > HEAD:
            for a, b in _held(space.chunks, starts, r.start, r.end):
                if b - a > HEAD:
                    out.extend(_walk(space, a, b))
    return out


def _held(chunks: Sequence[Chunk], starts: list[int], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) the image holds bytes for, adjacent ones merged. A region's extent
    comes from the image's own headers (an ELF program header's p_memsz): a corrupt or forged one
    claims terabytes, and stepping through them page window by page window never ends (the CLI
    fuzzer's `phdr N +40` inputs hung `zen recover`). The chunks (sorted, `starts` theirs) are what the
    file really holds."""
    i = max(0, bisect.bisect_right(starts, start) - 1)
    out: list[tuple[int, int]] = []
    while i < len(chunks) and chunks[i].start < end:
        a, b = max(start, chunks[i].start), min(end, chunks[i].end)
        if a < b:
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        i += 1
    return out


def _walk(space: AddressSpace, start: int, end: int) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    p = start + (-start) % PAGE
    window = FIRST_WINDOW
    while end - p >= PAGE:
        n = min(window, (end - p) // PAGE)
        pages = np.uint64(p) + np.arange(n, dtype=np.uint64) * np.uint64(PAGE)
        w0, ok0 = gather_u64(space, pages)
        w1, ok1 = gather_u64(space, pages + np.uint64(8))
        size = w1 & ~np.uint64(PAGE - 1)
        fits = size <= np.uint64(end) - pages  # no wrap-around: every page is below `end`
        header = ok0 & ok1 & (w0 == 0) & ((w1 & np.uint64(PAGE - 1)) == IS_MMAPPED) & (size > HEAD) & fits
        hit = np.flatnonzero(header)
        if not hit.size:
            p += n * PAGE
            window = min(window * 2, MAX_WINDOW)
            continue
        at, length = int(pages[hit[0]]), int(size[hit[0]])
        found.append((at + HEAD, at + length))
        p, window = at + length, FIRST_WINDOW
    return found


def without(chunks: Sequence[Chunk], skip: Sequence[tuple[int, int]]) -> list:
    """`chunks` as scan pieces (`Slice`) with the `skip` ranges cut out; a chunk no range touches is
    kept as it is."""
    if not skip:
        return list(chunks)
    out: list = []
    starts = [a for a, _ in skip]
    for c in chunks:
        i = max(0, bisect.bisect_right(starts, c.start) - 1)
        pos, cut = c.start, False
        while i < len(skip) and skip[i][0] < c.end:
            a, b = skip[i]
            if b > pos:
                if a > pos:
                    out.append(Slice(c, pos, a))
                pos, cut = max(pos, b), True
            i += 1
        if not cut:
            out.append(c)
        elif pos < c.end:
            out.append(Slice(c, pos, c.end))
    return out
