"""Cost against quality: the Pareto front of the dense-vs-sparse experiment."""

from __future__ import annotations

import numpy as np

from graphattn.validate import message
from graphattn.viz._common import get_ax

__all__ = ["pareto"]


def _pareto_front(x: np.ndarray, y: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """Indices of the points not dominated (lower x and better y), sorted by x."""
    score = y if higher_is_better else -y
    order = np.lexsort((-score, x))  # by x, ties: best score first
    front, best = [], -np.inf
    for k in order:
        if score[k] > best:
            front.append(k)
            best = score[k]
    return np.asarray(front, dtype=np.int64)


def pareto(
    results,
    ax=None,
    *,
    x: str = "density",
    y: str = "fidelity",
    family: str = "family",
    higher_is_better: bool = True,
    needs_dense=None,
):
    """Cost against quality per pattern family, with the Pareto front.

    Parameters
    ----------
    results : pandas.DataFrame or sequence of dict
        One row per experiment with at least the columns ``x``, ``y`` and
        ``family`` (e.g. from :mod:`graphattn.prune`).
    ax : matplotlib Axes, optional
    x : str, default "density"
        Cost column, default ``"density"`` (fraction of the dense edges kept,
        in [0, 1]; lower is cheaper).
    y : str, default "fidelity"
        Quality column, default ``"fidelity"``.
    family : str, default "family"
        Column naming the pattern family; one marker series per family.
    higher_is_better : bool, default True
        Whether a larger ``y`` is better (fidelity) or worse (an error).
    needs_dense : sequence of str, optional
        Families whose rows are chosen from the dense weights (top-k, the
        oracles): their density is not their cost, since they need every dense
        score first. Drawn hollow and dotted, labelled "(needs dense scores)".
        Default: the families whose name contains ``"topk"``, ``"top-k"`` or
        ``"oracle"`` (the weight-chosen patterns of :mod:`graphattn.prune`).

    Returns
    -------
    list of matplotlib.lines.Line2D
        One line per family in order of first appearance (label = family, with
        " (needs dense scores)" for ``needs_dense``, points sorted by ``x``),
        then the Pareto front (label ``"Pareto front"``): the points no other
        point beats on both cost and quality.

    Raises
    ------
    ValueError
        If a column is missing or there are no rows.
    """
    rows = results.to_dict("records") if hasattr(results, "to_dict") else list(results)
    if not rows:
        raise ValueError(message("results", "at least one row", 0, verb="have"))
    for col in (x, y, family):
        if col not in rows[0]:
            raise ValueError(message("results", f"a column {col!r}", sorted(rows[0]), verb="have"))
    xs = np.array([float(r[x]) for r in rows])
    ys = np.array([float(r[y]) for r in rows])
    fams = [str(r[family]) for r in rows]

    ax = get_ax(ax)
    lines = []
    if needs_dense is None:
        needs_dense = [f for f in fams if any(word in f for word in ("topk", "top-k", "oracle"))]
    for name in dict.fromkeys(fams):
        idx = np.array([k for k, f in enumerate(fams) if f == name])
        idx = idx[np.argsort(xs[idx], kind="stable")]
        dense_first = name in set(needs_dense)
        (line,) = ax.plot(
            xs[idx],
            ys[idx],
            marker="o",
            linestyle=":" if dense_first else "-",
            markerfacecolor="none" if dense_first else None,
            label=f"{name} (needs dense scores)" if dense_first else name,
        )
        lines.append(line)
    front = _pareto_front(xs, ys, higher_is_better)
    (line,) = ax.plot(
        xs[front], ys[front], color="black", linestyle="--", drawstyle="steps-post", label="Pareto front", zorder=0
    )
    lines.append(line)
    ax.set_xlabel(f"{x} (lower is cheaper)")
    ax.set_ylabel(f"{y} ({'higher' if higher_is_better else 'lower'} is better)")
    ax.legend(fontsize=8)
    return lines
