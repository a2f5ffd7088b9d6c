"""Bulk numpy scans and gathers over an address space.

Finding every object of a type means finding every aligned 8-byte word equal to the type's address
across hundreds of megabytes. Python loops cannot do that; numpy comparisons over mmap views do it
at memory bandwidth. Gathers read many small words at many addresses in one vectorised step, which
is how census candidates are validated without a Python-level read per object.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from zen import native
from zen.memory.space import RESIDENT_SOFT_LIMIT, AddressSpace, Chunk, resident_bytes
from zen.runtime.forking import cores

BLOCK = 16 << 20  # bytes compared per step: bounds the temporary arrays numpy allocates


U64_MAX = (1 << 64) - 1


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """`np.unique(a)` of a 1-d array. numpy 2's `unique` asks `np.ma.is_masked` and so imports numpy.ma (~15 ms) the
    first time, on the critical path of every recovery; sorting and dropping repeats is all this needs."""
    s = np.sort(a)
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def u64_array(values: Iterable[int] | np.ndarray) -> np.ndarray:
    """Addresses (or values read from an image) as a uint64 array. Python ints outside [0, 2^64) come from damaged
    evidence (a pointer read as signed, a sum past the top): they become 0, which no reader takes for an object."""
    if isinstance(values, np.ndarray):
        return values.astype(np.uint64, copy=False)
    seq = values if isinstance(values, (list, tuple)) else list(values)
    try:
        return np.fromiter(seq, dtype=np.uint64, count=len(seq))
    except OverflowError:
        return np.fromiter((v if 0 <= v <= U64_MAX else 0 for v in map(int, seq)), dtype=np.uint64, count=len(seq))


def _u64_blocks(start: int, arr: np.ndarray) -> Iterable[tuple[int, np.ndarray]]:
    """Split a chunk's bytes into 8-byte-aligned uint64 views of at most BLOCK bytes."""
    skip = (-start) % 8
    usable = (len(arr) - skip) // 8 * 8
    for pos in range(skip, skip + usable, BLOCK):
        end = min(pos + BLOCK, skip + usable)
        yield start + pos, arr[pos:end].view(np.uint64)


def select_chunks(space: AddressSpace, predicate: Callable[[Chunk], bool] | None = None) -> list[Chunk]:
    """Chunks whose region passes `predicate` (all chunks when None)."""
    if predicate is None:
        return list(space.chunks)
    return [c for c in space.chunks if predicate(c)]


def writable_chunks(space: AddressSpace) -> list[Chunk]:
    """Chunks of writable regions: where every Python heap object and every static object lives."""
    out = []
    for c in space.chunks:
        r = space.region_of(c.start)
        if r is None or r.writable:
            out.append(c)
    return out


def find_u64(space: AddressSpace, value: int, chunks: Sequence[Chunk] | None = None) -> np.ndarray:
    """Addresses of all 8-byte-aligned words equal to `value`, ascending."""
    want = np.uint64(value)
    found: list[np.ndarray] = []
    for start, arr in space.iter_arrays(chunks):
        for base, q in _u64_blocks(start, arr):
            hits = np.flatnonzero(q == want)
            if hits.size:
                found.append(np.uint64(base) + hits.astype(np.uint64) * np.uint64(8))
    return np.concatenate(found) if found else np.empty(0, dtype=np.uint64)


def find_u64_in(
    space: AddressSpace, values: Iterable[int], chunks: Sequence[Chunk] | None = None, *, keep: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Addresses of aligned words equal to any of `values`, and the value found at each.

    A cheap range test first discards almost every word; only survivors go through a sorted
    search, so the cost stays close to one pass over memory even for thousands of values. The
    values of a census (every type of a process) span the heap and the libraries, so most
    pointers pass the range test: a table of the values' low address bits (`_Sieve`) then drops
    nearly all of them before the search.
    """
    vals = sorted_unique(u64_array(values))
    if vals.size == 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64)
    lo, width = vals[0], vals[-1] - vals[0]
    sieve = _Sieve(vals) if vals.size >= _Sieve.MIN_VALUES else None
    addrs: list[np.ndarray] = []
    found: list[np.ndarray] = []
    if native.core is not None:  # the same words, each loaded once (native/scan.c)
        bits = sieve.bits() if sieve is not None else None
        search = native.core.u64_find
        for base, q, (idx, _) in _searched(space, chunks, keep, lambda q: search(q, vals, bits, 0, U64_MAX, 0)):
            _keep(base, q, idx, addrs, found)
        return _joined(addrs, found)
    work = _Work()
    for start, arr in space.iter_arrays(chunks, keep=keep):
        for base, q in _u64_blocks(start, arr):
            cand = np.flatnonzero(work.in_range(q, lo, width))  # one unsigned compare: lo <= q <= hi
            if not cand.size:
                continue
            if sieve is not None:
                cand = sieve.keep(q, cand)
            _match(base, q, cand, vals, addrs, found)
    return _joined(addrs, found)


# Worker threads of a compiled search with two cores or more: more threads than cores, because from
# a cold page cache they also wait for the disk, each on its own pages (on two cores, GPT-2's image
# cold: 4.56 s with two, 4.43 s with four; cached 3.94 / 3.75 s); at most eight, past which memory
# bandwidth, not cores, bounds it.
SCAN_THREADS = (4, 8)
SCAN_AHEAD = 128 << 20  # bytes handed to the workers ahead of the caller: what threading adds to zen's memory


def _searched(space: AddressSpace, chunks: Sequence[Chunk] | None, keep: bool,
              search: Callable[[np.ndarray], tuple]) -> Iterator[tuple[int, np.ndarray, tuple]]:  # fmt: skip
    """(base, block, search(block)) for every block of `chunks`, in address order.

    The compiled search releases the GIL, so with more than one core the blocks are searched by
    worker threads, a few blocks ahead of the caller, which meanwhile turns the results already
    in into arrays (a census searches the Python heap three times before anything else can run:
    on two cores 0.37 s of a GPT-2 recovery, with the second core idle). A piece's pages are
    released once its last block is consumed, as `iter_arrays` does; a search's error is raised
    where its block is consumed, as it was in one thread."""
    n = cores()
    workers = min(max(n, SCAN_THREADS[0]), SCAN_THREADS[1]) if n >= 2 else 1
    if workers < 2:
        for start, arr in space.iter_arrays(chunks, keep=keep):
            for base, q in _u64_blocks(start, arr):
                yield base, q, search(q)
        return
    pending: deque = deque()  # (blocks with their futures, the piece's release, its size), oldest first
    queued = 0  # bytes
    with ThreadPoolExecutor(workers, thread_name_prefix="zen-scan") as pool:
        try:
            for start, arr, done in space.iter_pieces(chunks, keep=keep):
                blocks = [(base, q, pool.submit(search, q)) for base, q in _u64_blocks(start, arr)]
                pending.append((blocks, done, arr.nbytes))
                queued += arr.nbytes
                while pending and queued > SCAN_AHEAD:
                    blocks, done, size = pending.popleft()
                    queued -= size
                    yield from _finished(blocks, done)
            while pending:
                blocks, done, _ = pending.popleft()
                yield from _finished(blocks, done)
        finally:  # an error or an interrupted caller: the queued searches are dropped, not awaited
            for blocks, _, _ in pending:
                for _, _, f in blocks:
                    f.cancel()


def _finished(blocks: list, done: Callable[[], None]) -> Iterator[tuple[int, np.ndarray, tuple]]:
    for base, q, f in blocks:
        yield base, q, f.result()
    done()


def _keep(base: int, q: np.ndarray, idx: bytes, addrs: list, found: list) -> None:
    """The compiled search's hits (int64 word indexes into `q`) as `_match` keeps them."""
    if idx:
        at = np.frombuffer(idx, dtype=np.int64)
        addrs.append(np.uint64(base) + at.astype(np.uint64) * np.uint64(8))
        found.append(q[at])


def _joined(addrs: list, found: list) -> tuple[np.ndarray, np.ndarray]:
    if not addrs:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64)
    return np.concatenate(addrs), np.concatenate(found)


class _Work:
    """Scratch arrays of one scan, reused for every block.

    A fresh temporary per block and per operation would be a new 16 MB allocation each time,
    zero-filled page by page by the kernel: on a multi-GB image that is more system time than
    the comparisons themselves."""

    def __init__(self) -> None:
        self._diff = np.empty(BLOCK // 8, dtype=np.uint64)
        self._mask = np.empty(BLOCK // 8, dtype=bool)
        self._mask2 = np.empty(BLOCK // 8, dtype=bool)

    def in_range(self, q: np.ndarray, lo: np.uint64, width: np.uint64, out: str = "mask") -> np.ndarray:
        """Mask of words in [lo, lo + width]: q - lo wraps around below lo (unsigned)."""
        n = q.size
        diff, mask = self._diff[:n], (self._mask if out == "mask" else self._mask2)[:n]
        np.subtract(q, lo, out=diff)
        return np.less_equal(diff, width, out=mask)


class _Sieve:
    """Membership pre-test for many values: a bit per value of bits 3..3+BITS of its address
    (aligned words have zeros below). A word whose entry is unset is none of the values; of the
    rest (about values / 2**BITS of the others) `_match` keeps the real ones."""

    BITS = 20
    MIN_VALUES = 32

    def __init__(self, vals: np.ndarray) -> None:
        self.mask = np.uint64((1 << self.BITS) - 1)
        self.table = np.zeros(1 << self.BITS, dtype=bool)
        self.table[((vals >> np.uint64(3)) & self.mask).astype(np.intp)] = True

    def bits(self) -> bytes:
        """The table as a bitset (bit i of byte i // 8, least significant first): the compiled search's form."""
        return np.packbits(self.table, bitorder="little").tobytes()

    def keep(self, q: np.ndarray, cand: np.ndarray) -> np.ndarray:
        words = q[cand]
        return cand[self.table[((words >> np.uint64(3)) & self.mask).astype(np.intp)]]


def _match(base: int, q: np.ndarray, cand: np.ndarray, vals: np.ndarray, addrs: list, found: list) -> None:
    """Keep the candidate words that are one of `vals` (sorted): their addresses and values."""
    words = q[cand]
    idx = np.searchsorted(vals, words)
    idx[idx == vals.size] = 0
    ok = vals[idx] == words
    if ok.any():
        addrs.append(np.uint64(base) + cand[ok].astype(np.uint64) * np.uint64(8))
        found.append(words[ok])


MAP_BLOCK = 1 << 16  # bytes per entry of a pointer map (see `find_u64_in_mapped`)


def find_u64_in_mapped(
    space: AddressSpace, values: Iterable[int], chunks: Sequence[Chunk], lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """`find_u64_in`, and in the same pass a *pointer map*: the address ranges (in MAP_BLOCK
    pieces, adjacent ones merged) that hold at least one aligned word in [lo, hi].

    Every object starts with a pointer to its type, so a later search for objects of types
    within [lo, hi] only needs these ranges. Tensor data never do (a float32 pair reads as a
    user-space pointer only when the upper float is a denormal; bf16 and fp16 quads only when one
    value is a zero and the next a huge number): on a process serving billions of parameters the
    later passes read the Python heap, not the weights."""
    vals = sorted_unique(u64_array(values))
    vlo, vwidth = (vals[0], vals[-1] - vals[0]) if vals.size else (np.uint64(1), np.uint64(0))
    plo, pwidth = np.uint64(lo), np.uint64(hi - lo)
    words = MAP_BLOCK // 8
    work = _Work()
    addrs: list[np.ndarray] = []
    found: list[np.ndarray] = []
    ranges: list[tuple[int, int]] = []
    if native.core is not None:  # the same marks and hits in one load of each word (native/scan.c)
        search, span = native.core.u64_find, (int(plo), int(pwidth))
        for base, q, (idx, marks) in _searched(space, chunks, False, lambda q: search(q, vals, None, *span, words)):
            _add_ranges(ranges, base, np.flatnonzero(np.frombuffer(marks, dtype=np.uint8)).tolist(), words, q.size)
            _keep(base, q, idx, addrs, found)
        return (*_joined(addrs, found), ranges)
    for start, arr in space.iter_arrays(chunks):
        for base, q in _u64_blocks(start, arr):
            inside = work.in_range(q, plo, pwidth)
            n = q.size
            full = n // words * words
            marks = inside[:full].reshape(-1, words).any(axis=1).tolist()
            if full < n:
                marks.append(bool(inside[full:].any()))
            hit = np.flatnonzero(marks).tolist()
            _add_ranges(ranges, base, hit, words, n)
            if not vals.size or not hit:  # no word in [lo, hi]: none of the values either
                continue
            cand = work.in_range(q, vlo, vwidth, out="mask2")
            cand &= inside
            cand = np.flatnonzero(cand)
            if cand.size:
                _match(base, q, cand, vals, addrs, found)
    return (*_joined(addrs, found), ranges)


def _add_ranges(ranges: list[tuple[int, int]], base: int, hit: list[int], words: int, n: int) -> None:
    """The pointer map's pieces `hit` of a block at `base` (n words), adjacent ones merged."""
    for i in hit:
        a, b = base + i * MAP_BLOCK, base + min((i + 1) * words, n) * 8
        if ranges and ranges[-1][1] == a:
            ranges[-1] = (ranges[-1][0], b)
        else:
            ranges.append((a, b))


def find_u64_in_ranges(
    space: AddressSpace, values: Iterable[int], ranges: Sequence[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """`find_u64_in` over address ranges (a pointer map) instead of whole chunks. The ranges are
    the Python heap, which the object readers go on to read: its pages stay resident (while zen's
    resident set is under `RESIDENT_SOFT_LIMIT`) instead of being faulted in again."""
    return find_u64_in(space, values, pieces_of(space, ranges), keep=True)


def pieces_of(space: AddressSpace, ranges: Sequence[tuple[int, int]]) -> list:
    """The chunks covering `ranges`, clipped to them: a chunk wholly inside a range is itself, one
    cut by a range's ends a `Slice` of it. Each range is one search (`run_from`): a
    whole-machine process's Python heap is tens of thousands of one-page chunks. Where a range
    meets a gap (memory not captured) the rest of it is left out, as a read would stop there."""
    out: list = []
    for a, b in ranges:
        for c in space.run_from(a, b):
            lo, hi = max(a, c.start), min(b, c.end)
            out.append(c if lo == c.start and hi == c.end else Slice(c, lo, hi))
    return out


class Slice:
    """A piece of a chunk, scanned like a chunk (its pages released after the scan as usual)."""

    __slots__ = ("start", "end", "_c")

    def __init__(self, chunk: Chunk, start: int, end: int) -> None:
        self._c, self.start, self.end = chunk, start, end

    def array(self) -> np.ndarray:
        return self._c.array()[self.start - self._c.start : self.end - self._c.start]

    def view(self, offset: int, size: int):
        return self._c.view(self.start - self._c.start + offset, size)

    def release(self, offset: int = 0, size: int | None = None) -> None:
        size = self.end - self.start - offset if size is None else size
        self._c.release(self.start - self._c.start + offset, size)


def gather_u64(space: AddressSpace, addrs: np.ndarray, *, missing: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Read the 8-byte little-endian word at each address, vectorised.

    Returns (values, ok): `ok[i]` is False where the 8 bytes are not all inside one chunk, in which
    case `values[i]` is `missing`. Addresses are mapped to chunks with one search, then to their
    offsets in the chunk's backing buffer (the image's mmap, a file on disk), and each buffer is
    indexed once: a whole-machine image's tens of thousands of page-sized chunks cost no more
    than a core's few hundred mappings.
    """
    addrs = u64_array(addrs)
    out = np.full(addrs.shape, missing, dtype=np.uint64)
    ok = np.zeros(addrs.shape, dtype=bool)
    if addrs.size == 0 or not space.chunks:
        return out, ok
    starts, ends, ids, offs, buffers = space.chunk_table()
    which = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1
    inside = which >= 0
    w = np.where(inside, which, 0)
    rel = addrs - starts[w]  # no wrap-around: starts[w] <= addr wherever `inside`
    size = ends[w] - starts[w]
    inside &= (rel < size) & (size - rel >= np.uint64(8))
    bid = ids[w]
    backed = inside & (bid >= 0)
    _read_words(buffers, bid, offs[w] + rel.astype(np.int64), backed, out)
    ok |= backed
    rest = np.flatnonzero(inside & ~backed)
    if rest.size:
        _gather_unbacked(space, addrs, w, rest, out, ok)
    return out, ok


class Located:
    """Addresses looked up once in the chunk table, so that words at small offsets from each (the
    fields of an object) are read without searching again: `gather_u64` searches the chunk table
    for every address it is given, and census readers ask for several fields of the same objects.

    `u64(offset)` is exactly `gather_u64(space, addrs + offset)`: where [addr, addr + span) is
    not inside one buffered chunk, that address is read by `gather_u64` itself."""

    def __init__(self, space: AddressSpace, addrs: np.ndarray, span: int) -> None:
        self.space, self.addrs, self.span = space, u64_array(addrs), span
        starts, ends, ids, offs, self.buffers = space.chunk_table()
        n = self.addrs.size
        if not n or not space.chunks:
            self.ok = np.zeros(n, dtype=bool)
            self.bid = np.full(n, -1, dtype=np.int64)
            self.pos = np.zeros(n, dtype=np.int64)
            return
        which = np.searchsorted(starts, self.addrs, side="right").astype(np.int64) - 1
        w = np.maximum(which, 0)
        rel = self.addrs - starts[w]
        size = ends[w] - starts[w]
        self.bid = ids[w]
        self.ok = (which >= 0) & (rel < size) & (size - rel >= np.uint64(span)) & (self.bid >= 0)
        self.pos = offs[w] + rel.astype(np.int64)

    def u64(self, offset: int, *, missing: int = 0) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= offset <= self.span - 8:
            return gather_u64(self.space, self.addrs + np.uint64(offset), missing=missing)
        out = np.full(self.addrs.shape, missing, dtype=np.uint64)
        ok = self.ok.copy()
        _read_words(self.buffers, self.bid, self.pos + offset, ok, out)
        rest = np.flatnonzero(~self.ok)
        if rest.size:  # not located within `span`: as gather_u64 reads them
            out[rest], ok[rest] = gather_u64(self.space, self.addrs[rest] + np.uint64(offset), missing=missing)
        return out, ok


def _read_words(buffers: Sequence, bid: np.ndarray, pos: np.ndarray, sel_mask: np.ndarray, out: np.ndarray) -> None:
    """out[i] = the little-endian word at byte `pos[i]` of buffer `bid[i]`, wherever `sel_mask`
    (the caller has checked that all 8 bytes lie in the buffer). Each buffer used is indexed once
    (a core file has one, its mmap: the buffers are counted, not sorted)."""
    many = len(buffers) > 1
    used = np.flatnonzero(np.bincount(bid[sel_mask], minlength=len(buffers))) if many else range(len(buffers))
    for b in used:
        sel = np.flatnonzero(sel_mask & (bid == b)) if many else np.flatnonzero(sel_mask)
        if not sel.size:
            continue
        buf = np.frombuffer(buffers[b], dtype=np.uint8)
        p = pos[sel]
        if not (p & 7).any():
            out[sel] = buf[: len(buf) // 8 * 8].view("<u8")[p >> 3]
        else:
            out[sel] = buf[p[:, None] + np.arange(8, dtype=np.int64)].view("<u8").reshape(-1)
        _drop_resident(buffers[b])


def _drop_resident(buf) -> None:
    """Gathers touch pages all over an image: do not let them grow zen's resident set without bound.

    Dropping every page of the image after each gather kept the resident set small but made the
    next gather (and every object read after it) fault all its pages in again: a census of a
    transformers process gathers a few hundred times, and the page faults cost more than the
    gathers. The pages a gather touches are the Python heap's, a few hundred MB at most, so they
    are dropped only once zen's resident set passes `RESIDENT_SOFT_LIMIT` (bulk passes over
    tensor data release their pages as they go, `Chunk.release`)."""
    import mmap

    if not isinstance(buf, mmap.mmap):
        return
    now = time.monotonic()
    if now - _checked[0] < RESIDENT_CHECK_INTERVAL:  # a gather touches a few MB at most: look now and then
        return
    _checked[0] = now
    if resident_bytes() > RESIDENT_SOFT_LIMIT:
        try:
            buf.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError, AttributeError):
            pass


RESIDENT_CHECK_INTERVAL = 0.05  # seconds between two looks at the resident set
_checked = [0.0]


def _gather_unbacked(space: AddressSpace, addrs, which, sel_all, out, ok) -> None:
    """Chunks without a buffer (live processes, layers read through Volatility): per chunk."""
    chunks = space.chunks
    order = sel_all[np.argsort(which[sel_all], kind="stable")]
    bounds = np.flatnonzero(np.diff(which[order])) + 1
    for group in np.split(order, bounds):
        c = chunks[int(which[group[0]])]
        arr = c.array()
        offs = (addrs[group] - np.uint64(c.start)).astype(np.int64)  # checked inside the chunk
        out[group] = arr[offs[:, None] + np.arange(8, dtype=np.int64)].view("<u8").reshape(-1)
        ok[group] = True
