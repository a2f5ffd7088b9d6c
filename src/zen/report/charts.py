"""PNG charts for reports and evaluation tables (matplotlib, headless Agg backend)."""

from __future__ import annotations

import io


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def score_bars(candidates: list[dict], limit: int = 10) -> bytes:
    """Horizontal bars of UR (with MR and PR) for the top candidates of an attribution."""
    plt = _plt()
    top = candidates[:limit][::-1]
    names = [c["name"] for c in top]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(top) + 1.2), dpi=110)
    y = range(len(top))
    ax.barh([i + 0.27 for i in y], [c["mr"] or 0 for c in top], height=0.25, label="MR", color="#9bbbd4")
    ax.barh([i for i in y], [c["pr"] or 0 for c in top], height=0.25, label="PR", color="#e8b07a")
    ax.barh([i - 0.27 for i in y], [c["ur"] or 0 for c in top], height=0.25, label="UR", color="#3a6f4f")
    ax.set_yticks(list(y), names)
    ax.set_xlim(0, 1)
    ax.set_xlabel("similarity")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("attribution: similarity to each base model")
    fig.tight_layout()
    return _png(fig, plt)


def heatmap(matrix: list[list[float]], rows: list[str], cols: list[str], title: str) -> bytes:
    """A similarity heatmap (ZEN Fig. 3): rows = recovered models, columns = base models."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.1 * len(cols) + 2.5, 0.5 * len(rows) + 1.6), dpi=110)
    im = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white" if v < 0.6 else "black")
    fig.colorbar(im, ax=ax, fraction=0.04)
    ax.set_title(title)
    fig.tight_layout()
    return _png(fig, plt)


def _png(fig, plt) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})  # no timestamp: same data, same bytes
    plt.close(fig)
    return buf.getvalue()
