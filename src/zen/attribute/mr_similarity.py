"""Mathematical-representation similarity (ZEN §IV-B1, Table VI columns Arch, TS, OP, and the graph).

Every measure is symmetric, in [0, 1], and exactly 1.0 when a model is compared with itself:

* arch:  multiset Jaccard of layer types (class qualnames, so a module moved between packages
         still counts);
* ts:    tensors: mean of the count ratio, the parameter-total ratio and the multiset Jaccard of
         tensor shapes;
* op:    operators: layers of each type paired in registration order, each pair scored by the
         share of hyper-parameters with equal values (missing layers score 0);
* graph: spectral similarity of the module graphs (hierarchy + data-flow edges): the normalised
         Laplacian spectra of both graphs, resampled to common quantiles, compared by mean
         absolute difference (eigenvalues lie in [0, 2]). Spectra ignore node names and are
         unchanged by widening layers, so the graph is the most stable identifier. Library
         entries store their spectrum (zen.attribute.invariants); it is computed on one BLAS
         thread, so it is the same bits however loaded the machine was.

MRSS = 0.4·graph + 0.2·arch + 0.2·ts + 0.2·op: a weighted mean weighted toward the graph, as the
paper prescribes ("the overall architecture is a more stable identifier than layer-specific
attributes").
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from zen.represent.mr import ModelMR

WEIGHTS = {"graph": 0.4, "arch": 0.2, "ts": 0.2, "op": 0.2}
SPECTRUM_POINTS = 128


def multiset_jaccard(a: Counter, b: Counter) -> float:
    keys = set(a) | set(b)
    if not keys:
        return 1.0
    inter = sum(min(a[k], b[k]) for k in keys)
    union = sum(max(a[k], b[k]) for k in keys)
    return inter / union


def ratio(x: float, y: float) -> float:
    if x == y:
        return 1.0
    return min(x, y) / max(x, y) if max(x, y) > 0 else 1.0


def arch_similarity(a: ModelMR, b: ModelMR) -> float:
    return multiset_jaccard(Counter(m.cls_qualname for m in a.modules), Counter(m.cls_qualname for m in b.modules))


def _unique_tensors(mr: ModelMR):
    return [t for t in mr.tensors if t.tied_to is None]


def tensor_similarity(a: ModelMR, b: ModelMR) -> float:
    ta, tb = _unique_tensors(a), _unique_tensors(b)
    count = ratio(len(ta), len(tb))
    total = ratio(sum(math.prod(t.shape) for t in ta), sum(math.prod(t.shape) for t in tb))
    shapes = multiset_jaccard(Counter(tuple(t.shape) for t in ta), Counter(tuple(t.shape) for t in tb))
    return (count + total + shapes) / 3


def _hyper(m) -> dict:
    return {k: v for k, v in m.hyperparameters.items() if k != "training"}


def operator_similarity(a: ModelMR, b: ModelMR) -> float:
    by_a: dict[str, list[dict]] = {}
    by_b: dict[str, list[dict]] = {}
    for m in a.modules:
        by_a.setdefault(m.cls_qualname, []).append(_hyper(m))
    for m in b.modules:
        by_b.setdefault(m.cls_qualname, []).append(_hyper(m))
    # fsum: exactly rounded, so the score does not depend on the (hash-seeded) order of layer types,
    # and operator_similarity(a, b) == operator_similarity(b, a) to the last bit.
    terms: list[float] = []
    total = 0
    for t in sorted(set(by_a) | set(by_b)):
        la, lb = by_a.get(t, []), by_b.get(t, [])
        total += max(len(la), len(lb))
        for ha, hb in zip(la, lb):
            keys = set(ha) | set(hb)
            terms.append(1.0 if not keys else sum(ha.get(k) == hb.get(k) for k in keys) / len(keys))
    return math.fsum(terms) / total if total else 1.0


def module_graph(mr: ModelMR) -> tuple[list, set[tuple]]:
    """(nodes in sorted order, undirected edges as (u, v) with u <= v) of the module graph: every module's path,
    hierarchy edges (whose ends become nodes), data-flow edges between modules (no self-edges). A hierarchy edge
    from a node to itself is kept, as a self-loop (a hostile MR's)."""
    paths = {m.path for m in mr.modules}
    nodes = set(paths)
    edges: set[tuple] = set()
    for parent, child, _ in mr.graph.get("hierarchy", []):
        nodes.add(parent)
        nodes.add(child)
        edges.add((parent, child) if parent <= child else (child, parent))
    for src, dst in mr.graph.get("dataflow", []):
        if src in paths and dst in paths and src != dst:
            edges.add((src, dst) if src <= dst else (dst, src))
    return sorted(nodes), edges


def normalized_laplacian(nodes: list, edges: set[tuple]) -> np.ndarray:
    """I - D^-1/2 A D^-1/2 of the graph, dense, bit for bit what networkx's `normalized_laplacian_matrix(g,
    nodelist=nodes).toarray()` gives. Why not networkx: importing it and scipy.sparse (which it uses) was 0.2 s
    of every `zen attribute`, more than the query's spectrum itself. Why the same bits: networkx forms
    DH @ ((D - A) @ DH) as sparse products in which every entry is a sum of one term (0 + x, exact), so entry
    (i, j) is dh_i * ((D - A)_ij * dh_j), computed here in that order; a self-loop counts once in A and in the
    degree, as there. The tests compare the two on real module graphs and on hostile ones."""
    n = len(nodes)
    at = {v: i for i, v in enumerate(nodes)}
    adj = np.zeros((n, n), dtype=np.int64)
    if edges:
        ij = np.array([(at[u], at[v]) for u, v in edges], dtype=np.intp)
        adj[ij[:, 0], ij[:, 1]] = 1
        adj[ij[:, 1], ij[:, 0]] = 1
    deg = adj.sum(axis=1)
    lap = np.diag(deg) - adj
    with np.errstate(divide="ignore"):
        dh = 1.0 / np.sqrt(deg)
    dh[np.isinf(dh)] = 0
    return dh[:, None] * (lap * dh[None, :])


def spectrum(mr: ModelMR) -> np.ndarray:
    """The normalised Laplacian spectrum of the module graph, resampled to SPECTRUM_POINTS quantiles."""
    nodes, edges = module_graph(mr)
    if not nodes:
        return np.zeros(SPECTRUM_POINTS)
    from zen.attribute.blas import one_thread

    lap = normalized_laplacian(nodes, edges)
    with one_thread():  # 20-70x faster on a busy 2-core machine, and reproducible (see zen.attribute.blas)
        ev = np.sort(np.linalg.eigvalsh(lap))
    q = np.linspace(0, 1, SPECTRUM_POINTS)
    return np.interp(q, np.linspace(0, 1, len(ev)), ev)


def graph_similarity(a: ModelMR, b: ModelMR) -> float:
    sa, sb = spectrum(a), spectrum(b)
    return float(max(0.0, 1.0 - np.mean(np.abs(sa - sb)) / 2.0))


@dataclass
class MRScore:
    arch: float
    ts: float
    op: float
    graph: float

    @property
    def mrss(self) -> float:
        parts = (WEIGHTS["graph"] * self.graph, WEIGHTS["arch"] * self.arch, WEIGHTS["ts"] * self.ts, WEIGHTS["op"] * self.op)
        return min(1.0, math.fsum(parts))


def mr_similarity(a: ModelMR, b: ModelMR) -> MRScore:
    return MRScore(arch_similarity(a, b), tensor_similarity(a, b), operator_similarity(a, b), graph_similarity(a, b))
