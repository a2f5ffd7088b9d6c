"""Vectorised δ→γ code matching: the same pairs and scores as `pr_similarity`'s reference loops.

The reference greedy matching sorts every remaining base code object by (Attr SS, distance) for
each recovered one: on a transformers model (~3,400 code objects per side) that was ~470,000
Python-level `attr_ss`/`distance` calls per comparison, and the optimal assignment scores up to
90,000 pairs with one Python call each. Here:

* Attr SS of all pairs at once: attribute sets become rows of a sparse 0/1 matrix, the
  intersections one sparse product, the union |a| + |b| - |a ∩ b|; `inter / union` on int64 arrays
  is IEEE division of the same two integers, so every value is bit-identical to `attr_ss`.
* The element-wise distance is an int matrix.
* TOP-N: each recovered row is sorted once by (-Attr SS, distance, base order) with `np.lexsort`;
  the greedy loop then walks that order skipping base code already taken (the reference re-sorted
  the remaining set; same order, same first N).
* IBSS: rapidfuzz's `process.cdist` with the same `fuzz.ratio` scorer in float64 (equal to the
  per-pair call, checked in the tests), memoised per pair of listing keys across the candidates of
  one attribution (`IbssCache`): forks and versions of one family share most of their code.

Pair scores are then formed with the reference's expressions in the reference's order, so cos and
optimal_cos are bit-identical; tests compare both implementations on real fingerprints.

With the compiled core (`zen.native`), the greedy loop over the rows and the Attr SS matrix run in C
(`match.c`) on attribute sets as int64 ids (`IbssCache.attr_ids`): the same ranking and the same float
operations, without the per-row Python, the per-comparison attribute map and the sparse product (whose
scipy.sparse import was 0.1 s of a command, after the fork: in both processes). The numpy path below is
the fallback (`ZEN_PURE=1`); the tests run both.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np
from rapidfuzz import fuzz, process

from zen import native
from zen.attribute.code_views import OPTIMAL_LIMIT, TOP_N, CodeView, MatchResult, Pair
from zen.attribute.invariants import load_bodies

ROW_CHUNK = 512  # recovered rows scored at a time: bounds memory at ROW_CHUNK x |gamma| per matrix


class _Ids(dict):
    """attribute -> int id: a new attribute gets the next id (0, 1, 2, ...) on first lookup."""

    def __missing__(self, key) -> int:
        v = self[key] = len(self)
        return v


class IbssCache:
    """IBSS of listing pairs, keyed by the two listings' keys (sha256 of the text)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], float] = {}
        self.ids: dict = _Ids()  # attribute -> int id, for the compiled matching (one map per attribution)
        self._view_ids: dict[int, tuple[CodeView, np.ndarray]] = {}
        self._memo: dict[tuple, tuple[list[CodeView], list[CodeView]]] = {}

    def side(self, vs: list[CodeView], model_code: bool) -> list[CodeView]:
        """The views of one side (model code or framework code), in their order. The query's views take part in
        every comparison of an attribution: split once, not once per candidate. The list is held with its result,
        so its `id()` cannot be reused meanwhile."""
        return self._memoised(vs, model_code, lambda: [v for v in vs if v.model_code is model_code])

    def ranked(self, vs: list[CodeView]) -> list[CodeView]:
        """`vs` sorted by (qualname, address), the tie-break rank; once per list (see `side`)."""
        return self._memoised(vs, "ranked", lambda: sorted(vs, key=_order))

    def _memoised(self, vs: list[CodeView], what, make) -> list[CodeView]:
        hit = self._memo.get((id(vs), what))
        if hit is None or hit[0] is not vs:
            hit = self._memo[id(vs), what] = (vs, make())
        return hit[1]

    def attr_ids(self, vs: list[CodeView]) -> tuple[np.ndarray, np.ndarray]:
        """The views' attribute sets as CSR arrays of ids (ids, row pointers), int64. A view's ids are
        computed once per attribution (the query's views take part in every comparison); the view is held
        with them, so its `id()` cannot be reused meanwhile."""
        get, known = self.ids.__getitem__, self._view_ids
        rows = []
        for v in vs:
            hit = known.get(id(v))
            if hit is None:  # `map` over the set: a Python call only for an attribute not seen before
                hit = known[id(v)] = (v, np.array(list(map(get, v.attrs)), dtype=np.int64))
            rows.append(hit[1])
        ptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=ptr[1:])
        return (np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)), ptr

    def one(self, a: CodeView, b: CodeView) -> float:
        k = (a.key, b.key)
        v = self.values.get(k)
        if v is None:
            v = self.values[k] = 1.0 if a.text == b.text else fuzz.ratio(a.text, b.text) / 100.0
        return v

    def matrix(self, d: list[CodeView], g: list[CodeView]) -> np.ndarray:
        """IBSS of every (d, g) pair; the pairs not cached are scored by one `cdist` call."""
        out = np.empty((len(d), len(g)))
        missing_r: dict[str, int] = {}
        missing_c: dict[str, int] = {}
        todo = []
        for i, x in enumerate(d):
            for j, y in enumerate(g):
                v = self.values.get((x.key, y.key))
                if v is None:
                    todo.append((i, j))
                    missing_r.setdefault(x.key, len(missing_r))
                    missing_c.setdefault(y.key, len(missing_c))
                else:
                    out[i, j] = v
        if todo:
            texts_r = {x.key: x.text for x in d}
            texts_c = {y.key: y.text for y in g}
            # workers=1: the scores are the same with more, but a shared 2-core machine gains nothing
            m = process.cdist([texts_r[k] for k in missing_r], [texts_c[k] for k in missing_c], scorer=fuzz.ratio,
                              dtype=np.float64, workers=1)  # fmt: skip
            for i, j in todo:
                x, y = d[i], g[j]
                v = 1.0 if x.text == y.text else float(m[missing_r[x.key], missing_c[y.key]]) / 100.0
                self.values[(x.key, y.key)] = out[i, j] = v
        return out


def _rows(vs: list[CodeView], ids: dict) -> tuple[list[int], list[int]]:
    """CSR index pointer and column indices of the views' attribute sets (ids: attribute -> column)."""
    indptr, indices = [0], []
    for v in vs:
        indices += [ids.setdefault(a, len(ids)) for a in v.attrs]
        indptr.append(len(indices))
    return indptr, indices


def _attr_matrix(d: list[CodeView], g: list[CodeView]) -> tuple[np.ndarray, np.ndarray]:
    """(intersection sizes, union sizes) of the attribute sets of every (d, g) pair, int64."""
    from scipy import sparse  # here, not at import: a query whose code all matches exactly never needs it (~0.1 s)

    ids: dict = {}
    pr_, ir = _rows(d, ids)
    pg, ig = _rows(g, ids)
    n = max(1, len(ids))
    a = sparse.csr_matrix((np.ones(len(ir), dtype=np.int64), ir, pr_), shape=(len(d), n))
    b = sparse.csr_matrix((np.ones(len(ig), dtype=np.int64), ig, pg), shape=(len(g), n))
    inter = (a @ b.T).toarray().astype(np.int64)
    size_d = np.diff(np.asarray(pr_, dtype=np.int64))
    size_g = np.diff(np.asarray(pg, dtype=np.int64))
    return inter, size_d[:, None] + size_g[None, :] - inter


def attr_matrix(d: list[CodeView], g: list[CodeView], cache: IbssCache | None = None) -> np.ndarray:
    """`attr_ss` of every (d, g) pair (float64, bit-identical to the per-pair function)."""
    if not d or not g:
        return np.zeros((len(d), len(g)))
    if native.core is not None:
        cache = cache or IbssCache()
        raw = native.core.attr_matrix(*cache.attr_ids(d), *cache.attr_ids(g))
        return np.frombuffer(raw, dtype=np.float64).reshape(len(d), len(g)).copy()
    inter, union = _attr_matrix(d, g)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = inter / union
    out[union == 0] = 1.0
    return out


def _lengths(vs: list[CodeView]) -> np.ndarray:
    return np.fromiter((len(v.text) for v in vs), dtype=np.int64, count=len(vs))


def _vectors(vs: list[CodeView]) -> np.ndarray:
    return np.array([v.vector for v in vs], dtype=np.int64).reshape(len(vs), 3)


_order = attrgetter("rec.qualname", "rec.address")  # (qualname, address): the tie-break rank (C, not a Python call)


def greedy_match(delta: list[CodeView], gamma: list[CodeView], cache: IbssCache | None = None) -> MatchResult:
    """Algorithm 1, lines 11-24, as `pr_similarity.greedy_match_reference` (same pairs, same order)."""
    cache = cache or IbssCache()
    res = MatchResult()
    original = gamma
    gamma = sorted(gamma, key=_order)  # position = the tie-break rank
    taken = [False] * len(gamma)
    by_hash: dict[str, list[int]] = {}
    for j, g in enumerate(gamma):
        by_hash.setdefault(g.key, []).append(j)
    todo = []
    for d in cache.ranked(delta):
        j = _identical(by_hash.get(d.key), taken, gamma, d)
        if j is None:
            todo.append(d)
            continue
        taken[j] = True
        g = gamma[j]
        res.pairs.append(Pair(d.rec, g.rec, 1.0, 1.0, 1.0, True, (d.weight + g.weight) / 2))
    # what identical code left: only these base code objects can still be chosen, in rank order
    free = [g for g, t in zip(gamma, taken) if not t]
    used = np.zeros(len(free), dtype=bool)
    if todo and free:
        load_bodies(free)
        if native.core is not None:
            _greedy_compiled(todo, free, used, cache, res)
        else:
            _greedy_rows(todo, free, used, cache, res)
    else:
        res.added += [d.rec for d in todo]
    left = {id(g) for g, u in zip(free, used.tolist()) if not u}  # (a list: numpy's bools one by one are slow)
    if left:
        res.unmatched_base = [g.rec for g in original if id(g) in left]  # in gamma's order, as the reference
    return res


def _identical(same: list[int] | None, taken: list[bool], gamma: list[CodeView], d: CodeView) -> int | None:
    """The base view paired with `d` by key: the first of `same` (positions with d's key) not taken, one of the
    same qualname first where several are free; None if none is free."""
    if same is None:
        return None
    if len(same) == 1:  # most keys: one base view, no list to filter
        return None if taken[same[0]] else same[0]
    same = [j for j in same if not taken[j]]
    if not same:
        return None
    return same[0] if len(same) == 1 else next((x for x in same if gamma[x].rec.qualname == d.rec.qualname), same[0])


def _greedy_rows(todo: list[CodeView], free: list[CodeView], used: np.ndarray, cache: IbssCache, res: MatchResult) -> None:
    """The greedy choice for each recovered view not paired by key, in order (the numpy reference of `match.c`)."""
    vg = _vectors(free)
    rank = np.arange(len(free))
    for lo in range(0, len(todo), ROW_CHUNK):
        chunk = todo[lo : lo + ROW_CHUNK]
        attr = attr_matrix(chunk, free)
        dist = np.abs(_vectors(chunk)[:, None, :] - vg[None, :, :]).sum(axis=2)
        for i, d in enumerate(chunk):
            if used.all():
                res.added.append(d.rec)
                continue
            order = np.lexsort((rank, dist[i], -attr[i]))
            best = None
            for j in order[~used[order]][:TOP_N]:
                a = float(attr[i, j])
                if best is not None and (a + 1.0) / 2 <= best[0]:
                    break  # IBSS <= 1 and Attr SS falls along `order`: no later base can score higher
                g = free[j]
                b = cache.one(d, g)
                s = (a + b) / 2
                if best is None or s > best[0]:
                    best = (s, a, b, j)
            s, a, b, j = best
            used[j] = True
            g = free[j]
            res.pairs.append(Pair(d.rec, g.rec, s, a, b, False, (d.weight + g.weight) / 2))


def _greedy_compiled(todo: list[CodeView], free: list[CodeView], used: np.ndarray, cache: IbssCache,
                     res: MatchResult) -> None:  # fmt: skip
    """`_greedy_rows` in C (`native.core.greedy_rows`): the same choices and scores. Given the texts' lengths, it
    skips the IBSS of a candidate that could not win even if its text matched as well as the lengths allow
    (~15% of a transformers attribution's IBSS calls, each ~36 µs of LCS)."""
    chosen = native.core.greedy_rows(*cache.attr_ids(todo), _vectors(todo), *cache.attr_ids(free), _vectors(free), used,
                                     TOP_N, lambda i, j: cache.one(todo[i], free[j]), _lengths(todo), _lengths(free))  # fmt: skip
    for d, c in zip(todo, chosen):
        if c is None:
            res.added.append(d.rec)
            continue
        j, s, a, b = c
        g = free[j]
        res.pairs.append(Pair(d.rec, g.rec, s, a, b, False, (d.weight + g.weight) / 2))


def optimal_cos(delta: list[CodeView], gamma: list[CodeView], exact_pairs: list[Pair],
                cache: IbssCache | None = None) -> float | None:  # fmt: skip
    """As `pr_similarity.optimal_cos_reference`: the best one-to-one assignment of the non-identical code."""
    used_r = {p.recovered.address for p in exact_pairs}
    used_b = {p.base.address for p in exact_pairs}
    d = [v for v in delta if v.rec.address not in used_r]
    g = [v for v in gamma if v.rec.address not in used_b]
    total_w = max(sum(v.weight for v in delta), sum(v.weight for v in gamma)) or 1.0
    exact_w = sum(p.weight for p in exact_pairs)
    if not d or not g:
        return exact_w / total_w
    if len(d) * len(g) > OPTIMAL_LIMIT:
        return None
    cache = cache or IbssCache()
    wd = np.array([v.weight for v in d])
    wg = np.array([v.weight for v in g])
    # the reference: (attr_ss(x, y) + ibss(x, y)) / 2 * (x.weight + y.weight) / 2, left to right
    m = (attr_matrix(d, g, cache) + cache.matrix(d, g)) / 2 * (wd[:, None] + wg[None, :]) / 2
    from zen.attribute.assignment import linear_sum_assignment  # loaded only when an assignment is needed

    rows, cols = linear_sum_assignment()(m, maximize=True)
    return min(1.0, (exact_w + float(m[rows, cols].sum())) / total_w)
