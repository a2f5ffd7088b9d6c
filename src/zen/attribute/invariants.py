"""Per-entry invariants: what attribution needs of a library entry, computed once at `library add`.

Attribution compares one recovered model with every candidate in the library. Before issue 16
each comparison decoded the entry's whole MR and PR JSON, rebuilt its module graph and ran a
dense `eigvalsh` on its Laplacian, and rebuilt its code views: on real entries (transformers
models hold ~3,400 code objects, timm's largest graphs ~1,400 modules) that was 0.1-0.7 s per
entry, so a library of 10,000 would have taken over an hour. None of it depends on the query, so
the library now stores, per entry:

* `MRFeatures`: the layer-type multiset, the tensor count/total/shape multiset, each layer's
  hyper-parameters in registration order (as canonical JSON strings, so equal layers are found by
  string equality), and the Laplacian spectrum (128 float64, stored as raw bytes so the stored
  value is bit-identical to the one `mr_similarity.spectrum` computes);
* the code views (`pr_similarity.views` of the entry's PR with its own model-code modules): per
  view the key, vector and the record fields attribution reports, in a columnar JSON form; the
  listing text and attribute set ("body") apart, stored once per distinct body however many
  entries hold it, and read only for the code the query does not hold identically.

`mr_score` computes exactly what `mr_similarity.mr_similarity` computes (same formulas, same float
operations in the same order, the operator terms summed with `math.fsum`), from two `MRFeatures`;
tests compare the two on real fingerprints. Bump `INVARIANTS_VERSION` whenever any of this changes:
entries stored with another version are recomputed from their MR/PR at query time.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from zen.attribute.code_views import CodeView, primary_modules, views
from zen.attribute.mr_similarity import MRScore, multiset_jaccard, ratio, spectrum
from zen.represent.jsontext import loads
from zen.represent.mr import ModelMR
from zen.represent.pr import ProgrammaticRepresentation

INVARIANTS_VERSION = 1


@dataclass
class MRFeatures:
    """The query-independent parts of the four MR measures."""

    arch: Counter  # layer type (class qualname) -> count
    ntensors: int  # unique (untied) state_dict tensors
    total: int  # their elements
    shapes: Counter  # shape tuple -> count
    ops: dict[str, list[str]]  # layer type -> hyper-parameters of each layer (canonical JSON), registration order
    spectrum: np.ndarray  # mr_similarity.spectrum of the module graph

    def to_json(self) -> dict[str, Any]:
        return {"arch": dict(sorted(self.arch.items())), "ntensors": self.ntensors, "total": self.total,
                "shapes": sorted([list(k), v] for k, v in self.shapes.items()), "ops": self.ops}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, Any], spec: np.ndarray) -> MRFeatures:
        return cls(Counter(d["arch"]), d["ntensors"], d["total"], Counter({tuple(k): v for k, v in d["shapes"]}),
                   d["ops"], spec)  # fmt: skip


def _canonical(hyper: dict) -> str:
    return json.dumps({k: v for k, v in hyper.items() if k != "training"}, sort_keys=True, separators=(",", ":"))


def mr_features(mr: ModelMR) -> MRFeatures:
    tensors = [t for t in mr.tensors if t.tied_to is None]
    ops: dict[str, list[str]] = {}
    for m in mr.modules:
        ops.setdefault(m.cls_qualname, []).append(_canonical(m.hyperparameters))
    return MRFeatures(
        Counter(m.cls_qualname for m in mr.modules), len(tensors), sum(math.prod(t.shape) for t in tensors),
        Counter(tuple(t.shape) for t in tensors), ops, spectrum(mr),
    )  # fmt: skip


class OpMemo:
    """Operator-term cache for one query: the term of two layers depends only on their two
    hyper-parameter strings, and library entries (forks, sizes of one family) repeat layers."""

    def __init__(self) -> None:
        self.terms: dict[tuple[str, str], float] = {}
        self.parsed: dict[str, dict] = {}

    def term(self, a: str, b: str) -> float:
        if a == b:
            return 1.0  # every key equal (or no keys): the reference's sum/len is exactly 1.0
        t = self.terms.get((a, b))
        if t is None:
            ha, hb = self._parse(a), self._parse(b)
            keys = set(ha) | set(hb)
            t = self.terms[(a, b)] = 1.0 if not keys else sum(ha.get(k) == hb.get(k) for k in keys) / len(keys)
        return t

    def _parse(self, s: str) -> dict:
        d = self.parsed.get(s)
        if d is None:
            d = self.parsed[s] = json.loads(s)
        return d


def mr_score(a: MRFeatures, b: MRFeatures, memo: OpMemo | None = None) -> MRScore:
    """`mr_similarity.mr_similarity(A, B)` from the two models' features (bit-identical)."""
    memo = memo or OpMemo()
    arch = multiset_jaccard(a.arch, b.arch)
    ts = (ratio(a.ntensors, b.ntensors) + ratio(a.total, b.total) + multiset_jaccard(a.shapes, b.shapes)) / 3
    terms: list[float] = []
    total = 0
    for t in set(a.ops) | set(b.ops):  # order-free: the terms are summed exactly (fsum), total is an int
        la, lb = a.ops.get(t, ()), b.ops.get(t, ())
        total += max(len(la), len(lb))
        terms += [memo.term(x, y) for x, y in zip(la, lb)]
    op = math.fsum(terms) / total if total else 1.0
    graph = float(max(0.0, 1.0 - np.mean(np.abs(a.spectrum - b.spectrum)) / 2.0))
    return MRScore(arch, ts, op, graph)


# -- code views --------------------------------------------------------------------------------


class StoredCode(NamedTuple):
    """The few fields of a library entry's code record that attribution reports (Pair.base); a
    tuple, as thousands are made per entry read."""

    address: str
    qualname: str
    module: str
    owner_class: str | None


class Bodies:
    """Fetches the stored bodies (listing text, attribute set) of one entry's views on demand.

    `fetch(keys)` returns {body key: (zlib-compressed text, attribute-set JSON)}; the library
    stores each distinct body once (`code_bodies`), however many entries hold that code."""

    def __init__(self, fetch: Callable[[list[str]], dict[str, tuple[bytes, str]]]) -> None:
        self.fetch = fetch

    def load(self, vs: list[StoredView]) -> None:
        want = [v for v in vs if v.attrs_json is None]
        if not want:
            return
        got = self.fetch(sorted({v.body_key for v in want}))
        for v in want:
            text, attrs = got[v.body_key]
            _TEXT_SLOT.__set__(v, zlib.decompress(text).decode("utf-8", "surrogatepass"))
            v.attrs_json = attrs


class StoredView(CodeView):
    """A library entry's code view as stored: key, record fields and vector at hand, the listing
    text and attribute set fetched and parsed on first use. Most of an entry's code is identical to
    the query's and paired by key alone (a transformers entry: ~2,900 of ~3,400 code objects), so
    most bodies are never read; reading and parsing them all was the largest cost of an entry."""

    __slots__ = ("body_key", "bodies", "attrs_json")

    @property
    def text(self) -> str:  # type: ignore[override]
        if self.attrs_json is None:
            self.bodies.load([self])
        return _TEXT_SLOT.__get__(self)

    @property
    def attrs(self) -> frozenset:  # type: ignore[override]
        try:
            return _ATTRS_SLOT.__get__(self)
        except AttributeError:
            if self.attrs_json is None:
                self.bodies.load([self])
            value = frozenset(map(tuple, loads(self.attrs_json)))
            _ATTRS_SLOT.__set__(self, value)
            return value


_ATTRS_SLOT = CodeView.__dict__["attrs"]  # the slots under StoredView's properties
_TEXT_SLOT = CodeView.__dict__["text"]


def load_bodies(vs: list[CodeView]) -> None:
    """Fetch the bodies of the stored views among `vs`, one query per entry (before scoring them)."""
    groups: dict[int, tuple[Bodies, list[StoredView]]] = {}
    for v in vs:
        if isinstance(v, StoredView) and v.attrs_json is None:
            groups.setdefault(id(v.bodies), (v.bodies, []))[1].append(v)
    for bodies, group in groups.values():
        bodies.load(group)


def _body(v: CodeView) -> tuple[str, bytes, str]:
    """(key, compressed text, attribute-set JSON) of a view's body; the key is their sha256."""
    attrs = json.dumps(sorted(v.attrs), separators=(",", ":"), ensure_ascii=False)
    text = v.text.encode("utf-8", "surrogatepass")
    key = hashlib.sha256(text + b"\0" + attrs.encode("utf-8", "surrogatepass")).hexdigest()
    return key, zlib.compress(text, 6), attrs


def views_to_json(vs: list[CodeView], body_keys: list[str]) -> dict[str, Any]:
    return {
        "codes": [[v.rec.address, v.rec.qualname, v.rec.module, v.rec.owner_class] for v in vs],
        "keys": [v.key for v in vs], "bodies": body_keys, "vectors": [list(v.vector) for v in vs],
        "model_code": [v.model_code for v in vs], "weights": [v.weight for v in vs],
    }  # fmt: skip


def views_from_json(d: dict[str, Any], bodies: Bodies) -> list[CodeView]:
    out: list[CodeView] = []
    make = StoredCode._make
    for rec, key, body, vec, mc, w in zip(d["codes"], d["keys"], d["bodies"], d["vectors"], d["model_code"], d["weights"]):
        v = StoredView.__new__(StoredView)
        v.rec, v.key, v.vector, v.model_code, v.weight = make(rec), key, tuple(vec), mc, w
        v.body_key, v.bodies, v.attrs_json = body, bodies, None
        out.append(v)
    return out


@dataclass
class Invariants:
    """What `Library.add` stores next to an entry (see the module docstring)."""

    mr: MRFeatures
    views: list[CodeView]
    listing_version: int

    def pack(self) -> tuple[tuple[int, bytes, bytes, bytes], list[tuple[str, bytes, str]]]:
        """((version, mr blob, spectrum blob, views blob), bodies) as the library stores them: the
        first in the `invariants` table, the bodies (key, compressed text, attrs) in `code_bodies`."""
        mr = {**self.mr.to_json(), "listing_version": self.listing_version}
        bodies = [_body(v) for v in self.views]
        row = (INVARIANTS_VERSION, _pack(mr), np.ascontiguousarray(self.mr.spectrum, dtype="<f8").tobytes(),
               _pack(views_to_json(self.views, [b[0] for b in bodies])))  # fmt: skip
        return row, bodies


def _pack(obj: Any) -> bytes:
    return zlib.compress(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"), 6)


def _unpack(blob: bytes) -> Any:
    # the bytes as they are: json decodes them with surrogatepass as the text was encoded (no str copy made first)
    return loads(zlib.decompress(blob))


def packed(mr: ModelMR, pr: ProgrammaticRepresentation) -> tuple:
    """The packed invariants a library stores for an entry (the function commands give `open_library`)."""
    return invariants(mr, pr).pack()


def invariants(mr: ModelMR, pr: ProgrammaticRepresentation) -> Invariants:
    return Invariants(mr_features(mr), views(pr, primary_modules(mr)), pr.listing_version)


def unpack_mr(mr_blob: bytes, spec_blob: bytes) -> tuple[MRFeatures, int]:
    """(features, listing version) from the stored blobs."""
    d = _unpack(mr_blob)
    return MRFeatures.from_json(d, np.frombuffer(spec_blob, dtype="<f8").astype(np.float64)), d["listing_version"]


def unpack_views(blob: bytes, fetch: Callable[[list[str]], dict[str, tuple[bytes, str]]]) -> list[CodeView]:
    """An entry's stored views; `fetch` reads bodies from the library (see `Bodies`)."""
    return views_from_json(_unpack(blob), Bodies(fetch))
