"""Shared pieces of the pictures: argument checks, axes, tick labels, numbers in cells, colour bars."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from graphattn.validate import message

QUERY_LABEL = "query i (target)"
KEY_LABEL = "key j (source)"


def as_numpy(x, name: str, ndim: int | None = None) -> np.ndarray:
    """Return ``x`` (Tensor or array-like) as a float64 / bool numpy array, checking ``ndim``."""
    if isinstance(x, Tensor):
        x = x.detach().cpu()
        x = x.numpy() if x.dtype == torch.bool else x.double().numpy()
    else:
        x = np.asarray(x)
    if ndim is not None and x.ndim != ndim:
        raise ValueError(message(name, f"{ndim} dimensions", f"shape {tuple(x.shape)}", verb="have"))
    return x


def check_labels(labels, n: int, name: str) -> list[str] | None:
    if labels is None:
        return None
    labels = [str(t) for t in labels]
    if len(labels) != n:
        raise ValueError(message(name, f"{n} entries", len(labels), verb="have"))
    return labels


def get_ax(ax):
    import matplotlib.pyplot as plt

    return plt.gca() if ax is None else ax


def color_range(data: np.ndarray, vmin: float | None, vmax: float | None) -> tuple[float, float]:
    """``(vmin, vmax)`` of a colour scale: given values win, else 0 (or the minimum if negative) and the maximum."""
    finite = data[np.isfinite(data)] if data.size else data
    low = (min(0.0, float(finite.min())) if finite.size else 0.0) if vmin is None else float(vmin)
    high = (float(finite.max()) if finite.size else 1.0) if vmax is None else float(vmax)
    if not high > low:
        if vmin is not None and vmax is not None:
            raise ValueError(message("vmax", "greater than 'vmin'", f"vmin {low}, vmax {high}"))
        high = low + 1.0  # an all-zero (or constant) map: any scale above it
    return low, high


def set_ticks(ax, axis: str, labels: list[str] | None, n: int, max_labels: int = 40, rotation: int = 90) -> None:
    """Tick labels on ``axis`` ("x" or "y"): every label while they fit, every k-th beyond ``max_labels``.

    Without labels, integer ticks (positions are token indices, never 2.5).
    """
    from matplotlib.ticker import MaxNLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    if labels is None:  # every index while few, else integer steps
        target.set_major_locator(MaxNLocator(integer=True, nbins=n if n <= 8 else "auto"))
        return
    step = max(1, -(-n // max_labels))  # ceil(n / max_labels): labels never overlap
    positions = list(range(0, n, step))
    shown = [labels[p] for p in positions]
    if axis == "x":
        ax.set_xticks(positions, shown, rotation=rotation)
    else:
        ax.set_yticks(positions, shown)


def write_values(ax, data: np.ndarray, image, fmt: str = ".2f", fontsize: float = 8) -> list:
    """Write each finite cell's value in it, dark on light cells and light on dark ones; return the texts."""
    texts = []
    cmap, norm = image.get_cmap(), image.norm
    for (i, j), value in np.ndenumerate(np.ma.filled(np.ma.asarray(data, dtype=float), np.nan)):
        if not np.isfinite(value):
            continue
        r, g, b, _ = cmap(norm(value))
        light = 0.299 * r + 0.587 * g + 0.114 * b > 0.5
        texts.append(
            ax.text(
                j,
                i,
                format(value, fmt),
                ha="center",
                va="center",
                fontsize=fontsize,
                color="black" if light else "white",
            )
        )
    return texts
