"""Plots as matplotlib figures (PNG files and TensorBoard images); no display needed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["margin_figure", "embedding_figure", "confusion_figure", "save_figure"]


def _plt() -> Any:
    """``matplotlib.pyplot``, on the Agg backend outside Jupyter."""
    import sys

    import matplotlib

    # scripts and training jobs draw into files (Agg: no display needed); inside a Jupyter kernel
    # the kernel's backend (inline) stays, else the user's own plots stop showing after a callback ran
    if "ipykernel" not in sys.modules:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def margin_figure(steps: Sequence[int], margins: np.ndarray, names: Sequence[str], frozen_step: int | None = None) -> Any:
    """CLOC margins over training: one line per adjacent class pair.

    Args:
        steps: global steps ``[T]``; margins: ``[T, C-1]``; names: ``['C0-C1', ...]``;
        frozen_step: draw a vertical line where phase two began.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    m = np.asarray(margins)
    cmap = plt.get_cmap("viridis")
    for i, name in enumerate(names):
        ax.plot(steps, m[:, i], label=name, color=cmap(i / max(1, len(names) - 1)))
    if frozen_step is not None:
        ax.axvline(frozen_step, color="k", ls="--", lw=1)
        ax.text(frozen_step, ax.get_ylim()[1], " margins frozen", va="top", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("margin (softplus)")
    ax.set_title("CLOC adjacent-class margins")
    ax.legend(fontsize=7, ncol=2 if len(names) > 5 else 1, loc="best")
    fig.tight_layout()
    return fig


def embedding_figure(points: np.ndarray, labels: np.ndarray, class_names: Sequence[str] | None = None, title: str = "") -> Any:
    """2-D scatter of an embedding coloured by rank (ordinal colour map)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.8, 4.2), dpi=100)
    labels = np.asarray(labels)
    n = int(labels.max()) + 1 if labels.size else 1
    sc = ax.scatter(points[:, 0], points[:, 1], c=labels, cmap="viridis", s=6, vmin=0, vmax=max(1, n - 1), alpha=0.8)
    cb = fig.colorbar(sc, ax=ax, ticks=range(n))
    if class_names is not None and len(class_names) == n:
        cb.ax.set_yticklabels(list(class_names), fontsize=7)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title or "validation embedding", fontsize=10)
    fig.tight_layout()
    return fig


def confusion_figure(matrix: np.ndarray, class_names: Sequence[str] | None = None, title: str = "") -> Any:
    """Row-normalised confusion matrix (true class rows, predicted class columns) with counts."""
    plt = _plt()
    cm = np.asarray(matrix, dtype=np.float64)
    n = cm.shape[0]
    norm = cm / np.clip(cm.sum(axis=1, keepdims=True), 1, None)
    fig, ax = plt.subplots(figsize=(0.5 * n + 2.5, 0.5 * n + 2.0), dpi=100)
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    names = list(class_names) if class_names is not None else [str(i) for i in range(n)]
    ax.set_xticks(range(n), names, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(n), names, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    if n <= 20:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{int(cm[i, j])}", ha="center", va="center", fontsize=6, color="white" if norm[i, j] > 0.5 else "black")
    ax.set_title(title or "confusion matrix", fontsize=10)
    fig.tight_layout()
    return fig


def save_figure(fig: Any, path: str) -> None:
    """Write ``fig`` as PNG and close it."""
    fig.savefig(path)
    _plt().close(fig)
