"""The page-table walk and the location of a whole-machine process's pages as arrays, against the run-by-run forms.

`PageTableWalker.run_arrays` must give exactly the runs of the run-at-a-time walk it replaced (kept here as the
reference, `_reference_runs`; where the budget stops a walk, the runs yielded before it), and
`SystemProcessSpace._resident_chunks` exactly the chunks of the run-by-run location it replaced (the reference here:
`_reference_chunks`): a file offset per piece from `PhysicalImage.file_offset` (or the physical address,
`physical_run`, for compressed AVML), a page outside every segment counted missing, pieces contiguous both virtually
and in the image joined. Hostile inputs: random, self-referencing tables; segments that end inside runs, overlap, or
leave holes. The real guests' chunk lists are compared in test_fullsystem.py (numpy walk vs Volatility).
"""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zen.memory.system.pagetables import (
    PFN_MASK,
    PHYS_MASK,
    PRESENT,
    PROTNONE,
    PSE,
    SHIFTS,
    USER_TOP,
    PageTableWalker,
    WalkBudgetExceeded,
)
from zen.memory.system.physical import PhysicalImage, PhysSegment
from zen.memory.system.process import PAGE, SystemProcessSpace

TABLES = 16


def _tables(rng, corrupt: int) -> np.ndarray:
    """16 pages of tables: page 0 the top table, 1-3 PDPTs, 4-6 PDs, 7-15 PTs, linked at random (tables shared,
    1 GiB and 2 MiB pages, entries above user space), leaf entries in runs whose frames often continue from one table
    into the next (so runs merge across tables), some PROT_NONE (inverted frames); then `corrupt` entries anywhere
    set to random words pointing back into these pages (cycles, tables as leaves)."""
    mem = np.zeros(TABLES * 512, dtype=np.uint64)
    present, pse, protnone = 0x1, 0x80, 0x100

    def put(table: int, index: int, word: int) -> None:
        mem[table * 512 + index] = word

    for i in rng.sample(range(512), rng.randrange(1, 5)):  # mostly user space (< 256), sometimes above it
        put(0, i if rng.random() < 0.2 else i % 256, rng.randrange(1, 4) * PAGE | present)
    for t in range(1, 4):
        for i in rng.sample(range(512), rng.randrange(1, 4)):
            put(
                t,
                i,
                (rng.randrange(0, 1 << 20) << 30) | present | pse if rng.random() < 0.1 else rng.randrange(4, 7) * PAGE | present,
            )
    for t in range(4, 7):
        start = rng.randrange(0, 500)
        for i in range(start, min(512, start + rng.randrange(1, 6))):  # neighbouring entries: virtually adjacent PTs
            put(
                t,
                i,
                (rng.randrange(0, 1 << 20) << 21) | present | pse
                if rng.random() < 0.1
                else rng.randrange(7, 16) * PAGE | present,
            )
    frame = rng.randrange(0, 1 << 30)
    for t in range(7, 16):
        i = rng.randrange(0, 512) if rng.random() < 0.5 else 0
        frame = frame if rng.random() < 0.6 else rng.randrange(0, 1 << 30)
        while i < 512:
            if rng.random() < 0.9:
                if rng.random() < 0.05:
                    put(t, i, ~(frame * PAGE) & 0xFFFF_FFFF_FFFF_F000 | protnone)
                else:
                    put(t, i, frame * PAGE | present)
            frame += 1 if rng.random() < 0.95 else rng.randrange(-5, 50)
            i += 1 if rng.random() < 0.9 else rng.randrange(1, 40)
    for _ in range(corrupt):
        put(rng.randrange(TABLES), rng.randrange(512), rng.randrange(TABLES) * PAGE | rng.choice((present, present | pse, 0x67)))
    return mem


def _reader(mem: np.ndarray):
    def read(phys: int):
        page = phys // PAGE
        return mem[page * 512 : page * 512 + 512] if 0 <= page < TABLES else None

    return read


def _reference_runs(walker: PageTableWalker, pgd: int, start: int, end: int):
    """The walk before `run_arrays`: the same tables in the same order (and the walker's budgets), yielding one run
    at a time, merged as it goes."""
    end = min(end, USER_TOP)
    if start >= end:
        return
    cur = None
    for v, n, p in _reference_walk(walker, pgd & PFN_MASK, 0, 0, start, end):
        if cur is not None and cur[0] + cur[1] == v and cur[2] + cur[1] == p:
            cur[1] += n
            continue
        if cur is not None:
            yield tuple(cur)
        cur = [v, n, p]
    if cur is not None:
        yield tuple(cur)


def _reference_walk(walker: PageTableWalker, table_phys: int, level: int, base: int, start: int, end: int):
    entries = walker._table(table_phys)
    if entries is None:
        return
    shift = SHIFTS[level]
    span = 1 << shift
    lo = max(0, (start - base) >> shift)
    hi = min(512, ((end - base - 1) >> shift) + 1)
    if lo >= hi:
        return
    e = entries[lo:hi]
    present = (e & np.uint64(PRESENT | PROTNONE)) != 0
    frames = np.where((e & np.uint64(PRESENT)) != 0, e, ~e) & np.uint64(PFN_MASK)  # PROT_NONE: inverted
    if level == 3:
        idx, frames = np.arange(lo, hi, dtype=np.uint64)[present], frames[present]
        walker.pages += len(idx)
        if walker.pages > walker.max_pages:
            raise WalkBudgetExceeded(f"more than {walker.max_pages:,} resident pages mapped")
        for k in range(len(idx)):  # page by page; the merge above makes the runs
            yield base + int(idx[k]) * PAGE, PAGE, int(frames[k])
        return
    for i in np.flatnonzero(present).tolist():
        vbase, frame = base + (lo + i) * span, int(frames[i])
        if level in (1, 2) and int(e[i]) & PSE:  # a 1 GiB or 2 MiB page
            frame &= ~(span - 1) & PHYS_MASK
            v0, v1 = max(vbase, start), min(vbase + span, end)
            walker.pages += (v1 - v0 + PAGE - 1) // PAGE
            if walker.pages > walker.max_pages:
                raise WalkBudgetExceeded(f"more than {walker.max_pages:,} resident pages mapped")
            yield v0, v1 - v0, frame + (v0 - vbase)
        else:
            yield from _reference_walk(walker, frame, level + 1, vbase, max(start, vbase), min(end, vbase + span))


def _runs_until_budget(walker: PageTableWalker, top: int, lo: int, hi: int):
    got, error = [], None
    try:
        for run in _reference_runs(walker, top * PAGE, lo, hi):
            got.append(run)
    except WalkBudgetExceeded as exc:
        error = str(exc)
    return got, error


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1 << 32), st.sampled_from([0, 0, 1, 5, 40]), st.integers(0, 1 << 47),
       st.integers(0, 1 << 47), st.sampled_from([50, 3000, 1 << 20, 1 << 20]), st.sampled_from([9, 200, 2000, 2000]))  # fmt: skip
def test_run_arrays_equal_runs(seed, corrupt, a, b, max_pages, max_tables):
    mem = _tables(random.Random(seed), corrupt)
    lo, hi = (0, 1 << 48) if a % 3 == 0 else (min(a, b), max(a, b))  # the whole user space (and past it), or a part
    want, want_error = _runs_until_budget(PageTableWalker(_reader(mem), max_tables, max_pages), 0, lo, hi)
    walker = PageTableWalker(_reader(mem), max_tables, max_pages)
    try:
        v, n, p = walker.run_arrays(0, lo, hi)
        error = None
    except WalkBudgetExceeded as exc:
        v, n, p = exc.partial
        error = str(exc)
    assert error == want_error
    assert list(zip(v.tolist(), n.tolist(), p.tolist())) == want


class _Kernel:
    def __init__(self, phys: PhysicalImage, mm) -> None:
        self.phys, self.mm = phys, mm


def _reference_chunks(space: SystemProcessSpace, runs: list[tuple[int, int, int]], in_file: bool):
    """The run-by-run location `_resident_chunks` did before it took arrays: (start, end, offset) and missing bytes."""
    locate = space.kernel.phys.file_offset if in_file else space.kernel.phys.physical_run
    chunks, missing, run = [], 0, None
    for vaddr, size, paddr in runs:
        pos = 0
        while pos < size:
            hit = locate(paddr + pos, size - pos)
            if hit is None:
                if run:
                    chunks.append(tuple(run))
                run = None
                missing += PAGE
                pos += PAGE
                continue
            foff, n = hit
            va = vaddr + pos
            if run is not None and run[1] == va and run[2] + (run[1] - run[0]) == foff:
                run[1] += n
            else:
                if run:
                    chunks.append(tuple(run))
                run = [va, va + n, foff]
            pos += n
    if run:
        chunks.append(tuple(run))
    return chunks, missing


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 64), st.integers(1, 24)), min_size=8, max_size=400),
       st.lists(st.tuples(st.integers(0, 96), st.integers(1, 40), st.integers(0, 1 << 20), st.booleans()), max_size=6),
       st.booleans())  # fmt: skip
def test_resident_chunks_equal_run_by_run_location(run_specs, seg_specs, in_file):
    """Runs (virtually in order, physically anywhere, often adjacent) located through segments that may end inside
    a run, overlap, hold no file bytes, or leave holes."""
    runs, va = [], 0x400000
    for frame, pages in run_specs:
        runs.append((va, pages * PAGE, frame * PAGE))
        va += pages * PAGE + (PAGE if frame % 3 == 0 else 0)  # some runs virtually adjacent, some not
    segments = [PhysSegment(s * PAGE, n * PAGE, off * PAGE if has_file else None) for s, n, off, has_file in seg_specs]
    phys = PhysicalImage(path=None, format="lime", size=1 << 40, segments=segments)  # type: ignore[arg-type]
    space = SystemProcessSpace.__new__(SystemProcessSpace)
    space.kernel = _Kernel(phys, object() if in_file else None)
    if not in_file:
        phys.avml = object()
    cols = np.array(runs, dtype=np.int64).reshape(-1, 3)
    space._translations = lambda *a: ((cols[:, 0], cols[:, 1], cols[:, 2]), None)  # type: ignore[method-assign]
    problems: list[str] = []
    got = space._resident_chunks(None, [], problems, "numpy")
    want, missing = _reference_chunks(space, runs, in_file)
    assert [(c.start, c.end, c._file_offset if in_file else c._phys) for c in got] == want
    said = [p for p in problems if "physical addresses the image does not hold" in p]
    assert said == ([f"{missing:,} bytes of this process's resident pages lie at physical addresses the image does "
                     "not hold (truncated image, or ranges the acquisition tool skipped)"] if missing else [])  # fmt: skip
