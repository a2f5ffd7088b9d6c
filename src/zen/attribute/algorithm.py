"""Model attribution: ZEN's Algorithm 1 over a base model library.

1. Candidate selection (lines 3-7): the library models sharing at least one identical code
   object (same normalised listing, see pr_similarity) with the recovered model, found with one
   indexed query. They are ranked by the share of code they have in common, then by MR
   similarity (the sizes of one family, e.g. torchvision's 15 RegNets, share exactly the same code:
   ranked by name, the right one fell outside the cut), and the first `FULL_COMPARE` are compared
   in full; the rest keep an index-based estimate (flagged as such), which keeps attribution time
   nearly flat in library size.
2. For each candidate (lines 9-30): MRSS (mr_similarity), the δ→γ code matching and COs
   (pr_similarity), the class similarity CLS, and
       PRSS = 0.8·COs + 0.2·CLS            (code dominates; classes confirm the grouping)
       URSS = 0.25·MRSS + 0.75·PRSS         (the split that reproduces the paper's Table VI rows,
                                            e.g. RN-GH 0.25·0.63 + 0.75·0.50 = 0.53)
   Attr SS enters through every pair score (line 20: mean of Attr SS and IBSS) and is reported.
3. The candidate with the highest URSS is the attribution. If no library model shares any code,
   attribution is refused ("no base model in the library shares code with this model") and MR-only
   scores are reported for every library model.
4. A model decompiled from a compiled executable (`zen decompile`: pr.json has no code and its context
   says `"source": "compiled"`) has no programmatic part to compare. It is attributed on MR similarity
   alone, said so in the result (`basis: "mr-only"`, each candidate's PR, UR, COs, CLS are null with a
   note, never 0, which would read as "different code"), ranked by MRSS. MR compares architecture
   (graph, layer types, tensor shapes, hyper-parameters), not weight values: below `MR_ONLY_MIN` no
   library architecture is close enough to name a base (the tests' same-model pairs, decompiled vs
   recovered from a process image, score 0.77-0.81, different architectures <= 0.56), and bases of
   one architecture (a model and its fine-tuned copies) tie, which the explanation says.
5. Frameworks: a base recovered by another front end (MR `framework`: "pytorch" or "keras") is never
   the attribution. Such candidates are still scored, listed last with method "other framework" and
   a note saying why; if only they share code, attribution is refused with that reason. (Both
   frameworks' processes run the same stdlib and often numpy code, so shared code alone says nothing.)

Speed (issue 16). Every candidate gets an MR score, so per-candidate cost sets the scaling: the
library stores each entry's query-independent invariants (zen.attribute.invariants: layer and
tensor multisets, hyper-parameters, Laplacian spectrum, code views), the query's are computed
once, and `mr_score` combines them with the formulas of `mr_similarity` (bit-identical). The full
comparisons use the vectorised matching of zen.attribute.matching with one IBSS cache for the
query. Results are the same as the per-pair reference (`attribute(..., reference=True)`, kept for
the tests): same candidates, order, scores and explanation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zen.attribute.code_views import CodeView, MatchResult, primary_modules, views
from zen.attribute.early_selection import EarlySharing
from zen.attribute.invariants import INVARIANTS_VERSION, OpMemo, mr_features, mr_score, unpack_mr, unpack_views
from zen.attribute.matching import IbssCache
from zen.attribute.mr_similarity import MRScore, mr_similarity
from zen.attribute.parallel_compare import Prefetched, compare_all
from zen.attribute.pr_similarity import class_similarity, code_similarity
from zen.library.store import InvariantRow, Library
from zen.represent.mr import ModelMR
from zen.represent.pr import ProgrammaticRepresentation

PR_WEIGHTS = {"cos": 0.8, "cls": 0.2}
UR_WEIGHTS = {"mr": 0.25, "pr": 0.75}
FULL_COMPARE = 10
NO_SHARED_CODE = "no base model in the library shares code with this model"
OTHER_FRAMEWORK = "other framework"
MR_ONLY_COMPILED = "mr-only (compiled)"
NO_CODE_NOTE = "no PR: the model was decompiled from a compiled executable, which holds no Python code"
MR_ONLY_MIN = 0.7  # MR-only attribution names no base below this MRSS (see point 4)
FOREIGN_COMPARE = 3  # bases of another framework compared in full (shown with their scores, never attributed)


@dataclass
class Candidate:
    name: str
    mr: MRScore
    method: str  # "algorithm-1", "index estimate", "mr-only"
    cos: float = 0.0
    cls: float = 0.0
    optimal_cos: float | None = None
    shared: int = 0
    match: MatchResult | None = None
    note: str = ""  # why a candidate cannot be the attribution (another framework)
    pr_available: bool = True  # False for a compiled query: PR/UR are not defined, not 0

    @property
    def pr(self) -> float:
        return PR_WEIGHTS["cos"] * self.cos + PR_WEIGHTS["cls"] * self.cls

    @property
    def ur(self) -> float:
        return UR_WEIGHTS["mr"] * self.mr.mrss + UR_WEIGHTS["pr"] * self.pr

    def to_json(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(x, 4)  # noqa: E731
        d: dict[str, Any] = {
            "name": self.name, "mr": r(self.mr.mrss), "pr": r(self.pr), "ur": r(self.ur), "method": self.method,
            "arch": r(self.mr.arch), "ts": r(self.mr.ts), "op": r(self.mr.op), "graph": r(self.mr.graph),
            "cos": r(self.cos), "cls": r(self.cls), "shared_code_objects": self.shared,
        }  # fmt: skip
        if self.note:
            d["note"] = self.note
        if not self.pr_available:
            d.update(pr=None, ur=None, cos=None, cls=None, pr_note=NO_CODE_NOTE)
        if self.match is not None:
            exact, changed, added, unmatched, attr, ibss = self.match.summary()
            d.update(
                exact=exact, matched=changed, added=added, unmatched_base=unmatched,
                attr=r(attr) if changed else 1.0, ibss=r(ibss) if changed else 1.0,
                pr_optimal=r(PR_WEIGHTS["cos"] * self.optimal_cos + PR_WEIGHTS["cls"] * self.cls)
                if self.optimal_cos is not None else None,
            )  # fmt: skip
        return d


@dataclass
class Attribution:
    attributed: str | None
    candidates: list[Candidate]
    message: str = ""
    explanation: str = ""
    library_size: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"attributed": self.attributed, "candidates": [c.to_json() for c in self.candidates],
                "message": self.message, "explanation": self.explanation, "library_size": self.library_size,
                "weights": {"ur": UR_WEIGHTS, "pr": PR_WEIGHTS}, "basis": self.details.get("basis", "ur")}  # fmt: skip

    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.name == self.attributed), None)


def compare(mr: ModelMR, entry, delta: list, *, optimal: bool = False, shared: int = 0, reference: bool = False,
            cache: IbssCache | None = None) -> Candidate:  # fmt: skip
    """Full MR + PR comparison of a recovered model (its code views `delta`) with one library entry.

    `attribute` runs it only for candidates that share code (Algorithm 1 lines 3-7); evaluation
    tables (ZEN Table III) run it against every base, sharing or not.
    """
    gamma = views(entry.pr, primary_modules(entry.mr))
    return _compare(entry.name, mr_similarity(mr, entry.mr), delta, gamma, optimal, shared, reference, cache)


def _compare(name: str, mrs: MRScore, delta: list[CodeView], gamma: list[CodeView], optimal: bool, shared: int,
             reference: bool = False, cache: IbssCache | None = None) -> Candidate:  # fmt: skip
    match, cls = _match(delta, gamma, optimal, reference, cache)
    return Candidate(name, mrs, "algorithm-1", match.cos, cls, match.optimal_cos, shared, match)


def _match(delta: list[CodeView], gamma: list[CodeView], optimal: bool, reference: bool = False,
           cache: IbssCache | None = None) -> tuple[MatchResult, float]:  # fmt: skip
    """The code matching and CLS of one full comparison."""
    match = code_similarity(delta, gamma, optimal=optimal, cache=cache, reference=reference)
    return match, class_similarity(delta, gamma, match.pairs)


class _Stored:
    """An entry's invariants as attribution reads them: stored ones, or (an entry added by an older
    zen, or with another INVARIANTS_VERSION) computed from its MR/PR on first use."""

    def __init__(self, library: Library, row: InvariantRow) -> None:
        self.library, self.row = library, row
        self._decoded = None
        if row.version == INVARIANTS_VERSION and row.mr is not None and row.spectrum is not None:
            self.mr, self.listing_version = unpack_mr(row.mr, row.spectrum)
        else:
            self.mr, self.listing_version = mr_features(self._entry().mr), self._entry().pr.listing_version

    def _entry(self):
        if self._decoded is None:
            self._decoded = self.library.get(self.row.name)
        return self._decoded

    def framework(self) -> str:
        """The entry's front end: stored in its summary (older entries: read from its MR)."""
        return self.row.summary.get("framework") or self._entry().mr.framework

    def views(self) -> list[CodeView]:
        stored = self.library.views_blob(self.row.name)
        if stored is not None and stored[0] == INVARIANTS_VERSION:
            return unpack_views(stored[1], self.library.code_bodies)
        e = self._entry()
        return views(e.pr, primary_modules(e.mr))


def _detached(library: Library, names: list[str]):
    """name -> the entry's views, decoded from bytes read now (packed views, every body they refer to), so that a
    forked child can decode them (`parallel_compare`); None if an entry has no packed views of this version."""
    blobs = {n: library.views_blob(n) for n in names}
    if any(b is None or b[0] != INVARIANTS_VERSION for b in blobs.values()):
        return None
    fetch = Prefetched(library.entry_bodies(names), library.code_bodies)
    return lambda n: unpack_views(blobs[n][1], fetch)


def compiled_query(pr: ProgrammaticRepresentation) -> bool:
    """A model decompiled from a compiled executable: no code objects, and pr.json says why."""
    return not pr.codes and (pr.context or {}).get("source") == "compiled"


def _attribute_compiled(mr: ModelMR, library: Library, reference: bool) -> Attribution:
    """MR-only attribution of a decompiled model (see the module docstring, point 4)."""
    if reference:
        scored = [(e.name, mr_similarity(mr, e.mr), e.mr.framework) for e in library.entries()]
    else:
        query, memo = mr_features(mr), OpMemo()
        rows = [_Stored(library, r) for r in library.mr_invariants()]
        scored = [(s.row.name, mr_score(query, s.mr, memo), s.framework()) for s in rows]
    cands = []
    for name, score, fw in scored:
        c = Candidate(name, score, MR_ONLY_COMPILED, pr_available=False)
        cands.append(c if fw == mr.framework else _foreign(c, fw, mr.framework))
    cands.sort(key=lambda c: (c.method == OTHER_FRAMEWORK, -c.mr.mrss, c.name))
    own = [c for c in cands if c.method != OTHER_FRAMEWORK]
    att = Attribution(own[0].name if own else None, cands, "" if own else f"no {mr.framework} base model in the library",
                      "", len(library), {"basis": "mr-only", "pr_available": False})  # fmt: skip
    if not own:
        att.explanation = att.message + "; MR similarities of the other frameworks' bases are listed."
        return att
    best = own[0]
    why = (
        "The model was decompiled from a compiled executable, which holds no Python code, so the programmatic "
        "representation (PR) cannot be compared and UR is not defined: attribution rests on the mathematical "
        "representation alone, weaker evidence than code. "
    )
    parts = (
        f"MR {best.mr.mrss:.2f}: graph {best.mr.graph:.2f}, layer types {best.mr.arch:.2f}, tensors "
        f"{best.mr.ts:.2f}, operators {best.mr.op:.2f}"
    )
    weights = (
        " MR compares architectures, not weight values: to tell a base from a fine-tuned copy of it, "
        "compare the weights (zen diff)."
    )
    if best.mr.mrss < MR_ONLY_MIN:
        att.attributed = None
        att.message = (
            f"no base in the library has an architecture close to this model's (best MR {best.mr.mrss:.2f} < {MR_ONLY_MIN:.2f})"
        )
        att.explanation = why + f"No base reaches MR {MR_ONLY_MIN:.2f}, so none is named; the closest is {best.name} ({parts})."
        return att
    tied = [c.name for c in own[1:] if abs(c.mr.mrss - best.mr.mrss) < 1e-9]
    att.explanation = (
        why + f"It is attributed to {best.name} ({parts})."
        + (f" {', '.join(tied)} score the same MR: they share this architecture, and MR alone cannot choose between "
           f"them (the first by name is named)." if tied else
           f" The next candidate, {own[1].name}, scores MR {own[1].mr.mrss:.2f}." if len(own) > 1 else
           " It is the only base of this framework in the library.")
        + weights
    )  # fmt: skip
    return att


def _foreign(cand: Candidate, framework: str, own: str) -> Candidate:
    how = f"; scored by {cand.method}" if cand.method else ""
    cand.method = OTHER_FRAMEWORK
    cand.note = f"a {own} model is not attributed to a {framework} base (recovered by another front end{how})"
    return cand


def _only_foreign(cands: list[Candidate], size: int, own: str) -> Attribution:
    cands.sort(key=lambda c: (-c.ur, c.name))
    msg = f"no {own} base model in the library shares code with this model (only bases of other frameworks do)"
    return Attribution(None, cands, msg, f"{msg}; their similarities are listed, marked {OTHER_FRAMEWORK!r}.", size)


def attribute_case(case_dir, library, *, optimal: bool = True, loaded: tuple | None = None,
                   parallel: bool = False, early: EarlySharing | None = None) -> dict[str, Any]:  # fmt: skip
    """`attribute(...).to_json()` of a case against any library: a `zen serve` library computes it on
    the server from the case's mr.json and pr.json (uploaded, never the image or the weights), with
    this same function, so the answer is the same as against a local copy of that library.
    `loaded`: the case's (mr, pr), when the caller has read them already. `parallel`, `early`: see `attribute`."""
    if getattr(library, "remote", False):
        return library.attribute_case(case_dir, optimal=optimal)
    from zen.represent import case

    mr, pr = loaded or (case.load_mr(case_dir), case.load_pr(case_dir))
    return attribute(mr, pr, library, optimal=optimal, parallel=parallel, early=early).to_json()


def attribute(mr: ModelMR, pr: ProgrammaticRepresentation, library: Library, *, optimal: bool = True,
              reference: bool = False, parallel: bool = False, early: EarlySharing | None = None) -> Attribution:  # fmt: skip
    """Algorithm 1 over `library`. `reference=True` runs the per-pair reference implementation on
    fully decoded entries (as before issue 16): slow, kept to test that the fast path agrees.
    `parallel=True` runs part of the full comparisons in a forked child (`parallel_compare`; same
    result): for a command's own process, not for a server's, whose other threads may hold locks.
    `early`: candidate selection already started (`early_selection`), used if it was for this PR's code.

    The library is read in one snapshot (a read transaction): an entry removed or replaced by
    another writer meanwhile (a shared PostgreSQL library, a server) is seen whole or not at all."""
    if early is not None:
        early.wait()  # before this thread uses the connection
    with library.snapshot():
        return _attribute(mr, pr, library, optimal=optimal, reference=reference, parallel=parallel, early=early)


def _attribute(mr: ModelMR, pr: ProgrammaticRepresentation, library: Library, *, optimal: bool,
               reference: bool, parallel: bool = False, early: EarlySharing | None = None) -> Attribution:  # fmt: skip
    if compiled_query(pr):
        return _attribute_compiled(mr, library, reference)
    if reference:
        return _attribute_reference(mr, pr, library, optimal=optimal)
    size = len(library)
    query, memo = mr_features(mr), OpMemo()
    keys = {c.listing_sha256 for c in pr.codes}
    shared = early.result(keys) if early is not None else None
    if shared is None:
        shared = library.sharing("listing", keys)
    if not shared:
        rows = [_Stored(library, r) for r in library.mr_invariants()]
        cands = [Candidate(s.row.name, mr_score(query, s.mr, memo), "mr-only") for s in rows]
        cands = [c if s.framework() == mr.framework else _foreign(c, s.framework(), mr.framework) for c, s in zip(cands, rows)]
        cands.sort(key=lambda c: (c.method == OTHER_FRAMEWORK, -c.ur, c.name))
        return Attribution(None, cands, NO_SHARED_CODE, f"{NO_SHARED_CODE}; MR-only similarities are listed.", size)
    stored = {r.name: _Stored(library, r) for r in library.mr_invariants(shared)}
    sizes = {n: max(1, s.row.summary.get("code_objects", 1)) for n, s in stored.items()}
    mrs = {n: mr_score(query, stored[n].mr, memo) for n in shared}
    fw = {n: stored[n].framework() for n in shared}
    delta = views(pr, primary_modules(mr))
    cache = IbssCache()
    # An entry's code objects the query has no identical listing for, the cost of comparing it in full:
    # its code objects less the listings shared, less as many repeated listings as the query's own
    repeats = len(pr.codes) - len({c.listing_sha256 for c in pr.codes})

    def score(names: list[str], budget: int) -> tuple[list[str], list[Candidate]]:
        ranked = sorted(names, key=lambda n: (-shared[n] / max(len(pr.codes), sizes.get(n, 1)), -mrs[n].mrss, n))
        done = compare_all(sorted(ranked[:budget]), lambda n: stored[n].views(), delta,
                           lambda n, gamma: _match(delta, gamma, optimal, cache=cache), parallel,
                           {n: sizes.get(n, 1) - shared[n] - repeats for n in ranked[:budget]},
                           lambda names: _detached(library, names))  # fmt: skip
        cands = [Candidate(n, mrs[n], "algorithm-1", m.cos, cls, m.optimal_cos, shared[n], m) for n, (m, cls) in done.items()]
        for name in sorted(ranked[budget:]):
            est = shared[name] / max(len(pr.codes), sizes.get(name, 1))
            cands.append(Candidate(name, mrs[name], "index estimate", est, est, None, shared[name]))
        return ranked, cands

    ranked, cands = score([n for n in shared if fw[n] == mr.framework], FULL_COMPARE)
    other = score([n for n in shared if fw[n] != mr.framework], FOREIGN_COMPARE)[1]
    foreign = [_foreign(c, fw[c.name], mr.framework) for c in other]
    if not cands:
        return _only_foreign(foreign, size, mr.framework)
    stale = sorted(n for n in ranked[:FULL_COMPARE] if stored[n].listing_version != pr.listing_version)
    return _finish(cands + foreign, size, mr, pr, stale)


def _attribute_reference(mr: ModelMR, pr: ProgrammaticRepresentation, library: Library, *, optimal: bool) -> Attribution:
    """Algorithm 1 as it ran before the library stored invariants (one Python call per pair)."""
    size = len(library)
    shared = library.sharing("listing", {c.listing_sha256 for c in pr.codes})
    if not shared:
        cands = [Candidate(e.name, mr_similarity(mr, e.mr), "mr-only") if e.mr.framework == mr.framework else
                 _foreign(Candidate(e.name, mr_similarity(mr, e.mr), ""), e.mr.framework, mr.framework)
                 for e in library.entries()]  # fmt: skip
        cands.sort(key=lambda c: (c.method == OTHER_FRAMEWORK, -c.ur, c.name))
        return Attribution(None, cands, NO_SHARED_CODE, f"{NO_SHARED_CODE}; MR-only similarities are listed.", size)
    sizes = {e["name"]: max(1, e["summary"].get("code_objects", 1)) for e in library.list()}
    entries = {e.name: e for e in library.entries(sorted(shared))}
    mrs = {n: mr_similarity(mr, e.mr) for n, e in entries.items()}
    delta = views(pr, primary_modules(mr))

    def score(names: list[str], budget: int) -> tuple[list, list[Candidate]]:
        ranked = sorted(names, key=lambda n: (-shared[n] / max(len(pr.codes), sizes.get(n, 1)), -mrs[n].mrss, n))
        top = [entries[n] for n in sorted(ranked[:budget])]
        cands = [compare(mr, e, delta, optimal=optimal, shared=shared[e.name], reference=True) for e in top]
        for name in sorted(ranked[budget:]):
            est = shared[name] / max(len(pr.codes), sizes.get(name, 1))
            cands.append(Candidate(name, mrs[name], "index estimate", est, est, None, shared[name]))
        return top, cands

    fw = {n: e.mr.framework for n, e in entries.items()}
    top, cands = score([n for n in shared if fw[n] == mr.framework], FULL_COMPARE)
    other = score([n for n in shared if fw[n] != mr.framework], FOREIGN_COMPARE)[1]
    foreign = [_foreign(c, fw[c.name], mr.framework) for c in other]
    if not cands:
        return _only_foreign(foreign, size, mr.framework)
    return _finish(cands + foreign, size, mr, pr, sorted(e.name for e in top if e.pr.listing_version != pr.listing_version))


def _finish(cands: list[Candidate], size: int, mr: ModelMR, pr: ProgrammaticRepresentation, stale: list[str]) -> Attribution:
    cands.sort(key=lambda c: (c.method == OTHER_FRAMEWORK, c.method != "algorithm-1", -c.ur, c.name))
    best = cands[0]
    att = Attribution(best.name, cands, "", "", size, {"primary": sorted(primary_modules(mr))})
    att.explanation = explain(att, pr)
    refused = [c for c in cands if c.method == OTHER_FRAMEWORK]
    if refused:
        att.details["other_framework"] = [c.name for c in refused]
        att.explanation += (f" Not attributable, being bases of another framework than this {mr.framework} model: "
                            + ", ".join(f"{c.name} (UR {c.ur:.2f})" for c in refused) + ".")  # fmt: skip
    if stale:
        att.details["stale_listings"] = stale
        att.explanation += (
            f" Note: {', '.join(stale)} {'was' if len(stale) == 1 else 'were'} fingerprinted by a zen with another listing "
            f"format (this case: {pr.listing_version}), so identical code may not match exactly; re-add "
            f"{'it' if len(stale) == 1 else 'them'} (`zen library build --replace` or `zen library add`)."
        )
    return att


def explain(att: Attribution, pr: ProgrammaticRepresentation) -> str:
    """One paragraph an investigator can quote: why the winner won."""
    best = att.best()
    if best is None or best.match is None:
        return att.message
    m = best.match
    primary = {c.module for c in pr.codes} if not att.details.get("primary") else att.details["primary"]
    changed = sorted((p for p in m.pairs if not p.exact), key=lambda p: (p.recovered.module not in primary, -p.score))
    added = sorted(m.added, key=lambda c: (c.module not in primary, c.qualname))
    parts = [
        f"The recovered model is attributed to {best.name} (UR {best.ur:.2f} = 0.25·MR {best.mr.mrss:.2f} + "
        f"0.75·PR {best.pr:.2f}).",
        f"Of its {len(pr.codes)} model-specific code objects, {m.exact} {_are(m.exact)} identical to {best.name}'s"
        + (f", {len(changed)} match{'es' if len(changed) == 1 else ''} changed functions of it" if changed else "")
        + (f" (e.g. {', '.join(f'{p.recovered.qualname} {p.score:.2f}' for p in changed[:3])})" if changed else "")
        + (f", and {len(m.added)} {_are(len(m.added))} new ({', '.join(c.qualname for c in added[:4])}"
           + (", ..." if len(m.added) > 4 else "") + ")" if m.added else "")
        + ".",
        f"Its architecture matches with graph similarity {best.mr.graph:.2f}, layer types {best.mr.arch:.2f}, "
        f"tensors {best.mr.ts:.2f} and operators {best.mr.op:.2f}.",
    ]  # fmt: skip
    others = [c for c in att.candidates if c is not best and c.method != OTHER_FRAMEWORK]
    if others:
        nxt = others[0]
        parts.append(f"The next candidate, {nxt.name}, scores UR {nxt.ur:.2f} (MR {nxt.mr.mrss:.2f}, PR {nxt.pr:.2f}"
                     + (f", {nxt.match.exact} identical code objects" if nxt.match else ", index estimate") + ").")  # fmt: skip
    else:
        parts.append("No other library model shares code with it.")
    return " ".join(parts)


def _are(n: int) -> str:
    return "is" if n == 1 else "are"
