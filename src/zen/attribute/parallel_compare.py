"""Attribution's full comparisons on two cores: part of them in a forked copy of this process.

Algorithm 1 compares the ten candidates sharing most code in full. On a transformers query that is
~0.1 s of pure Python each (greedy matching of ~4,000 code views, then the optimal assignment),
the largest part of `zen attribute` (issue 34, target 1). They do not depend on each other, so a
forked child (`zen.runtime.forking.Forked`) computes some while this process computes the others,
each taking the next from one queue, the most costly first (`_shared`).

The child never touches the library. An SQLite connection must not be used across `fork`, and even
a fresh one opened in the child would share the parent's lock bookkeeping (SQLite keeps it per
process, and the child's copy claims locks the child does not hold). So this process reads, before
the fork, everything the child's comparisons will read: each entry's packed code views and every
code body (listing text, attribute set) the entry refers to, as stored bytes in two queries; the
child decodes them (`Prefetched`). Decoding them here first, and reading only the bodies matching
would read, kept both cores waiting: 0.14 s of a GPT-2 attribution at 100 entries, where the
bytes take 0.04 s. (An entry stored by an older zen has no packed views: its views are computed and
its bodies read here, as before.) A body the child still lacks fails the child, never the answer:
this process then computes the child's comparisons itself, as it does when fork is unavailable,
the child dies or `ZEN_FORK=0`.

Results are those of the comparisons in one process: the same functions on copies of the same
views; the IBSS cache (`matching.IbssCache`) is a memo of a pure function, so splitting it changes
no score. The child hands back its `MatchResult`s as arrays, every code record by its index in the
query's views or the entry's (this process decodes the same views from the same bytes when the pairs
are read: `SentMatch`).
"""

from __future__ import annotations

import functools
import gc
import os
import pickle
from collections import Counter
from collections.abc import Callable

import numpy as np

from zen.attribute.code_views import CodeView, MatchResult, Pair
from zen.attribute.invariants import StoredView, load_bodies
from zen.runtime.forking import Forked, enabled

Compared = tuple[MatchResult, float]  # (match, CLS)
Compare = Callable[[str, list[CodeView]], Compared]  # name, entry's views -> (match, CLS)
# names -> (name -> that entry's views, decoded from bytes read now; usable in a forked child), or None
Detach = Callable[[list[str]], Callable[[str], list[CodeView]] | None]
MIN_PARALLEL = 3  # fewer comparisons than this: one process (the fork and the prefetch cost more than they save)
# Less estimated work than this (code objects of the entries the query does not hold identically), one process:
# a CNN query's ten comparisons take ~0.1 s, less than the fork and the prefetch save (measured when forking also
# imported all of scipy.optimize: 0.59 -> 0.76 s at 1,000 entries; `assignment` now loads only its C extension)
MIN_WORK = 500
FIXED_COST = 30  # estimated cost of one comparison besides the bodies it reads (the matching's own passes)
MAX_SHARED = 255  # names the queue of `_shared` can hold (one byte each); attribution compares at most 13


def compare_all(names: list[str], gammas: Callable[[str], list[CodeView]], delta: list[CodeView], compare: Compare,
                parallel: bool, cost: dict[str, int], detach: Detach | None = None) -> dict[str, Compared]:  # fmt: skip
    """`compare(name, gammas(name))` for every name; with `parallel`, part of them in a forked child.

    With `detach` (entries stored with packed views), this process reads every entry's stored bytes before the
    fork and both processes take the next comparison, most costly first (`cost`: an estimate per name, the
    entry's code objects the query does not hold identically), from one queue (`_shared`). Otherwise (or where
    `detach` gives None: an entry stored by an older zen) the names are split by `cost` beforehand and this
    process reads the child's entries decoded, with the bodies matching will read (`_split`). Either way the
    optimal assignment is loaded before the fork (both processes need it)."""
    work = {n: max(0, cost.get(n, 0)) for n in names}
    if not parallel or len(names) < MIN_PARALLEL or sum(work.values()) < MIN_WORK or not enabled():
        return {n: compare(n, gammas(n)) for n in names}
    try:
        entry = detach(names) if detach is not None and len(names) <= MAX_SHARED else None
        if entry is not None:
            return _shared(names, entry, delta, compare, work)
        mine, theirs = _split(names, {n: FIXED_COST + work[n] for n in names})
        views = {n: gammas(n) for n in theirs}
        for n in theirs:
            load_bodies(_bodies_read(delta, views[n]))
    except Exception:  # noqa: BLE001 - e.g. a body missing from a damaged library that matching might never read
        return {n: compare(n, gammas(n)) for n in names}  # one process: it fails only where that would
    for n in theirs:
        _parent_only(views[n])
    _load_assignment()
    parent = os.getpid()

    def child_part() -> bytes:
        if os.getpid() != parent:  # (not when this process computes it after all)
            gc.disable()  # the child leaves when done: collections would only copy the parent's pages (copy-on-write)
        return _dumps({n: compare(n, views[n]) for n in theirs}, delta, views)

    child = Forked(child_part)
    try:
        out = {n: compare(n, gammas(n)) for n in mine}
        out.update(_loads(child.result(), delta, views.__getitem__))
    finally:
        child.cancel()
    return {n: out[n] for n in names}


def _shared(names: list[str], entry: Callable[[str], list[CodeView]], delta: list[CodeView], compare: Compare,
            work: dict[str, int]) -> dict[str, Compared]:  # fmt: skip
    """The comparisons taken in turn by this process and a forked child from one queue: a pipe holding one byte per
    name, most costly first (a read of one byte is atomic), until it is empty. Whichever side is faster does more,
    whatever the estimates say or the load on the machine (a split made beforehand left one side waiting 0.05 s of
    a GPT-2 attribution's 0.5 s). The entries the child took are decoded here only if their pairs are read
    (`SentMatch`); what the child took and did not deliver, this process computes."""
    order = sorted(names, key=lambda n: (-work[n], n))
    r, w = os.pipe()
    try:
        os.write(w, bytes(range(len(order))))
    finally:
        os.close(w)  # before the fork: the queue ends (a read gives b"") once both have taken everything

    def take() -> str | None:
        b = os.read(r, 1)
        return order[b[0]] if b else None

    _load_assignment()
    parent = os.getpid()

    def child_part() -> bytes:
        if os.getpid() != parent:
            gc.disable()  # (as in `compare_all`)
        views, done = {}, {}
        while (n := take()) is not None:
            views[n] = entry(n)
            done[n] = compare(n, views[n])
        return _dumps(done, delta, views)

    try:
        child = Forked(child_part)
        try:
            out = {}
            while (n := take()) is not None:
                out[n] = compare(n, entry(n))
            out.update(_loads(child.result(), delta, entry))
            for n in names:  # taken by a child that did not deliver
                if n not in out:
                    out[n] = compare(n, entry(n))
        finally:
            child.cancel()
    finally:
        os.close(r)
    return {n: out[n] for n in names}


def _load_assignment() -> None:
    from zen.attribute.assignment import linear_sum_assignment

    linear_sum_assignment()  # loaded once, before the fork (both processes assign)


class Prefetched:
    """A `Bodies.fetch` over bodies read before a fork: what this dict lacks, the process that read it fetches with
    `fetch` (the library); a forked child refuses (LookupError: it fails, and this process computes its part)."""

    def __init__(self, bodies: dict[str, tuple[bytes, str]], fetch) -> None:
        self.bodies, self.fetch, self.pid = bodies, fetch, os.getpid()

    def __call__(self, keys: list[str]) -> dict[str, tuple[bytes, str]]:
        got = {k: self.bodies[k] for k in keys if k in self.bodies}
        if len(got) < len(keys):
            if os.getpid() != self.pid:
                raise LookupError(f"{len(keys) - len(got)} code bodies were not read before the fork")
            got.update(self.fetch([k for k in keys if k not in got]))
        return got


def _bodies_read(delta: list[CodeView], gamma: list[CodeView]) -> list[CodeView]:
    """The stored views of `gamma` whose bodies matching reads: those the query has no identical
    view for. Model code and framework code are matched apart (`pr_similarity.code_similarity`), so
    identical means the same key on the same side; and counting duplicates: every view of a key
    held more often than the query holds it."""
    have = Counter((v.model_code is True, v.key) for v in delta)
    count = Counter((v.model_code is True, v.key) for v in gamma)
    return [
        v for v in gamma if isinstance(v, StoredView) and count[v.model_code is True, v.key] > have[v.model_code is True, v.key]
    ]


def _split(names: list[str], cost: dict[str, int]) -> tuple[list[str], list[str]]:
    """(this process's names, the child's): the most costly first, each to the lighter side. This
    process's side counts a fifth of each of the child's bodies besides its own work: it decodes the
    child's results at the end, and reads its own entries after the fork where the child's were read
    before. (Transformers queries, 1,000 entries: the comparisons took 0.68-0.70 s so, 0.73-0.76 s
    split by cost alone.)"""
    mine: list[str] = []
    theirs: list[str] = []
    load = [0.0, 0.0]
    for n in sorted(names, key=lambda n: (-cost[n], n)):
        side = 0 if load[0] <= load[1] else 1
        (mine if side == 0 else theirs).append(n)
        load[side] += cost[n]
        if side == 1:
            load[0] += 0.2 * (cost[n] - FIXED_COST)
    return mine, theirs


def _parent_only(gamma: list[CodeView]) -> None:
    for v in gamma:
        if isinstance(v, StoredView) and not isinstance(v.bodies.fetch, Prefetched):
            v.bodies.fetch = Prefetched({}, v.bodies.fetch)  # nothing read ahead: the library here, a refusal in a child


def _dumps(results: dict[str, tuple[MatchResult, float]], delta: list[CodeView], gammas: dict[str, list[CodeView]]) -> bytes:
    """The child's results as arrays: each pair's code records by their index in the query's views
    and in the entry's (this process holds both), its scores as float64 (exact). Pickling the
    `MatchResult`s themselves (~27,000 pairs for seven transformers entries, 4.7 MB) took 0.15 s
    in the child and 0.19 s here, a third of what the child saved."""
    rec_at = {id(v.rec): i for i, v in reversed(list(enumerate(delta)))}
    out = {}
    for name, (m, cls) in results.items():
        base_at = {id(v.rec): i for i, v in reversed(list(enumerate(gammas[name])))}
        pairs = m.pairs
        out[name] = (
            np.array([rec_at[id(p.recovered)] for p in pairs], dtype=np.int64),
            np.array([base_at[id(p.base)] for p in pairs], dtype=np.int64),
            np.array([(p.score, p.attr, p.ibss, p.weight) for p in pairs], dtype=np.float64).reshape(len(pairs), 4),
            np.array([p.exact for p in pairs], dtype=bool),
            np.array([rec_at[id(r)] for r in m.added], dtype=np.int64),
            np.array([base_at[id(r)] for r in m.unmatched_base], dtype=np.int64),
            m.cos, m.optimal_cos, cls,
        )  # fmt: skip
    return pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)


def _loads(data: bytes, delta: list[CodeView], gamma: Callable[[str], list[CodeView]]) -> dict[str, Compared]:
    """`_dumps` undone: `SentMatch`es, equal to the child's `MatchResult`s, with this process's own records (of the
    query's views, and of `gamma(name)`: the entry's views as this process decodes them, from the same bytes)."""
    out = {}
    for name, (ri, bi, scores, exact, added, unmatched, cos, optimal_cos, cls) in pickle.loads(data).items():
        m = SentMatch(delta, ri, bi, scores, exact, added, unmatched, cos, optimal_cos, functools.partial(gamma, name))
        out[name] = (m, cls)
    return out


class SentMatch(MatchResult):
    """A `MatchResult` a child sent as arrays (`_dumps`), its entry's records made on first use.

    An attribution reports most comparisons by their counts and mean scores (`summary`), which the arrays give as
    the pairs would (the same floats, summed in the same order); only the explanation of the winner, or a caller
    of the library function, reads the pairs themselves. Decoding the entries a child took, for records no report
    reads, cost this process 0.06 s of a GPT-2 attribution after its own comparisons (six transformers entries:
    zlib, JSON, 24,000 views), and making their 24,000 pairs 0.02 s."""

    def __init__(self, delta: list[CodeView], ri: np.ndarray, bi: np.ndarray, scores: np.ndarray, exact: np.ndarray,
                 added: np.ndarray, unmatched: np.ndarray, cos: float, optimal_cos: float | None,
                 gamma: Callable[[], list[CodeView]]) -> None:  # fmt: skip
        self.added = [delta[r].rec for r in added.tolist()]
        self.cos, self.optimal_cos = cos, optimal_cos
        self._delta, self._ri, self._bi, self._scores, self._exact, self._unmatched = delta, ri, bi, scores, exact, unmatched
        self._gamma = gamma
        self._made: tuple[list[Pair], list] | None = None

    def _make(self) -> tuple[list[Pair], list]:
        if self._made is None:
            base, delta = [v.rec for v in self._gamma()], self._delta
            pairs = [Pair(delta[r].rec, base[b], s, a, i, e, w) for r, b, (s, a, i, w), e
                     in zip(self._ri.tolist(), self._bi.tolist(), self._scores.tolist(), self._exact.tolist())]  # fmt: skip
            self._made = pairs, [base[b] for b in self._unmatched.tolist()]
        return self._made

    @property  # type: ignore[override]
    def pairs(self) -> list[Pair]:
        return self._make()[0]

    @property  # type: ignore[override]
    def unmatched_base(self) -> list:
        return self._make()[1]

    @property
    def exact(self) -> int:
        return int(np.count_nonzero(self._exact))

    def summary(self) -> tuple[int, int, int, int, float, float]:
        fuzzy = self._scores[~self._exact]
        n, exact = len(fuzzy), len(self._exact) - len(fuzzy)
        attr = sum(fuzzy[:, 1].tolist()) / n if n else 1.0
        ibss = sum(fuzzy[:, 2].tolist()) / n if n else 1.0
        return exact, n, len(self.added), len(self._unmatched), attr, ibss
