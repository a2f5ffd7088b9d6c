"""Programmatic-representation similarity and the δ→γ matching of ZEN's Algorithm 1 (lines 11-24).

* Attr SS (attribute similarity, "% of matching attributes"): Jaccard similarity of two code
  objects' attribute sets: names, local variable names, constants, free variables and the last
  component of the qualname.
* Element-wise distance: |Δargs| + |Δlocals| + |Δcalls| (calls = CALL instructions).
* TOP-N (N = 3): the base code objects with the highest Attr SS to δ, ties broken by the smallest
  element-wise distance.
* IBSS (implied bytecode similarity): rapidfuzz's normalised Indel ratio of the two normalised
  instruction listings (the paper compares decompiled source; listings are exact, fast, and
  version-normalised, see zen.cpython.code.listing).
* Pair score = mean(Attr SS, IBSS); γ = the TOP-N member with the highest pair score.

Identical code objects are paired first with score 1.0, as Algorithm 1's candidate filter (line 4)
treats them as the same function. "Identical" means the same normalised listing: CPython's raw
bytecode holds only *indices* into the names and constants tables, so `F.relu(x)` and `F.relu6(x)`
compile to the same bytes; the listing resolves those operands and tells them apart.

Model code and framework code. The closure of a transformers model holds thousands of framework
functions (PreTrainedModel, accelerate, huggingface_hub) that every transformers model shares;
counted equally they would make any two such models look alike. The code that identifies a model
is the code of the modules defining its layers (the modules of its module classes: "model code").
So model code is matched against model code and framework code against framework code, and
COs = 0.8·COs(model code) + 0.2·COs(framework code) (or just the one that exists), each being the
sum of pair scores over the larger side's number of code objects: 1.0 for a model compared with
itself, and independent of what else the library holds. (Weighting code by its rarity across the
library was tried and dropped: near-duplicate library entries make rare code look important.)

"""

from __future__ import annotations

from collections import Counter

import numpy as np

from zen.attribute import matching
from zen.attribute.code_views import (  # noqa: F401 - the names attribution imports from here
    OPTIMAL_LIMIT,
    TOP_N,
    CodeView,
    MatchResult,
    Pair,
    attr_ss,
    distance,
    ibss,
    inline_comprehensions,
    primary_modules,
    views,
)

MODEL_CODE_SHARE = 0.8
CLASS_PAIR_MIN = 0.6


def greedy_match_reference(delta: list[CodeView], gamma: list[CodeView]) -> MatchResult:
    """Algorithm 1, lines 11-24: identical code first, then δ→TOP-N→γ by pair score.

    The reference definition, one Python call per pair: `matching.greedy_match` computes the same
    pairs vectorised and is what `code_similarity` runs; tests hold the two equal."""
    res = MatchResult()
    remaining = {id(g): g for g in gamma}
    by_hash: dict[str, list[CodeView]] = {}
    for g in sorted(gamma, key=lambda v: (v.rec.qualname, v.rec.address)):
        by_hash.setdefault(g.key, []).append(g)
    todo = []
    for d in sorted(delta, key=lambda v: (v.rec.qualname, v.rec.address)):
        same = [g for g in by_hash.get(d.key, []) if id(g) in remaining]
        if same:
            g = next((x for x in same if x.rec.qualname == d.rec.qualname), same[0])
            del remaining[id(g)]
            res.pairs.append(Pair(d.rec, g.rec, 1.0, 1.0, 1.0, True, (d.weight + g.weight) / 2))
        else:
            todo.append(d)
    for d in todo:
        if not remaining:
            res.added.append(d.rec)
            continue
        cands = sorted(remaining.values(), key=lambda g: (-attr_ss(d, g), distance(d, g), g.rec.qualname, g.rec.address))
        best = None
        for g in cands[:TOP_N]:
            a, b = attr_ss(d, g), ibss(d, g)
            s = (a + b) / 2
            if best is None or s > best[0]:
                best = (s, a, b, g)
        s, a, b, g = best
        del remaining[id(g)]
        res.pairs.append(Pair(d.rec, g.rec, s, a, b, False, (d.weight + g.weight) / 2))
    res.unmatched_base = [g.rec for g in remaining.values()]
    return res


def optimal_cos_reference(delta: list[CodeView], gamma: list[CodeView], exact_pairs: list[Pair]) -> float | None:
    """Code-object similarity under the best one-to-one assignment of the non-identical code.

    The reference definition (see `greedy_match_reference`); `matching.optimal_cos` is run."""
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
    m = np.zeros((len(d), len(g)))
    for i, x in enumerate(d):
        for j, y in enumerate(g):
            m[i, j] = (attr_ss(x, y) + ibss(x, y)) / 2 * (x.weight + y.weight) / 2
    from zen.attribute.assignment import linear_sum_assignment  # loaded only when an assignment is needed

    rows, cols = linear_sum_assignment()(m, maximize=True)
    return min(1.0, (exact_w + float(m[rows, cols].sum())) / total_w)


def _cos(res: MatchResult, delta: list[CodeView], gamma: list[CodeView]) -> float:
    total_w = max(sum(v.weight for v in delta), sum(v.weight for v in gamma)) or 1.0
    return min(1.0, sum(p.score * p.weight for p in res.pairs) / total_w)


def code_similarity(delta: list[CodeView], gamma: list[CodeView], *, optimal: bool = True, cache=None,
                    reference: bool = False) -> MatchResult:  # fmt: skip
    """Match model code with model code and framework code with framework code; combine their COs.

    `cache`: a `matching.IbssCache` shared by the comparisons of one attribution. `reference`: run
    the per-pair reference loops instead of the vectorised matching (tests compare the two)."""
    cache = cache if cache is not None else matching.IbssCache()
    parts = []
    for flag in (True, False):
        d = cache.side(delta, flag)  # the query's, split once per attribution
        g = [v for v in gamma if v.model_code is flag]
        if not d and not g:
            continue
        r = greedy_match_reference(d, g) if reference else matching.greedy_match(d, g, cache)
        r.cos = _cos(r, d, g)
        if optimal:
            exact = [p for p in r.pairs if p.exact]
            r.optimal_cos = optimal_cos_reference(d, g, exact) if reference else matching.optimal_cos(d, g, exact, cache)
        parts.append((flag, r))
    res = MatchResult()
    for _, r in parts:
        res.pairs += r.pairs
        res.added += r.added
        res.unmatched_base += r.unmatched_base
    if len(parts) == 2:
        (_, m), (_, f) = parts
        res.cos = MODEL_CODE_SHARE * m.cos + (1 - MODEL_CODE_SHARE) * f.cos
        if m.optimal_cos is not None and f.optimal_cos is not None:
            res.optimal_cos = MODEL_CODE_SHARE * m.optimal_cos + (1 - MODEL_CODE_SHARE) * f.optimal_cos
    elif parts:
        res.cos, res.optimal_cos = parts[0][1].cos, parts[0][1].optimal_cos
    return res


def class_similarity(rec: list[CodeView], base: list[CodeView], pairs: list[Pair]) -> float:
    """Share of classes owning model code whose methods were mostly matched into one base class.

    Names are not compared, so renamed or obfuscated classes still match by their code. Only
    classes owning model code count when there are any (framework classes are shared by all).
    """

    def owners(vs: list[CodeView]) -> Counter:
        model = [v for v in vs if v.model_code and v.rec.owner_class]
        return Counter(v.rec.owner_class for v in (model or [v for v in vs if v.rec.owner_class]))

    methods, base_methods = owners(rec), owners(base)
    owner_b = {v.rec.address: v.rec.owner_class for v in base}
    votes: dict[str, Counter] = {}
    for p in pairs:
        if p.score < CLASS_PAIR_MIN:
            continue  # a weak pairing is not evidence that two classes are the same class
        if p.recovered.owner_class in methods and owner_b.get(p.base.address) in base_methods:
            votes.setdefault(p.recovered.owner_class, Counter())[owner_b[p.base.address]] += 1
    matched = sum(1 for cls, v in votes.items() if v.most_common(1)[0][1] * 2 >= methods[cls])
    denom = max(len(methods), len(base_methods))
    return matched / denom if denom else 1.0
