"""PNG figures of `zen analyze` and `zen drift` (matplotlib, headless Agg backend).

Written beside analysis.json / drift.json and embedded by `zen report` (which checks each file
against the sha256 the JSON records). Saved without a timestamp: the same results give the same bytes.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

MAX_LINES = 10


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig, plt) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def robustness(robust: dict[str, Any]) -> bytes:
    """Accuracy (with labels) or the rate of changed predictions (without) against epsilon, per attack."""
    plt = _plt()
    labelled = robust.get("labelled")
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
    for name, rows in sorted(robust["attacks"].items()):
        xs = [0.0] + [r["eps"] for r in rows]
        if labelled:
            ys = [robust["clean_accuracy"]] + [r["accuracy"] for r in rows]
        else:
            ys = [0.0] + [r["changed"] for r in rows]
        ax.plot(xs, ys, marker="o", label=name.upper())
    ax.set_xlabel("epsilon (L-inf, input units)")
    ax.set_ylabel("accuracy" if labelled else "predictions changed")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("adversarial accuracy vs epsilon" if labelled else "prediction change rate vs epsilon")
    fig.tight_layout()
    return _png(fig, plt)


def anomaly(classes: list[dict[str, Any]], threshold: float) -> bytes:
    """Neural Cleanse: each class's trigger size (L1 of its mask) and anomaly index; flagged classes in red."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4), dpi=110)
    idx = [c["class"] for c in classes]
    colors = ["#b42318" if c["flagged"] else "#3a6f4f" for c in classes]
    a1.bar(range(len(idx)), [c["l1"] for c in classes], color=colors)
    a1.set_title("trigger size per class (L1 of the mask)")
    a2.bar(range(len(idx)), [c["anomaly_index"] for c in classes], color=colors)
    a2.axhline(threshold, color="#c27c0e", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    a2.set_title("anomaly index")
    a2.legend(fontsize=8)
    for ax in (a1, a2):
        ax.set_xticks(range(len(idx)), [str(i) for i in idx], fontsize=7 if len(idx) > 20 else 9)
        ax.set_xlabel("class")
    fig.tight_layout()
    return _png(fig, plt)


def _image(a: np.ndarray) -> np.ndarray:
    """CHW / HW array -> something imshow shows: grey for one channel, RGB for three, else channel 0."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 3:
        a = np.transpose(a, (1, 2, 0)) if a.shape[0] == 3 else a[0]
    if a.ndim == 1:
        a = a[None, :]
    lo, hi = float(np.min(a)), float(np.max(a))
    return (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)


def trigger(mask: np.ndarray, pattern: np.ndarray, label: str) -> bytes:
    """The reverse-engineered trigger of one class: its mask, its pattern, and mask x pattern (what is stamped)."""
    plt = _plt()
    m = np.asarray(mask, dtype=np.float64)
    p = np.asarray(pattern, dtype=np.float64)
    stamped = m * p if m.ndim == p.ndim else m[None] * p
    fig, axes = plt.subplots(1, 3, figsize=(7.5, 2.8), dpi=110)
    for ax, img, title in zip(axes, (m, p, stamped), ("mask", "pattern", "mask x pattern")):
        shown = _image(img)
        ax.imshow(shown, cmap=None if shown.ndim == 3 else "gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(label, fontsize=10)
    fig.tight_layout()
    return _png(fig, plt)


def drift_timeline(doc: dict[str, Any]) -> bytes:
    """Relative change from the first snapshot, per layer (the ones that moved most) and for the whole model."""
    plt = _plt()
    snaps = doc["snapshots"]
    xs = list(range(len(snaps)))
    fig, ax = plt.subplots(figsize=(7.5, 4), dpi=110)

    def ys(series: dict) -> list[float]:
        return [0.0] + [s["relative"] or 0.0 for s in series["snapshots"]]

    layers = sorted(doc["layers"], key=lambda lay: -ys(lay)[-1])[:MAX_LINES]
    for lay in layers:
        ax.plot(xs, ys(lay), marker=".", linewidth=1, label=lay["name"])
    ax.plot(xs, ys(doc["model_drift"]), marker="o", linewidth=2.5, color="black", label="whole model")
    ticks = [f"{i}\n{(s.get('acquired_at') or '')[11:19]}" for i, s in enumerate(snaps)]
    ax.set_xticks(xs, ticks, fontsize=8)
    ax.set_xlabel("snapshot (acquired, UTC)")
    ax.set_ylabel("||w - w0|| / ||w0||")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.set_title("weight drift from the first snapshot")
    fig.tight_layout()
    return _png(fig, plt)
