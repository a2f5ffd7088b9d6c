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

import networkx as nx
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


def module_graph(mr: ModelMR) -> nx.Graph:
    g = nx.Graph()
    paths = {m.path for m in mr.modules}
    g.add_nodes_from(paths)
    for parent, child, _ in mr.graph.get("hierarchy", []):
        g.add_edge(parent, child)
    for src, dst in mr.graph.get("dataflow", []):
        if src in paths and dst in paths and src != dst:
            g.add_edge(src, dst)
    return g


def spectrum(g: nx.Graph) -> np.ndarray:
    if g.number_of_nodes() == 0:
        return np.zeros(SPECTRUM_POINTS)
    from zen.attribute.blas import one_thread

    lap = nx.normalized_laplacian_matrix(g, nodelist=sorted(g.nodes)).toarray()
    with one_thread():  # 20-70x faster on a busy 2-core machine, and reproducible (see zen.attribute.blas)
        ev = np.sort(np.linalg.eigvalsh(lap))
    q = np.linspace(0, 1, SPECTRUM_POINTS)
    return np.interp(q, np.linspace(0, 1, len(ev)), ev)


def graph_similarity(a: ModelMR, b: ModelMR) -> float:
    sa, sb = spectrum(module_graph(a)), spectrum(module_graph(b))
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
