"""Constants read off a kernel's measured outputs (probing child): an affine map, clamp bounds, a leaky
ReLU slope, quantization scales and zero points.

Elementwise tails with constants baked into the kernel (a scalar multiply, a clamp, a quantize) are not
enumerated like conv settings: their values are fitted to what the kernel computed, then checked like
every other candidate. Every fit here is a pure function of the kernel's inputs and outputs (fixed
seeds), so the same library gives the same constants.
"""

from __future__ import annotations

import numpy as np


def fitted(u, ref: np.ndarray, torch) -> list[dict]:
    """An affine map y = a*u + b and a leaky ReLU slope fitted to the measured output."""
    try:
        x = u.detach().numpy().astype(np.float64).ravel()
        y = ref.astype(np.float64).ravel()
    except (AttributeError, ValueError):
        return []
    if x.shape != y.shape or x.size < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return []
    if ref.dtype.kind in "iu":
        return quantize(x, y, ref.dtype)
    res = []
    try:
        a, b = np.polyfit(x, y, 1)
    except (np.linalg.LinAlgError, ValueError):
        return []
    if abs(b) <= 1e-6 * (1 + np.abs(y).max()):
        b = 0.0  # least-squares noise, not an offset
    res.append({"fn": "affine", "scale": float(a), "shift": float(b)})
    # a bound is only known where it acted: some inputs beyond it came out equal to it
    lo = float(np.round(y.min(), 6)) if (x < y.min() - 1e-6).any() else None
    hi = float(np.round(y.max(), 6)) if (x > y.max() + 1e-6).any() else None
    if lo is not None or hi is not None:
        res.append({"fn": "clamp", "lo": lo, "hi": hi})
    neg = x < -1e-3
    if neg.any():
        res.append({"fn": "leaky_relu", "slope": float(np.median(y[neg] / x[neg]))})
    res += fake_quant(x, y)
    return res


def samples(k, runs: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, outputs) of a one-input kernel over `runs` extra random inputs (flattened, float64)."""
    x0 = k.inputs[0]
    if x0.dtype.kind != "f":
        return x0.astype(np.float64).ravel(), k.outputs[0].astype(np.float64).ravel()
    rng = np.random.default_rng(5)
    xs, ys = [x0.ravel()], [k.outputs[0].ravel()]
    for _ in range(runs):
        x = (rng.standard_normal(x0.shape) * float(np.abs(x0).max() or 1.0) / 2).astype(x0.dtype)
        xs.append(x.ravel())
        ys.append(k.run([x])[0].ravel())
    return np.concatenate(xs).astype(np.float64), np.concatenate(ys).astype(np.float64)


def quantize(x: np.ndarray, y: np.ndarray, dtype: np.dtype) -> list[dict]:
    """A quantize kernel (float -> integer): the slope of its unclamped part is 1/scale, the offset the zero point."""
    info = np.iinfo(dtype)
    inner = (y > info.min) & (y < info.max)
    if inner.sum() < 2 or np.ptp(x[inner]) == 0:
        return []
    slope = float(np.polyfit(x[inner], y[inner], 1)[0])
    if slope <= 0:
        return []
    zp = int(np.round(np.median(y[inner] - x[inner] * slope)))
    # each sample bounds 1/scale: round(x / scale) = y - zp means x / scale lies within 0.5 of it
    xs, k = x[inner], y[inner] - zp
    far = np.abs(xs) > 1e-6
    a, b = (k[far] - 0.5) / xs[far], (k[far] + 0.5) / xs[far]
    lo, hi = float(np.minimum(a, b).max()), float(np.maximum(a, b).min())
    inv = (lo + hi) / 2 if lo <= hi else slope
    scale = float(np.float32(1.0 / inv))
    return [
        {"fn": "quantize", "scale": scale, "zero_point": zp, "qmin": int(info.min), "qmax": int(info.max), "dtype": str(dtype)}
    ]


def fake_quant(x: np.ndarray, y: np.ndarray) -> list[dict]:
    """Quantize-dequantize read off its output: values on a grid of step `scale`, clamped where the integer
    range ends (int8 or uint8); the zero point is where the clamp sits on the grid (0 when none acted)."""
    levels = np.unique(y)
    if not 2 < levels.size <= 256:
        return []
    step = float(np.diff(levels).min())
    if step <= 0 or np.abs(np.diff(levels) / step - np.round(np.diff(levels) / step)).max() > 1e-3:
        return []
    span = float(levels[-1] - levels[0])  # the whole range over its step count: a finer estimate than one step
    scale = float(np.float32(span / round(span / step)))
    res = []
    for qmin, qmax in ((-128, 127), (0, 255)):
        zp = 0
        if (x > y.max() + scale).any():
            zp = qmax - int(round(y.max() / scale))
        elif (x < y.min() - scale).any():
            zp = qmin - int(round(y.min() / scale))
        if qmin <= zp <= qmax:
            res.append({"fn": "fake_quant", "scale": scale, "zero_point": zp, "qmin": qmin, "qmax": qmax})
    return res
