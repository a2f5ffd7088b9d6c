"""Each listing hash's library entries as one posting: candidate selection's index (schema 6).

Algorithm 1 starts by counting, for every library entry, how many of the query's distinct code listings it also
stores. From `code_hashes` that is one row per (hash, entry) pair: a transformers query (~4,200 listings) against
1,000 entries, a quarter of them of its family, reads 0.9 M rows of the covering index, 0.45 s alone and 0.63 s
beside the case check on two cores; at 1,000 entries that query was the longest path of `zen attribute`. A
posting holds a hash's entries as one sorted array of distinct model ids (little-endian uint32: an entry's id is
below 2^32, `post` checks), so the count reads one row per hash of the query and adds the arrays up in numpy.

The postings are kept by the library's writes, inside their transaction and under its write lock (`Library.add`,
`Library._delete`: SQLite's BEGIN IMMEDIATE, PostgreSQL's advisory lock), so a read-modify-write of a row never
races another writer; readers see them in the same snapshot as the rows they index. A library of an older
schema gets them from its stored rows when it is opened (`build`). The row count (`code_hashes`) stays the
reference: the tests compare the two after adds, replacements, removals and a migration.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import groupby

from zen.library.errors import LibraryError

CHUNK = 500  # hashes per statement (SQLite's default limit of bound parameters is 999 on old builds)
REBUILD = "restore the library from a backup, or export its entries and import them into a new one"
BINCOUNT_BELOW = 1 << 24  # model ids below this are counted with bincount (memory: 8 bytes per id up to the largest)
ID = "<u4"  # a model id in a posting (4 bytes: a transformers query at 1,000 entries reads 4 MB of them, as 8 MB of hex)
ID_BYTES = 4


def _np():
    import numpy as np  # here: the library's other commands (list, show, add from a server) do not need numpy

    return np


def _ids(lib, blob) -> object:
    """A stored posting as an array of ids; a length that is not a whole number of ids is a damaged library."""
    data = bytes(blob)
    if len(data) % ID_BYTES:
        raise _damaged(lib, f"a posting of {len(data)} bytes")
    return _np().frombuffer(data, dtype=ID)


def counts(lib, hashes: Iterable[str]) -> dict[int, int]:
    """model id -> how many of `hashes` (distinct) its entry stores as a listing hash.

    One statement for as many hashes as the engine binds (a transformers query's ~4,200 in one), its postings
    back as one row (their hex joined, with the number of damaged ones): `zen attribute` runs this in a thread
    beside the case check, whose parse of pr.json holds the GIL 0.2 s at a time, and this thread needs the GIL
    back after every statement and every row (0.32-0.36 s in nine statements of 500, where the work alone
    takes 0.03-0.05 s). A posting is trusted no more than the rows were: one longer than the library has entries
    or not a whole number of ids is left in the file (never read into memory), one whose ids are not strictly
    increasing is refused here (repeated ids would count one listing twice), and any of them is an error."""
    np = _np()
    hashes = sorted(set(hashes))
    (entries,) = lib.query("SELECT COUNT(*) FROM models").fetchone()
    most = ID_BYTES * max(1, int(entries))
    # (no "%" operator: PostgreSQL's driver would read it as a placeholder; `most` is this function's own number)
    ok = f"length(models) <= {most} AND length(models) = length(models) / {ID_BYTES} * {ID_BYTES}"
    texts, step = [], max(CHUNK, lib.max_params())
    for i in range(0, len(hashes), step):
        part = hashes[i : i + step]
        q = (f"SELECT {lib.HEX_AGG.format(ok=ok)}, SUM(CASE WHEN {ok} THEN 0 ELSE 1 END) FROM listing_postings "
             f"WHERE hash IN ({','.join('?' * len(part))})")  # fmt: skip
        text, damaged = lib.query(q, part).fetchone()
        if damaged:
            raise _damaged(lib, f"{damaged} posting(s) longer than the library's {entries:,} entries or not a whole "
                                "number of ids")  # fmt: skip
        texts.append(text or "")
    text = " ".join(t for t in texts if t)
    ids = np.frombuffer(bytes.fromhex(text), dtype=ID)  # (fromhex skips the spaces between postings)
    if not len(ids):
        return {}
    starts = np.cumsum([len(t) // (2 * ID_BYTES) for t in text.split(" ")])[:-1]  # where each posting but the first begins
    rising = np.diff(ids.astype(np.int64)) > 0
    starts = starts[(starts > 0) & (starts < len(ids))]
    rising[starts - 1] = True  # (one posting's last id and the next one's first)
    if not rising.all():
        raise _damaged(lib, "a posting whose ids are not strictly increasing")
    if ids.max() < BINCOUNT_BELOW:
        per = np.bincount(ids)
        found = np.flatnonzero(per)
        return dict(zip(found.tolist(), per[found].tolist()))
    found, n = np.unique(ids, return_counts=True)
    return dict(zip(found.tolist(), n.tolist()))


def _damaged(lib, what: str) -> LibraryError:
    return LibraryError(f"{lib.path}: the index of shared code is damaged ({what})", REBUILD)


def post(lib, mid: int, hashes: Iterable[str], *, add: bool) -> None:
    """Add model `mid` to the posting of each of `hashes` (`add`), or take it out of them (a posting left empty is
    deleted). Called inside the write's transaction."""
    np = _np()
    one = _posting([mid])  # (an id that does not fit is refused before anything is written)
    hashes = sorted(set(hashes))
    for i in range(0, len(hashes), CHUNK):
        part = hashes[i : i + CHUNK]
        marks = ",".join("?" * len(part))
        have = {h: _ids(lib, m) for h, m in lib.query(f"SELECT hash, models FROM listing_postings WHERE hash IN ({marks})",
                                                      part).fetchall()}  # fmt: skip
        keep, gone = [], []
        for h in part:
            old = have.get(h)
            if add and (old is None or not len(old)):
                keep.append((h, one))
            elif add and old[-1] < mid:  # the usual case: a new entry's id is the largest (appended, no sort)
                keep.append((h, old.tobytes() + one))
            elif add:
                keep.append((h, np.union1d(old, np.array([mid], dtype=ID)).astype(ID).tobytes()))
            elif old is not None:
                new = old[old != mid]
                (keep.append((h, new.tobytes())) if len(new) else gone.append(h))
        lib.query_many("INSERT INTO listing_postings(hash, models) VALUES (?,?) "
                       "ON CONFLICT(hash) DO UPDATE SET models = excluded.models", keep)  # fmt: skip
        if gone:
            lib.query(f"DELETE FROM listing_postings WHERE hash IN ({','.join('?' * len(gone))})", gone)


def _posting(ids: list[int]) -> bytes:
    """Sorted distinct ids as a stored posting; an id outside 0..2^32-1 is a LibraryError (SQLite numbers entries
    1, 2, 3, ...; only a forged library reaches the limit)."""
    if ids and not 0 <= min(ids) <= max(ids) < 1 << 32:
        raise LibraryError(f"a library entry's id ({max(ids)}) does not fit the index of shared code", REBUILD)
    return _np().array(sorted(set(ids)), dtype=ID).tobytes()


def build(lib) -> None:
    """Every posting from the stored rows (the migration to schema 6; inside its transaction), read in hash order
    so that one posting is in memory at a time, written in batches."""
    rows = lib.query("SELECT DISTINCT hash, model_id FROM code_hashes WHERE kind='listing' ORDER BY hash, model_id")
    batch = []
    for h, group in groupby(rows, key=lambda r: r[0]):
        batch.append((h, _posting([m for _, m in group])))
        if len(batch) >= 5000:
            lib.query_many("INSERT INTO listing_postings(hash, models) VALUES (?,?)", batch)
            batch = []
    lib.query_many("INSERT INTO listing_postings(hash, models) VALUES (?,?)", batch)


def model_hashes(lib, mid: int) -> list[str]:
    """The distinct listing hashes model `mid` stores (what its removal takes out of the postings)."""
    return [h for (h,) in lib.query("SELECT DISTINCT hash FROM code_hashes WHERE model_id=? AND kind='listing'",
                                    (mid,)).fetchall()]  # fmt: skip


def counts_by_rows(lib, kind: str, hashes: Iterable[str]) -> dict[int, int]:
    """`counts` from `code_hashes`, one index row per (hash, entry): any kind of hash (schema 5's way, kept as
    the reference the postings are tested against)."""
    hashes = sorted(set(hashes))
    out: Counter[int] = Counter()
    for i in range(0, len(hashes), CHUNK):
        part = hashes[i : i + CHUNK]
        # From the covering index (kind, hash, model_id) alone, in its order (DISTINCT needs no temporary B-tree),
        # counted per model in the database and handed back as one text row (a row per count waited on the GIL).
        # A hash falls in one chunk only, so per-chunk counts add up to distinct counts.
        q = (f"SELECT {lib.TEXT_AGG}(CAST(model_id AS TEXT) || ' ' || CAST(n AS TEXT), ' ') FROM "
             f"(SELECT model_id, COUNT(*) AS n FROM (SELECT DISTINCT hash, model_id FROM code_hashes "
             f"WHERE kind=? AND hash IN ({','.join('?' * len(part))})) AS shared GROUP BY model_id) AS per_model")  # fmt: skip
        (text,) = lib.query(q, [kind, *part]).fetchone()
        numbers = iter([int(x) for x in (text or "").split()])
        for mid, n in zip(numbers, numbers):
            out[mid] += n
    return dict(out)
