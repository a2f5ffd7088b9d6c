"""x86_64 4-level page tables walked a table at a time with numpy.

Volatility's Intel layer translates one page per Python call (about 25 µs a page here): fine for
plugins, but a model of a few GB is a million pages, and every one of them must be located to
make zen's chunks. This walker reads each page table as one 512-entry uint64 array from the mmap
of the image and finds present entries, frame numbers and physically contiguous runs with array
operations, so the cost is per table (one per 2 MiB of address space), not per page.

The semantics are Linux's, as Volatility's `LinuxIntel32e` implements them (and the tests compare
the two on real guests): an entry is present when _PAGE_PRESENT or _PAGE_PROTNONE is set;
PROT_NONE entries store the inverted frame number (L1TF mitigation); 1 GiB and 2 MiB pages end
the walk at the PDPT and PD levels; physical addresses have 46 bits.

Hostile tables (self-referencing, shared, or pointing outside the image) cost bounded work: each
walk stops after `max_tables` tables or `max_pages` pages and says so.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

PAGE = 4096
PRESENT, PSE, PROTNONE = 0x1, 0x80, 0x100
PHYS_MASK = (1 << 46) - 1
PFN_MASK = PHYS_MASK & ~(PAGE - 1)
# bits of the virtual address each level resolves, top down: PML4, PDPT, PD, PT
SHIFTS = (39, 30, 21, 12)
USER_TOP = 1 << 47


class WalkBudgetExceeded(Exception):
    """The tables would have us visit more than the budget allows: cyclic or forged tables."""


class PageTableWalker:
    """Resident pages of one address space (given its top-level table's physical address)."""

    def __init__(self, read_table: Callable[[int], np.ndarray | None], max_tables: int, max_pages: int) -> None:
        self._read = read_table  # physical address of a table -> 512 uint64 entries, or None
        self.max_tables, self.max_pages = max_tables, max_pages
        self.tables = 0
        self.pages = 0

    def run_arrays(self, pgd: int, start: int, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(virtual start, length, physical start) of the resident runs in [start, end), in order, as three int64
        arrays: a run is virtually and physically contiguous (runs that continue one another, within a table or across
        tables, are one). No Python per run: a process of a whole-machine image has tens of thousands of them (its
        pages are scattered in physical memory). Over budget, the WalkBudgetExceeded carries `partial`: the runs
        complete before the walk stopped (the one being merged then is left out). tests/test_pagetable_arrays.py
        keeps the run-at-a-time walk this replaced, as its reference."""
        end = min(end, USER_TOP)
        out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        if start >= end:
            return merge_arrays(out)
        try:
            self._walk_arrays(pgd & PFN_MASK, 0, 0, start, end, out)
        except WalkBudgetExceeded as exc:
            v, n, p = merge_arrays(out)
            exc.partial = (v[:-1], n[:-1], p[:-1])  # type: ignore[attr-defined]
            raise
        return merge_arrays(out)

    def _walk_arrays(self, table_phys: int, level: int, base: int, start: int, end: int, out: list) -> None:
        """One table's present entries: at the last level its runs (consecutive entries with consecutive frames) are
        appended to `out` as arrays; large pages end the walk above it; other entries are walked into, in order."""
        entries = self._table(table_phys)
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
        if not present.any():
            return
        frames = np.where((e & np.uint64(PRESENT)) != 0, e, ~e) & np.uint64(PFN_MASK)
        if level == 3:
            idx = np.arange(lo, hi, dtype=np.int64)[present]
            fr = frames[present].astype(np.int64)
            n = len(idx)
            self.pages += n
            if self.pages > self.max_pages:
                raise WalkBudgetExceeded(f"more than {self.max_pages:,} resident pages mapped")
            cut = np.flatnonzero((np.diff(idx) != 1) | (np.diff(fr) != PAGE)) + 1
            starts = np.concatenate(([0], cut))
            stops = np.concatenate((cut, [n]))
            out.append((base + idx[starts] * PAGE, (stops - starts) * PAGE, fr[starts]))
            return
        large = (e & np.uint64(PSE)) != 0 if level in (1, 2) else np.zeros(len(e), dtype=bool)
        for i in np.flatnonzero(present).tolist():
            vbase = base + (lo + i) * span
            frame = int(frames[i])
            if large[i]:
                frame &= ~(span - 1) & PHYS_MASK
                v0, v1 = max(vbase, start), min(vbase + span, end)
                self.pages += (v1 - v0 + PAGE - 1) // PAGE
                if self.pages > self.max_pages:
                    raise WalkBudgetExceeded(f"more than {self.max_pages:,} resident pages mapped")
                out.append((np.array([v0], np.int64), np.array([v1 - v0], np.int64), np.array([frame + (v0 - vbase)], np.int64)))
            else:
                self._walk_arrays(frame, level + 1, vbase, max(start, vbase), min(end, vbase + span), out)

    def _table(self, phys: int) -> np.ndarray | None:
        self.tables += 1
        if self.tables > self.max_tables:
            raise WalkBudgetExceeded(f"more than {self.max_tables:,} page tables visited")
        return self._read(phys)


def merge_arrays(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Runs given as arrays, in order, merged: a run that continues the one before it both virtually and physically
    joins it."""
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    v, n, p = (np.concatenate([part[k] for part in parts]) for k in range(3))
    if len(v) < 2:
        return v, n, p
    joins = (v[:-1] + n[:-1] == v[1:]) & (p[:-1] + n[:-1] == p[1:])
    heads = np.concatenate(([0], np.flatnonzero(~joins) + 1))
    return v[heads], np.add.reduceat(n, heads), p[heads]
