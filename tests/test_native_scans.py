"""The compiled searches over image memory (issue 50) answer exactly what their references answer: the census' word
search (`zen.memory.scan`: which aligned words equal one of many type addresses) and the whole-machine scan for the
kernel's banner and init_task's signature (`zen.memory.system.kernel`), on a real transformers process image, on
hostile blocks and on files built to put hits across every window boundary."""

from __future__ import annotations

import random

import pytest
from conftest import opened_heap

from zen import native

needs_core = pytest.mark.skipif(native.core is None, reason=f"compiled core not loaded: {native.why}")


def _words_oracle(q, vals, plo, pwidth, mark):
    """What the word search must answer, by numpy's set membership (a third way, not the reference's passes)."""
    import numpy as np

    inside = (q - np.uint64(plo)) <= np.uint64(pwidth)
    idx = np.flatnonzero(inside & np.isin(q, vals))
    marks = [bool(inside[i : i + mark].any()) for i in range(0, q.size, mark)] if mark else None
    return idx.tolist(), marks


@needs_core
def test_word_search_equals_numpy_on_hostile_words():
    """Blocks of words at the values, one off them, at 0 and 2**64-1, wrapping the range tests; views at every
    alignment; with and without the sieve; map pieces that do not divide the block. Inconsistent arguments are
    refused, not read."""
    import numpy as np

    from zen.memory.scan import U64_MAX, _Sieve

    rng = np.random.default_rng(11)
    for trial in range(60):
        vals = np.unique(rng.integers(1 << 40, 1 << 47, size=int(rng.integers(1, 200)), dtype=np.uint64))
        if trial % 7 == 0:
            vals = np.unique(np.concatenate([vals, np.array([0, U64_MAX], dtype=np.uint64)]))
        pool = np.concatenate([vals, vals + np.uint64(1), vals - np.uint64(1), vals + np.uint64(8),
                               np.array([0, 1, U64_MAX, U64_MAX - 1], dtype=np.uint64)])  # fmt: skip
        n = int(rng.integers(0, 5000))
        q = np.where(rng.random(n) < 0.3, rng.choice(pool, n), rng.integers(0, U64_MAX, n, dtype=np.uint64, endpoint=True))
        off = trial % 8
        raw = np.zeros(n * 8 + off, dtype=np.uint8)
        raw[off:] = q.view(np.uint8)
        view = raw[off:].view(np.uint64) if off == 0 else np.frombuffer(raw.tobytes()[off:], dtype=np.uint64)
        sieve = _Sieve(vals).bits() if trial % 2 else None
        plo, pwidth = (0, U64_MAX) if trial % 3 == 0 else (int(vals[0]) - 16, int(vals[-1] - vals[0]) // 2)
        plo %= 1 << 64
        mark = (0, 1, 7, 8192)[trial % 4]
        got_idx, got_marks = native.core.u64_find(view, vals, sieve, plo, pwidth, mark)
        want_idx, want_marks = _words_oracle(q, vals, plo, pwidth, mark)
        assert np.frombuffer(got_idx, dtype=np.int64).tolist() == want_idx, trial
        assert (None if got_marks is None else [bool(b) for b in got_marks]) == want_marks, trial
    q = np.arange(16, dtype=np.uint64)
    for bad in ((q, q[::-1].copy(), None), (q, q, b"\x01" * 3), (q.view(np.uint8)[:9], q, None)):
        with pytest.raises(ValueError):
            native.core.u64_find(*bad, 0, U64_MAX, 0)


@needs_core
def test_word_search_equals_reference_on_an_image(hf_image, monkeypatch):
    """find_u64_in and find_u64_in_mapped over a transformers process's writable memory, compiled and reference:
    the same addresses, values and pointer map for every type of the process (the sieve's case), one type, values
    that are nowhere, and none."""
    from zen.memory import scan

    with opened_heap(hf_image[0]) as (ip, heap):
        chunks = scan.writable_chunks(heap.space)
        types = heap.all_types()
        lo, hi = min(types), max(types)
        heap_pieces = scan.pieces_of(heap.space, heap._memo["pointer_map"])  # what later searches read
        plain = (types, [ip.wk.types["type"]], [0, 8, scan.U64_MAX, lo - 8])
        for search, sets in ((scan.find_u64_in, plain), (scan.find_u64_in_mapped, (types, []))):
            for vals in sets:
                if search is scan.find_u64_in:
                    args = (heap.space, vals, heap_pieces)
                else:
                    args = (heap.space, vals, chunks, lo, hi)
                with monkeypatch.context() as m:
                    m.setattr(native, "core", None)
                    want = search(*args)
                # the compiled search in one thread (one core), in worker threads (two cores: four), and in eight
                # with 1 MB handed ahead, so that blocks wait, pieces are released and the window turns many times
                for cores, ahead in ((1, scan.SCAN_AHEAD), (2, scan.SCAN_AHEAD), (16, 1 << 20)):
                    with monkeypatch.context() as m:
                        m.setattr(scan, "cores", lambda n=cores: n)
                        m.setattr(scan, "SCAN_AHEAD", ahead)
                        got = search(*args)
                    for g, w in zip(got[:2], want[:2]):
                        assert g.dtype == w.dtype and g.tolist() == w.tolist(), (search.__name__, len(vals), cores)
                    assert got[2:] == want[2:]
                    assert len(got[0]) > len(types) or vals is not types
        assert got[2], "the pointer map is empty"


def test_threaded_search_answers_in_order_and_stops_on_an_error(monkeypatch):
    """The threaded search hands back every block's answer in address order, releases each piece once, after its
    blocks were consumed, and raises a worker's error where its block is consumed: no block after it is handed
    back, and no worker thread outlives the search."""
    import threading

    import numpy as np

    from zen.memory import scan
    from zen.memory.regions import Region
    from zen.memory.space import AddressSpace, BytesChunk

    base, piece = 0x10000, 1 << 16
    chunks = [BytesChunk(base + i * 2 * piece, np.full(piece // 8, i, dtype=np.uint64).tobytes()) for i in range(40)]
    space = AddressSpace([Region(base, base + 80 * piece, "rw-p", "")], chunks)
    monkeypatch.setattr(scan, "cores", lambda: 16)
    monkeypatch.setattr(scan, "SCAN_AHEAD", 3 * piece)
    released = []
    real = space.iter_pieces

    def pieces(*a, **k):
        for start, arr, done in real(*a, **k):
            yield start, arr, (lambda d=done, s=start: (released.append(s), d()))

    monkeypatch.setattr(space, "iter_pieces", pieces)
    before = threading.active_count()
    got = [(b, int(r)) for b, _, r in scan._searched(space, None, False, lambda q: q[0])]  # noqa: SLF001
    assert got == [(c.start, i) for i, c in enumerate(chunks)]
    assert released == [c.start for c in chunks]

    def search(q):
        if q[0] == 7:
            raise ValueError("block 7")
        return q[0]

    seen = []
    with pytest.raises(ValueError, match="block 7"):
        for b, _, _ in scan._searched(space, None, False, search):  # noqa: SLF001
            seen.append(b)
    assert seen == [c.start for c in chunks[:7]]
    assert threading.active_count() == before


@needs_core
def test_find_all_equals_bytes_find():
    """Overlapping and adjacent needles, needles at both ends and across the window's ends, windows past the buffer,
    the cap on hits; an empty needle is refused."""
    from zen.memory.system import kernel

    rng = random.Random(5)
    for trial in range(400):
        alphabet = b"sw\x00ap" if trial % 2 else b"Linux v"
        size = rng.randrange(0, 300) if trial % 3 else rng.randrange(0, 3000)  # the 16-byte steps and the tail
        data = bytes(rng.choice(alphabet) for _ in range(size))
        needle = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 4) if trial % 5 else rng.randrange(1, 20)))
        if trial % 7 == 0 and len(data) > 40:  # a long needle that is there, overlapping copies of it
            needle = data[10:30]
        lo, hi, most = rng.randrange(-5, size + 10), rng.randrange(-5, size + 20), rng.randrange(0, 40)
        got = native.core.find_all(data, needle, lo, hi, most)
        native_core, native.core = native.core, None
        try:
            want = kernel._find_all(data, needle, lo, hi, most)
        finally:
            native.core = native_core
        assert got == want, (trial, data, needle, lo, hi, most)
    for bad in ((b"", 0, 3, 5), (b"a", 0, 3, -1), (b"a", 0, 3, 1 << 25)):
        with pytest.raises(ValueError):
            native.core.find_all(b"abc", *bad)


@needs_core
def test_find_many_equals_find_all_per_needle():
    """find_many: for each needle exactly what find_all (and the pure loop) gives it with its own end and cap, however
    many needles (1-8), whether they share first and last bytes (one candidate mask) or form more than three groups
    (no shared loop), and when one needle's cap is reached in the middle of a 16-byte step."""
    from zen.memory.system import kernel

    rng = random.Random(11)
    for trial in range(3000):
        alphabet = (b"sw\x00ap", b"Linux v", b"ab")[trial % 3]
        size = rng.randrange(0, 300) if trial % 3 else rng.randrange(0, 3000)
        data = bytes(rng.choice(alphabet) for _ in range(size))
        k = rng.randrange(1, 9)
        needles = tuple(bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 4) if trial % 5 else rng.randrange(1, 20)))
                        for _ in range(k))  # fmt: skip
        lo = rng.randrange(-5, size + 10)
        ends = tuple(rng.randrange(-5, size + 20) for _ in range(k))
        mosts = tuple(rng.randrange(0, 6) if trial % 2 else rng.randrange(0, 40) for _ in range(k))
        got = native.core.find_many(data, needles, lo, ends, mosts)
        assert got == tuple(native.core.find_all(data, n, lo, e, m) for n, e, m in zip(needles, ends, mosts))
        native_core, native.core = native.core, None
        try:
            want = tuple(kernel._find_all(data, n, lo, e, m) for n, e, m in zip(needles, ends, mosts))
        finally:
            native.core = native_core
        assert got == want, (trial, data, needles, lo, ends, mosts)
    for bad in (((), 0, (), ()), ((b"a",) * 9, 0, (3,) * 9, (1,) * 9), ((b"",), 0, (3,), (1,)), ((b"a",), 0, (3,), (-1,)),
                ((b"a",), 0, (3, 4), (1,)), ((b"a",), 0, (3,), (1 << 25,))):  # fmt: skip
        with pytest.raises(ValueError):
            native.core.find_many(b"abc", *bad)
    with pytest.raises(TypeError):
        native.core.find_many(b"abc", ("a",), 0, (3,), (1,))


@needs_core
def test_kernel_signature_scan_equals_reference(tmp_path, monkeypatch):
    """Banners and init_task signatures across small windows (each boundary crossed by one), against the pure
    search and, for the signatures, a whole-file regex: the same banners in the same order, the same offsets."""
    import mmap

    from zen.memory.system import kernel

    monkeypatch.setattr(kernel, "SCAN_WINDOW", 4096)
    rng = random.Random(9)
    data = bytearray(rng.randbytes(64 * 4096))
    banner = b"Linux version 6.1.0-57-amd64 (debian) #1 SMP\n\x00"
    for at in (0, 4096 - 5, 3 * 4096 - len(banner) + 3, 10_000, 20_000, 40_000):
        data[at : at + len(banner)] = banner
    data[50_000:50_030] = b"Linux version 5.10.0-9 (other)\n\x00"
    for at in (4096 - 7, 2 * 4096, 5 * 4096 - 15, 30_001, 60_000):
        data[at : at + 15] = b"swapper/0" + b"\x00" * 6 if at % 2 else b"swapper" + b"\x00" * 8
    data[61_000:61_015] = b"swapper/1" + b"\x00" * 6  # another CPU's idle task: not the signature
    path = tmp_path / "phys.raw"
    path.write_bytes(bytes(data))
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        extents = [(0, 30_000), (30_000, len(data))]
        got = kernel.scan_image(mm, extents)
        monkeypatch.setattr(native, "core", None)
        want = kernel.scan_image(mm, extents)
    assert got == want
    assert got[1] == [m.start() for m in kernel._SWAPPER_RE.finditer(bytes(data))]
    assert got[0][0].startswith(b"Linux version 6.1.0-57") and got[0][1].startswith(b"Linux version 5.10")


@needs_core
def test_kernel_signature_scan_capped_and_near_misses(tmp_path, monkeypatch):
    """More signatures than the cap, in both spellings, across window ends, among windows full of near-misses
    ("swapper" alone, "swapper/1"): the first MAX_SWAPPER_HITS matches in file order, as a whole-file regex finds
    them, compiled and pure."""
    import mmap

    from zen.memory.system import kernel

    monkeypatch.setattr(kernel, "SCAN_WINDOW", 4096)
    monkeypatch.setattr(kernel, "MAX_SWAPPER_HITS", 7)
    data = bytearray(b"swapper" * (6 * 4096 // 7 + 1))[: 6 * 4096]
    for k, at in enumerate((4096 - 15, 4096 - 8, 4096, 2 * 4096 - 3, 2 * 4096 + 40, 3 * 4096 - 15, 3 * 4096 + 1,
                            4 * 4096 - 7, 5 * 4096, 5 * 4096 + 200)):  # fmt: skip
        data[at : at + 15] = kernel.SWAPPER_SIGNATURES[k % 2]
    data[100:115] = b"swapper/1" + b"\x00" * 6
    path = tmp_path / "near.raw"
    path.write_bytes(bytes(data))
    want = [m.start() for m in kernel._SWAPPER_RE.finditer(bytes(data))][:7]
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        got = kernel.scan_image(mm, None)[1]
        monkeypatch.setattr(native, "core", None)
        pure = kernel.scan_image(mm, None)[1]
    assert got == pure == want and len(want) == 7
