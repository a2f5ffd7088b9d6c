"""Asking the kernel for the pages around many scattered addresses at once, before reading them.

A reader that follows pointers one at a time (`sys.modules`: ~3,000 module names scattered over the
Python heap) waits for the disk at every first touch of a page when the image is not in the page
cache: one read after another. Advised first (`madvise(MADV_WILLNEED)` on the image's mmap, which
queues the reads and returns), the same reads are in flight together and the reader then finds
most pages there. On a GPT-2 process image read from a cold cache, `sys.modules` took 0.26 s of
waiting for 3,065 keys, 0.09 s advised first (943 windows asked for in 0.036 s); from the page cache
the advice costs ~0.014 s. Only buffers that are mmaps are advised: other spaces (a live process, a
whole-machine image's layers) read as before.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable

import numpy as np

from zen.memory.scan import sorted_unique
from zen.memory.space import AddressSpace

WINDOW = 64 << 10  # bytes asked for around each address (a page and its neighbours: objects allocated together)
MAX_WINDOWS = 20_000  # at most this many requests per call: a hostile table cannot make zen issue millions


def prefetch(space: AddressSpace, addrs: Iterable[int], window: int = WINDOW) -> int:
    """Advise the windows of the image's mmap around `addrs` (addresses outside it are skipped);
    returns how many were asked for. Never reads the pages itself and never fails: advice only."""
    if not hasattr(mmap, "MADV_WILLNEED") or not space.chunks:
        return 0
    a = np.fromiter((x for x in addrs if 0 <= x < 1 << 64), dtype=np.uint64)
    if not a.size:
        return 0
    starts, ends, ids, offs, buffers = space.chunk_table()
    which = np.searchsorted(starts, a, side="right").astype(np.int64) - 1
    ok = which >= 0
    w = np.maximum(which, 0)
    ok &= (a < ends[w]) & (ids[w] >= 0)
    bid = ids[w][ok]
    pos = offs[w][ok] + (a[ok] - starts[w][ok]).astype(np.int64)
    asked = 0
    for b in sorted_unique(bid).tolist():
        buf = buffers[b]
        if not isinstance(buf, mmap.mmap):
            continue
        for p in sorted_unique(pos[bid == b] // window * window).tolist()[: MAX_WINDOWS - asked]:
            try:
                _advise(buf, p, min(window, len(buf) - p))
            except (OSError, ValueError):
                return asked
            asked += 1
    return asked


def _advise(buf: mmap.mmap, start: int, length: int) -> None:
    buf.madvise(mmap.MADV_WILLNEED, start, length)
