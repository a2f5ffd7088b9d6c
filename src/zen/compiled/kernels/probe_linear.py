"""Probing for data-movement kernels: recover a kernel as a sum of scaled gathers of its inputs.

Reshape/transpose/broadcast/take-with-constant-indices chains (and their fusions with a scalar
multiply or a residual add) are linear in each input with one source element per output element.
Feeding the kernel zeros, ones and `1..n` on one input at a time reads that map off directly:
base = f(0), scale = f(e_i) - base, source index = (f(1..n) - base) / scale - 1. A random-input
run then confirms y = base + sum_i scale_i * x_i.flat[index_i]. The map is written as a reshape
or a permute where it is one, else as an index buffer. Runs inside the probing child.
"""

from __future__ import annotations

import itertools

import numpy as np

MAX_ELEMENTS = 1 << 22  # float32 represents every index exactly below 2**24


def _uniform(a: np.ndarray, tol: float = 1e-6) -> float | None:
    if a.size == 0:
        return 0.0
    v = float(a.flat[0])
    return v if np.all(np.abs(a - v) <= tol * (1 + abs(v))) else None


def _view_form(index: np.ndarray, in_shape: tuple[int, ...]) -> list[int] | None:
    """A permutation p with x.permute(p).reshape(out) == x.flat[index], if one exists."""
    n = int(np.prod(in_shape))
    if index.size != n or len(in_shape) > 6:
        return None
    src = np.arange(n).reshape(in_shape)
    for p in itertools.permutations(range(len(in_shape))):
        if np.array_equal(src.transpose(p).ravel(), index.ravel()):
            return list(p)
    return None


def probe_linear(k) -> dict | None:
    """Steps reproducing kernel `k` as scaled gathers, or None where it is not such a kernel.

    A kernel with several outputs (split) gets one step list per output, under "per_output"."""
    spec = k.spec
    if any(o.dtype.kind != "f" for o in k.outputs):
        return None
    vals = [i for i, s in enumerate(spec["inputs"]) if s["kind"] != "const"]
    if not vals or any(k.inputs[i].dtype.kind != "f" or k.inputs[i].size >= MAX_ELEMENTS for i in vals):
        return None
    zeros = [np.zeros_like(a) if i in vals else a for i, a in enumerate(k.inputs)]
    base = [o.astype(np.float64) for o in k.run(zeros)]
    runs = {}
    for i in vals:
        ones, ramp = list(zeros), list(zeros)
        ones[i] = np.ones_like(k.inputs[i])
        ramp[i] = (np.arange(k.inputs[i].size, dtype=np.float64) + 1).astype(k.inputs[i].dtype).reshape(k.inputs[i].shape)
        runs[i] = (k.run(ones), k.run(ramp))
    rng = np.random.default_rng(7)
    trial = [rng.standard_normal(a.shape).astype(a.dtype) if i in vals else a for i, a in enumerate(k.inputs)]
    got_all = k.run(trial)
    per_output, worst = [], 0.0
    for o, b in enumerate(base):
        terms = []
        for i in vals:
            x = k.inputs[i]
            scale = runs[i][0][o].astype(np.float64) - b
            raw = runs[i][1][o].astype(np.float64) - b
            dep = np.abs(scale) > 1e-12
            if not dep.any():
                continue
            s = _uniform(scale[dep])
            if s is None:
                return None
            idx = np.full(b.shape, x.size, dtype=np.int64)  # x.size: the zero appended to x (no dependency)
            pos = raw[dep] / s - 1
            if np.abs(pos - np.round(pos)).max(initial=0) > 1e-3:
                return None
            idx[dep] = np.round(pos).astype(np.int64)
            if idx.min() < 0 or idx.max() > x.size:
                return None
            terms.append((i, s, idx))
        if not terms:
            return None
        got = got_all[o].astype(np.float64)
        pred = b.copy()
        for i, s, idx in terms:
            pred += s * np.append(trial[i].ravel().astype(np.float64), 0.0)[idx]
        err = float(np.abs(got - pred).max(initial=0.0) / (1 + np.abs(got).max(initial=0.0)))
        if err > 1e-5:
            return None
        worst = max(worst, err)
        per_output.append(_steps(k, terms, b, list(b.shape), k.outputs[o].dtype))
    res = {"status": "ok", "steps": per_output[0], "error": worst, "method": "linear gather probe"}
    if len(per_output) > 1:
        res["per_output"] = per_output
    return res


def _steps(k, terms: list, base: np.ndarray, shape: list[int], dtype) -> list:
    steps = []
    shift = _uniform(base)
    for j, (i, s, idx) in enumerate(terms):
        attrs: dict = {"shape": shape, "scale": s}
        in_shape = tuple(k.spec["inputs"][i]["shape"])
        if (idx < k.inputs[i].size).all():
            perm = _view_form(idx, in_shape)
            if perm is not None:
                attrs["perm"] = perm
        if "perm" not in attrs:
            attrs["index"] = idx.ravel().tolist()
        if j == 0:
            attrs["shift"] = shift if shift is not None else base.astype(dtype).ravel().tolist()
        steps.append(("gather", attrs, [("in", i)] if j == 0 else [("cur",), ("in", i)], None))
    return steps
