"""Programmatic-representation similarity and the δ→γ matching of ZEN's Algorithm 1 (lines 11-24).

* Attr SS (attribute similarity, "% of matching attributes"): Jaccard similarity of two code
  objects' attribute sets: names, local variable names, constants, free variables and the last
  component of the qualname.
* Element-wise distance: |Δargs| + |Δlocals| + |Δcalls| (calls = CALL instructions).
* TOP-N (N = 3): the base code objects with the highest Attr SS to δ, ties broken by the smallest
  element-wise distance.
* IBSS (implied bytecode similarity): rapidfuzz's normalised Indel ratio of the two normalised
  instruction listings (the paper compares decompiled source; listings are exact, fast, and
  version-normalised, see zen.cpython.listing).
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

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from rapidfuzz import fuzz
from scipy.optimize import linear_sum_assignment

from zen.represent.pr import CodeRecord, ProgrammaticRepresentation

TOP_N = 3
OPTIMAL_LIMIT = 300 * 300  # pairs scored exhaustively for the optimal assignment
MODEL_CODE_SHARE = 0.8
CLASS_PAIR_MIN = 0.6


class CodeView:
    """A code record with its comparison features computed once."""

    __slots__ = ("rec", "attrs", "vector", "text", "weight", "model_code", "key")

    def __init__(
        self, rec: CodeRecord, weight: float = 1.0, model_code: bool = True, inlined: list[CodeRecord] | None = None
    ) -> None:
        self.rec = rec
        short = rec.qualname.rsplit(".", 1)[-1]
        parts = [rec, *(inlined or ())]
        self.attrs = frozenset([("q", short)] + [("n", n) for r in parts for n in r.names]
                               + [("v", v) for r in parts for v in r.varnames if v != ".0"]
                               + [("c", c) for r in parts for c in r.consts if not c.startswith("<code ")]
                               + [("f", f) for r in parts for f in r.freevars])  # fmt: skip
        calls = sum(1 for line in rec.listing if line.startswith("CALL"))
        self.vector = (rec.argcount + rec.kwonlyargcount, rec.nlocals, calls)
        listing = inline_comprehensions(rec.listing, inlined) if inlined else rec.listing
        self.text = "\n".join(listing)
        self.key = rec.listing_sha256 if not inlined else hashlib.sha256(self.text.encode()).hexdigest()
        self.weight = weight
        self.model_code = model_code


def attr_ss(a: CodeView, b: CodeView) -> float:
    union = len(a.attrs | b.attrs)
    return len(a.attrs & b.attrs) / union if union else 1.0


def distance(a: CodeView, b: CodeView) -> int:
    return sum(abs(x - y) for x, y in zip(a.vector, b.vector))


def ibss(a: CodeView, b: CodeView) -> float:
    if a.text == b.text:
        return 1.0
    return fuzz.ratio(a.text, b.text) / 100.0


@dataclass
class Pair:
    recovered: CodeRecord
    base: CodeRecord
    score: float
    attr: float
    ibss: float
    exact: bool
    weight: float


@dataclass
class MatchResult:
    pairs: list[Pair] = field(default_factory=list)
    added: list[CodeRecord] = field(default_factory=list)  # Δ left over: code the base does not have
    unmatched_base: list[CodeRecord] = field(default_factory=list)  # Γ left over: base code not used
    cos: float = 0.0
    optimal_cos: float | None = None

    @property
    def exact(self) -> int:
        return sum(p.exact for p in self.pairs)


COMPREHENSIONS = frozenset(("<listcomp>", "<dictcomp>", "<setcomp>"))


def views(pr: ProgrammaticRepresentation, primary: set[str] | None = None, *, inline: bool = True) -> list[CodeView]:
    """Comparison views of a PR's code objects, marked as model code (in `primary`) or framework code.

    CPython 3.12 inlined list/dict/set comprehensions into the function that contains them (PEP
    709); 3.11 compiled each into a nested code object. So that the same source compares alike
    from images of either version, a 3.11 comprehension is no code object of its own here: its
    listing is spliced into its parent's where the parent called it. (`inline=False` keeps every
    code object as it is: the diff, whose changes are patched code object by code object.)"""
    by_addr = {c.address: c for c in pr.codes}
    inlined = {c.address for c in pr.codes
               if inline and c.qualname.rsplit(".", 1)[-1] in COMPREHENSIONS and c.parent in by_addr}  # fmt: skip
    out = []
    for c in pr.codes:
        if c.address in inlined:
            continue
        kids = _comprehensions_of(c, by_addr, inlined)
        v = CodeView(c, 1.0, primary is None or c.module in primary, kids)
        if kids:
            v.text = "\n".join(_uncell(v.text.splitlines(), c, kids, by_addr))
            v.key = hashlib.sha256(v.text.encode()).hexdigest()
        out.append(v)
    return out


def _uncell(lines: list[str], c: CodeRecord, kids: list[CodeRecord], by_addr: dict[str, CodeRecord]) -> list[str]:
    """Variables that were cells only because a 3.11 comprehension closed over them are plain
    locals once the comprehension is inlined (3.12+): MAKE_CELL goes, *_DEREF become *_FAST."""
    kid_addrs = {k.address for k in kids}
    others = {f for a in c.children if a not in kid_addrs and a in by_addr for f in by_addr[a].freevars}
    plain = {f for k in kids for f in k.freevars} & set(c.cellvars) - others - {"__class__"}
    if not plain:
        return lines
    out = []
    for line in lines:
        op, _, arg = line.partition(" ")
        if arg in plain and op == "MAKE_CELL":
            continue
        if arg in plain and op in ("LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF"):
            line = f"{op.replace('DEREF', 'FAST')} {arg}"
        out.append(line)
    return out


def _comprehensions_of(c: CodeRecord, by_addr: dict[str, CodeRecord], inlined: set[str]) -> list[CodeRecord]:
    """Comprehension code records nested in `c`, recursively (a comprehension inside one)."""
    out, todo, seen = [], list(c.children), set()
    while todo and len(seen) < 10_000:
        a = todo.pop(0)
        if a in inlined and a not in seen:
            seen.add(a)
            out.append(by_addr[a])
            todo += by_addr[a].children
    return out


def inline_comprehensions(listing: list[str], kids: list[CodeRecord]) -> list[str]:
    """`listing` with each 3.11 comprehension call replaced by the comprehension's own body.

    3.11: [cells..., BUILD_TUPLE n,] LOAD_CONST <code Q>, MAKE_FUNCTION n, <iterable>, GET_ITER,
    CALL 0. Inline (3.12+, as the listing normalises it): <iterable>, GET_ITER, the body. The body
    is the nested listing without COPY_FREE_VARS, its `.0` argument load and its final
    RETURN_VALUE. Labels are then renumbered in order of appearance, as a listing numbers them."""
    bodies: dict[str, list[CodeRecord]] = {}
    for k in sorted(kids, key=lambda k: (k.firstlineno, k.address)):  # two comprehensions can share a qualname
        bodies.setdefault(f"LOAD_CONST <code {k.qualname}>", []).append(k)
    return _renumber(_splice(listing, bodies, 0))


def _splice(listing: list[str], bodies: dict[str, list[CodeRecord]], depth: int) -> list[str]:
    """One level of splicing (recursing into spliced bodies); `bodies` is consumed in source order."""
    out: list[str] = []
    pending: list[CodeRecord] = []  # made, waiting for their CALL 0
    made = False  # the previous line was a comprehension's LOAD_CONST: its MAKE_FUNCTION goes too
    for line in listing:
        queue = bodies.get(line)
        if queue:
            if out and out[-1].startswith("BUILD_TUPLE ") and out[-1][12:].isdigit():  # its closure cells
                n = int(out[-1][12:])
                if len(out) > n and all(x.startswith("LOAD_FAST ") for x in out[-1 - n : -1]):
                    del out[-1 - n :]
            pending.append(queue.pop(0))
            made = True
            continue
        if made and line.startswith("MAKE_FUNCTION"):
            made = False
            continue
        made = False
        if pending and line == "CALL 0" and out[-1:] == ["GET_ITER"]:
            body = [b for b in pending.pop().listing if b != "COPY_FREE_VARS"]
            if "LOAD_FAST .0" in body:
                body.remove("LOAD_FAST .0")
            if body and body[-1] == "RETURN_VALUE":
                body.pop()
            tag = f"C{depth}.{len(out)}."
            out += [_relabel(b, tag) for b in (_splice(body, bodies, depth + 1) if depth < 16 else body)]
            continue
        out.append(line)
    return out


def _renumber(lines: list[str]) -> list[str]:
    """Labels renamed L1, L2, ... in the order they are defined."""
    names = {}
    for line in lines:
        if line.endswith(":") and " " not in line:
            names.setdefault(line[:-1], f"L{len(names) + 1}")
    out = []
    for line in lines:
        if line.endswith(":") and line[:-1] in names:
            out.append(f"{names[line[:-1]]}:")
            continue
        head, _, arg = line.rpartition(" ")
        out.append(f"{head} {names[arg]}" if head and arg in names else line)
    return out


def _relabel(line: str, tag: str) -> str:
    """Prefix jump labels (`L3:`, `JUMP L3`) so spliced bodies keep distinct labels."""
    head, _, arg = line.rpartition(" ")
    if line.endswith(":") and " " not in line:
        return f"{tag}{line}"
    if head and _is_label(arg):
        return f"{head} {tag}{arg}"
    return line


def _is_label(arg: str) -> bool:
    """Whether an operand is a jump label (`L3`, or `C0.12.L3` once spliced)."""
    tail = arg.rsplit(".", 1)[-1]
    return tail.startswith("L") and tail[1:].isdigit()


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
    rows, cols = linear_sum_assignment(m, maximize=True)
    return min(1.0, (exact_w + float(m[rows, cols].sum())) / total_w)


def _cos(res: MatchResult, delta: list[CodeView], gamma: list[CodeView]) -> float:
    total_w = max(sum(v.weight for v in delta), sum(v.weight for v in gamma)) or 1.0
    return min(1.0, sum(p.score * p.weight for p in res.pairs) / total_w)


def code_similarity(delta: list[CodeView], gamma: list[CodeView], *, optimal: bool = True, cache=None,
                    reference: bool = False) -> MatchResult:  # fmt: skip
    """Match model code with model code and framework code with framework code; combine their COs.

    `cache`: a `matching.IbssCache` shared by the comparisons of one attribution. `reference`: run
    the per-pair reference loops instead of the vectorised matching (tests compare the two)."""
    from zen.attribute import matching

    cache = cache if cache is not None else matching.IbssCache()
    parts = []
    for flag in (True, False):
        d = [v for v in delta if v.model_code is flag]
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
