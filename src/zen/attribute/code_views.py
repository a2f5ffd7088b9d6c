"""Code views: how a programmatic representation's code objects are seen when two models are compared.

Each model-specific code object becomes a `CodeView` (its normalised listing with comprehensions inlined, attributes
and hashes); `Pair` and `MatchResult` are what a matching of two sets of views gives. Shared by the reference
definitions (pr_similarity.py), the vectorised matching (matching.py) and the invariants a library stores
(invariants.py), which is why they live here and not in any of those.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from rapidfuzz import fuzz

from zen.represent.mr import ModelMR
from zen.represent.pr import CodeRecord, ProgrammaticRepresentation

TOP_N = 3
OPTIMAL_LIMIT = 300 * 300  # pairs scored exhaustively for the optimal assignment


def primary_modules(mr: ModelMR) -> set[str]:
    """Modules defining the model's own module classes (framework modules excluded)."""
    from zen.cpython.program.exclusion import excluded

    return {m.cls_module for m in mr.modules if not excluded(m.cls_module)}


class CodeView:
    """A code record with its comparison features computed once."""

    __slots__ = ("rec", "attrs", "vector", "text", "weight", "model_code", "key")

    def __init__(
        self, rec: CodeRecord, weight: float = 1.0, model_code: bool = True, inlined: list[CodeRecord] | None = None
    ) -> None:
        self.rec = rec
        self.attrs = _attrs(rec, [rec, *(inlined or ())])
        self.vector = _vector(rec)
        listing = inline_comprehensions(rec.listing, inlined) if inlined else rec.listing
        self.text = "\n".join(listing)
        self.key = rec.listing_sha256 if not inlined else hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()
        self.weight = weight
        self.model_code = model_code


def _attrs(rec: CodeRecord, parts: list[CodeRecord]) -> frozenset:
    short = rec.qualname.rsplit(".", 1)[-1]
    return frozenset([("q", short)] + [("n", n) for r in parts for n in r.names]
                     + [("v", v) for r in parts for v in r.varnames if v != ".0"]
                     + [("c", c) for r in parts for c in r.consts if not c.startswith("<code ")]
                     + [("f", f) for r in parts for f in r.freevars])  # fmt: skip


def _vector(rec: CodeRecord) -> tuple[int, int, int]:
    calls = sum(1 for line in rec.listing if line.startswith("CALL"))
    return (rec.argcount + rec.kwonlyargcount, rec.nlocals, calls)


class LazyView(CodeView):
    """A `CodeView` of a record with no comprehension inlined, whose attribute set, vector and text are computed
    on first use. Why: the query's views are made for every code object (a transformers process: ~3,900), but
    matching reads those three only for the views no candidate holds identically (a few hundred; the others pair
    by key), and computing them for all was most of the query's 0.15 s of views. The values are `CodeView`'s."""

    __slots__ = ()

    def __init__(self, rec: CodeRecord, weight: float = 1.0, model_code: bool = True) -> None:
        self.rec, self.key, self.weight, self.model_code = rec, rec.listing_sha256, weight, model_code

    @property
    def attrs(self) -> frozenset:  # type: ignore[override]
        return _lazy(self, _ATTRS, lambda r: _attrs(r, [r]))

    @property
    def vector(self) -> tuple[int, int, int]:  # type: ignore[override]
        return _lazy(self, _VECTOR, _vector)

    @property
    def text(self) -> str:  # type: ignore[override]
        return _lazy(self, _TEXT, lambda r: "\n".join(r.listing))


_ATTRS, _VECTOR, _TEXT = (CodeView.__dict__[n] for n in ("attrs", "vector", "text"))  # the slots under the properties


def _lazy(v: CodeView, slot, make):
    try:
        return slot.__get__(v)
    except AttributeError:
        value = make(v.rec)
        slot.__set__(v, value)
        return value


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

    def summary(self) -> tuple[int, int, int, int, float, float]:
        """(identical pairs, changed pairs, added, base left unmatched, mean Attr SS and mean IBSS of the changed
        pairs (1.0 with none)): what an attribution reports of a comparison."""
        fuzzy = [p for p in self.pairs if not p.exact]
        exact = len(self.pairs) - len(fuzzy)
        attr = sum(p.attr for p in fuzzy) / len(fuzzy) if fuzzy else 1.0
        ibss = sum(p.ibss for p in fuzzy) / len(fuzzy) if fuzzy else 1.0
        return exact, len(fuzzy), len(self.added), len(self.unmatched_base), attr, ibss


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
        model = primary is None or c.module in primary
        if not kids:
            out.append(LazyView(c, 1.0, model))
            continue
        v = CodeView(c, 1.0, model, kids)
        v.text = "\n".join(_uncell(v.text.splitlines(), c, kids, by_addr))
        v.key = hashlib.sha256(v.text.encode("utf-8", "surrogatepass")).hexdigest()
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
    """Labels renamed L1, L2, ... in the order they are defined.

    A line can name a label only in its last word, so a line whose last character ends no label is kept without
    being split (most lines: the query's views spent 0.016 s of `zen attribute` here, splitting every line)."""
    names = {}
    for line in lines:
        if line.endswith(":") and " " not in line:
            names.setdefault(line[:-1], f"L{len(names) + 1}")
    ends = {k[-1:] or " " for k in names}  # (a label named "" is the last word of a line ending in a space)
    out = []
    for line in lines:
        last = line[-1:]
        if last == ":" and line[:-1] in names:
            out.append(f"{names[line[:-1]]}:")
            continue
        if last not in ends:
            out.append(line)
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
