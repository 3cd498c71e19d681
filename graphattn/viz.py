"""Pictures of attention: heatmaps, layer-by-head grids, masks, graphs, Pareto fronts.

Every function takes ``ax=None`` (or ``fig=None``), draws, and returns the
artist it made, so tests and callers can read the data back. Nothing is saved,
printed or shown; matplotlib is imported inside the functions, so importing
this module is cheap and never picks a backend.

Orientation everywhere (DESIGN.md): queries i on rows (y axis, top to
bottom), keys j on columns (x axis). A cell ``(i, j)`` is the weight with which
query i (the edge's target) reads key j (the edge's source).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["attention_heatmap", "head_grid", "pattern_mask", "attention_graph", "pareto"]

QUERY_LABEL = "query i (target)"
KEY_LABEL = "key j (source)"


def _as_numpy(x, name: str, ndim: int | None = None) -> np.ndarray:
    """Return ``x`` (Tensor or array-like) as a float64 / bool numpy array, checking ``ndim``."""
    if isinstance(x, Tensor):
        x = x.detach().cpu()
        x = x.numpy() if x.dtype == torch.bool else x.double().numpy()
    else:
        x = np.asarray(x)
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"Expected '{name}' to have {ndim} dimensions (got shape {tuple(x.shape)})")
    return x


def _check_labels(labels, n: int, name: str) -> list[str] | None:
    if labels is None:
        return None
    labels = [str(t) for t in labels]
    if len(labels) != n:
        raise ValueError(f"Expected '{name}' to have {n} entries (got {len(labels)})")
    return labels


def _get_ax(ax):
    import matplotlib.pyplot as plt

    return plt.gca() if ax is None else ax


def attention_heatmap(
    weights,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    ax=None,
    mask=None,
    *,
    cmap: str = "viridis",
    vmax: float | None = None,
    title: str | None = None,
):
    """Heatmap of one head's attention weights, queries on rows, keys on columns.

    Parameters
    ----------
    weights : Tensor or array, shape (L, S)
        ``weights[i, j]`` = alpha_ij, the weight with which query i reads key j;
        each allowed row sums to 1.
    row_labels : sequence of str, length L, optional
        Query tokens (y axis, top to bottom).
    col_labels : sequence of str, length S, optional
        Key tokens (x axis, left to right).
    ax : matplotlib Axes, optional
        Default: the current axes.
    mask : Tensor or array, shape (L, S), dtype bool, optional
        True = edge ``(j, i)`` exists (may attend). Cells outside the edge set
        are masked in the returned image and drawn as grey hatching, so they
        are distinct from an edge whose weight is exactly zero.
    cmap : str
        Colormap for the weights (default ``"viridis"``).
    vmax : float, optional
        Top of the colour scale; default ``max(weights)`` (the bottom is 0).
    title : str, optional

    Returns
    -------
    matplotlib.image.AxesImage
        ``get_array()`` is a masked array of shape (L, S), masked where ``mask``
        is False.

    Raises
    ------
    ValueError
        If ``weights`` is not 2-D, or ``mask`` or the labels do not match its shape.
    TypeError
        If ``mask`` is not boolean.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import torch, matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> im = attention_heatmap(torch.tensor([[1.0, 0.0], [0.25, 0.75]]), ax=ax,
    ...                        mask=torch.tensor([[True, False], [True, True]]))
    >>> im.get_array().mask.tolist()
    [[False, True], [False, False]]
    >>> plt.close(fig)
    """
    import matplotlib as mpl
    from matplotlib.patches import Rectangle

    w = _as_numpy(weights, "weights", ndim=2)
    num_q, num_k = w.shape
    if mask is None:
        data = np.ma.masked_array(w, mask=np.zeros_like(w, dtype=bool))
    else:
        m = _as_numpy(mask, "mask", ndim=2)
        if m.dtype != bool:
            raise TypeError(f"Expected 'mask' to be boolean, True means may attend (got {m.dtype})")
        if m.shape != w.shape:
            raise ValueError(f"Expected 'mask' to have the shape of 'weights' {w.shape} (got {m.shape})")
        data = np.ma.masked_array(w, mask=~m)
    rows = _check_labels(row_labels, num_q, "row_labels")
    cols = _check_labels(col_labels, num_k, "col_labels")

    ax = _get_ax(ax)
    # masked (non-edge) cells transparent: the hatched grey patch below shows through
    colormap = mpl.colormaps[cmap].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    top = float(w.max()) if vmax is None and w.size else (1.0 if vmax is None else vmax)
    image = ax.imshow(data, cmap=colormap, vmin=0.0, vmax=top if top > 0 else 1.0,
                      origin="upper", aspect="auto", interpolation="nearest")
    if np.ma.getmaskarray(data).any():
        ax.add_patch(Rectangle((-0.5, -0.5), num_k, num_q, facecolor="0.85", edgecolor="0.6",
                               hatch="///", linewidth=0, zorder=image.get_zorder() - 1))
    ax.set_xlabel(KEY_LABEL)
    ax.set_ylabel(QUERY_LABEL)
    if cols is not None:
        ax.set_xticks(range(num_k), cols, rotation=90)
    if rows is not None:
        ax.set_yticks(range(num_q), rows)
    if title is not None:
        ax.set_title(title)
    return image


def head_grid(
    weights,
    tokens: Sequence[str] | None = None,
    query: int | None = None,
    fig=None,
    *,
    cmap: str = "viridis",
) -> np.ndarray:
    """A layers-by-heads grid of attention maps, or one query's weights per layer.

    Parameters
    ----------
    weights : Tensor or array, shape (layers, H, L, S)
        Dense attention weights, queries on rows (e.g. a Hugging Face model's
        ``attentions`` stacked, batch removed).
    tokens : sequence of str, optional
        Token labels; length S (keys), and also used for the queries when L == S.
    query : int, optional
        ``None``: a ``layers x H`` grid of full (L, S) maps. An int i: one
        panel per layer, each an (H, S) map with heads on rows and keys on
        columns, row h = what query i reads in head h.
    fig : matplotlib Figure, optional
        Default: a new pyplot figure.
    cmap : str

    Returns
    -------
    numpy.ndarray of matplotlib.image.AxesImage
        Shape (layers, H) without ``query``, (layers,) with it; every image
        shares one colour scale from 0 to the largest weight, and the
        figure gets one colourbar. ``image.axes`` is the panel.

    Raises
    ------
    ValueError
        If ``weights`` is not 4-D or ``tokens`` has the wrong length.
    IndexError
        If ``query`` is outside ``[0, L)``.
    """
    import matplotlib.pyplot as plt

    w = _as_numpy(weights, "weights", ndim=4)
    num_layers, heads, num_q, num_k = w.shape
    cols = _check_labels(tokens, num_k, "tokens")
    rows = cols if cols is not None and num_q == num_k else None
    if query is not None and not -num_q <= query < num_q:
        raise IndexError(f"Expected 'query' to be in [0, {num_q}) (got {query})")
    fig = plt.figure(figsize=(1.6 * heads + 1, 1.6 * num_layers)) if fig is None else fig
    vmax = float(w.max()) if w.size and w.max() > 0 else 1.0
    show_k = cols is not None and num_k <= 24  # tick labels only while readable

    if query is None:
        axes = fig.subplots(num_layers, heads, squeeze=False)  # (layers, H)
        images = np.empty((num_layers, heads), dtype=object)
        for layer in range(num_layers):
            for h in range(heads):
                ax = axes[layer, h]
                images[layer, h] = ax.imshow(w[layer, h], cmap=cmap, vmin=0.0, vmax=vmax,
                                             aspect="auto", interpolation="nearest")  # (L, S)
                ax.set_xticks(range(num_k) if show_k and layer == num_layers - 1 else [])
                ax.set_yticks(range(num_q) if show_k and rows is not None and h == 0 else [])
                if show_k and layer == num_layers - 1:
                    ax.set_xticklabels(cols, rotation=90, fontsize=6)
                if show_k and rows is not None and h == 0:
                    ax.set_yticklabels(rows, fontsize=6)
                if layer == 0:
                    ax.set_title(f"head {h}", fontsize=8)
                if h == 0:
                    ax.set_ylabel(f"layer {layer}\n{QUERY_LABEL}", fontsize=7)
                if layer == num_layers - 1:
                    ax.set_xlabel(KEY_LABEL, fontsize=7)
    else:
        axes = fig.subplots(1, num_layers, squeeze=False)[0]  # (layers,)
        images = np.empty((num_layers,), dtype=object)
        name = f"'{rows[query]}'" if rows is not None else f"{query % num_q}"
        for layer in range(num_layers):
            ax = axes[layer]
            images[layer] = ax.imshow(w[layer, :, query, :], cmap=cmap, vmin=0.0, vmax=vmax,
                                      aspect="auto", interpolation="nearest")  # (H, S)
            ax.set_title(f"layer {layer}", fontsize=8)
            ax.set_xlabel(KEY_LABEL, fontsize=7)
            ax.set_xticks(range(num_k) if show_k else [])
            if show_k:
                ax.set_xticklabels(cols, rotation=90, fontsize=6)
            ax.set_yticks(range(heads))
            if layer == 0:
                ax.set_ylabel("head", fontsize=7)
        fig.suptitle(f"query {name}: weights per head and layer")
    fig.colorbar(images.flat[0], ax=list(np.ravel(axes)), label="attention weight")
    return images


def pattern_mask(pattern, L: int | None = None, ax=None, *, S: int | None = None):
    """Draw a sparsity pattern's mask: allowed (query i, key j) cells dark.

    Parameters
    ----------
    pattern : Pattern or Tensor of shape (L, S), dtype bool
        A :mod:`graphattn.patterns` object (anything with ``.mask(L, S)`` and
        ``.name``) or a mask; True = may attend.
    L : int, optional
        Number of queries; required for a pattern, ignored for a mask.
    ax : matplotlib Axes, optional
    S : int, optional
        Number of keys (default ``L``).

    Returns
    -------
    matplotlib.image.AxesImage
        ``get_array()`` is the mask as 0/1, shape (L, S); the title gives the
        pattern's name, its edge count and density E / (L S).

    Raises
    ------
    ValueError
        If a pattern is given without ``L`` or the mask is not 2-D.
    TypeError
        If the mask is not boolean.
    """
    if hasattr(pattern, "mask") and callable(pattern.mask):
        if L is None:
            raise ValueError("Expected 'L' (the number of queries) when 'pattern' is a Pattern (got None)")
        mask = pattern.mask(L, S)
        name = getattr(pattern, "name", type(pattern).__name__)
    else:
        mask, name = pattern, "mask"
    m = _as_numpy(mask, "pattern", ndim=2)
    if m.dtype != bool:
        raise TypeError(f"Expected the mask to be boolean, True means may attend (got {m.dtype})")
    ax = _get_ax(ax)
    image = ax.imshow(m.astype(float), cmap="Greys", vmin=0.0, vmax=1.0, origin="upper",
                      interpolation="nearest", aspect="equal")
    edges = int(m.sum())
    density = edges / m.size if m.size else 0.0
    ax.set_title(f"{name}: {edges} edges, density {density:.2f}")
    ax.set_xlabel(KEY_LABEL)
    ax.set_ylabel(QUERY_LABEL)
    return image


MAX_DRAWN_NODES = 100_000  # attention_graph draws every node: beyond this a picture is unreadable and slow


def _check_graph_args(edge_index, alpha, tokens, head, num_nodes, max_width, min_weight):
    """Entry check of :func:`attention_graph`: every refusal names its argument (validate's template).

    Returns ``num_nodes`` as None or a pair of Python ints ``(S, L)``.
    """
    from graphattn.graphs import check_edge_index
    from graphattn.validate import as_int, check_float, check_int, message

    try:
        ei = edge_index.detach().cpu().numpy() if isinstance(edge_index, Tensor) else np.asarray(edge_index)
    except (TypeError, ValueError):
        ei = np.asarray(None)
    if ei.dtype.kind not in "iu":
        raise TypeError(message("edge_index", "an integer Tensor or array of shape (2, E)", str(ei.dtype)))
    if num_nodes is not None:
        sizes = [num_nodes] * 2 if as_int(num_nodes) is not None else num_nodes
        if not isinstance(sizes, (tuple, list)) or len(sizes) != 2 or None in [as_int(n) for n in sizes]:
            raise TypeError(message("num_nodes", "an int or a pair of ints (S, L)", repr(num_nodes)))
        sizes = [check_int("num_nodes", n, low=0, high=MAX_DRAWN_NODES) for n in sizes]
    elif tokens is not None:
        sizes = [check_int("tokens", len(tokens), low=0, high=MAX_DRAWN_NODES)] * 2
    else:
        sizes = [MAX_DRAWN_NODES] * 2
    check_edge_index(torch.as_tensor(ei.astype(np.int64)) if ei.ndim else torch.as_tensor(ei), *sizes)
    a = _as_numpy(alpha, "alpha")
    if a.dtype.kind not in "fiu" or not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(message("alpha", "finite non-negative weights", "a NaN, inf or negative entry"
                                 if a.dtype.kind in "fiu" else str(a.dtype)))
    if head is not None and a.ndim == 2:
        if as_int(head) is None:
            raise TypeError(message("head", "an int", repr(head)))
        if not 0 <= as_int(head) < a.shape[1]:
            raise IndexError(message("head", f"an int in [0, {a.shape[1] - 1}] (alpha has H = {a.shape[1]})", head))
    check_float("max_width", max_width, 0.0, low_open=True)
    check_float("min_weight", min_weight)
    return None if num_nodes is None else tuple(sizes)


def attention_graph(
    edge_index,
    alpha,
    tokens: Sequence[str] | None = None,
    ax=None,
    *,
    head: int | None = None,
    num_nodes: tuple[int, int] | int | None = None,
    max_width: float = 6.0,
    min_weight: float = 0.0,
):
    """Draw attention as a bipartite graph: keys j on the left, queries i on the right.

    Each edge ``(j, i)`` is a line from key j to query i whose width is
    proportional to its weight alpha_ij (the largest drawn weight gets
    ``max_width`` points). Drawn with networkx.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E)
        Row 0 = source j (key), row 1 = target i (query).
    alpha : Tensor, shape (E,) or (E, H)
        Edge weights in the order of ``edge_index``.
    tokens : sequence of str, optional
        Labels of the nodes (length N for self-attention).
    ax : matplotlib Axes, optional
    head : int, optional
        Which head of a 2-D ``alpha`` to draw; ``None`` averages the heads.
    num_nodes : int or (S, L), optional
        Default: one more than the largest index (or ``len(tokens)``).
    max_width : float
        Line width in points of the heaviest edge.
    min_weight : float
        Edges with a weight below this are not drawn (default: draw all).

    Returns
    -------
    matplotlib.collections.LineCollection
        One segment per drawn edge, in the order of ``edge_index``;
        ``get_linewidths()`` are ``max_width * alpha / max(alpha)``.

    Raises
    ------
    ValueError
        If ``alpha`` does not have E rows or holds NaN, inf or a negative weight, or
        ``tokens`` has the wrong length, or more than ``MAX_DRAWN_NODES`` nodes.
    TypeError, IndexError
        A non-integer ``edge_index``, an edge outside ``num_nodes`` (or ``tokens``), a ``head`` out of range.
    """
    num_nodes = _check_graph_args(edge_index, alpha, tokens, head, num_nodes, max_width, min_weight)
    import networkx as nx

    ei = _as_numpy(edge_index, "edge_index", ndim=2).astype(np.int64)
    if ei.shape[0] != 2:
        raise ValueError(f"Expected 'edge_index' to have shape (2, E) (got {tuple(ei.shape)})")
    a = _as_numpy(alpha, "alpha")
    if a.ndim == 2:
        a = a.mean(axis=1) if head is None else a[:, head]
    if a.ndim != 1 or a.shape[0] != ei.shape[1]:
        raise ValueError(f"Expected 'alpha' to have shape (E,) or (E, H) with E = {ei.shape[1]} "
                         f"(got {tuple(np.shape(alpha))})")
    if num_nodes is None:
        n = len(tokens) if tokens is not None else (int(ei.max()) + 1 if ei.size else 0)
        num_src = num_dst = n
    elif isinstance(num_nodes, int):
        num_src = num_dst = num_nodes
    else:
        num_src, num_dst = num_nodes
    labels = _check_labels(tokens, max(num_src, num_dst), "tokens") if tokens is not None else None

    keep = a >= min_weight  # (E,)
    graph = nx.DiGraph()
    pos = {}
    for j in range(num_src):
        graph.add_node(("key", j))
        pos[("key", j)] = (0.0, -float(j))
    for i in range(num_dst):
        graph.add_node(("query", i))
        pos[("query", i)] = (1.0, -float(i))
    edgelist = [(("key", int(j)), ("query", int(i))) for (j, i), k in zip(ei.T, keep) if k]
    graph.add_edges_from(edgelist)
    top = float(a[keep].max()) if keep.any() and a[keep].max() > 0 else 1.0
    widths = (max_width * a[keep] / top).tolist()

    ax = _get_ax(ax)
    collection = nx.draw_networkx_edges(graph, pos, edgelist=edgelist, width=widths, ax=ax,
                                        arrows=False, edge_color="tab:blue", alpha=0.7)
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_size=30, node_color="0.3")
    if labels is not None:
        for j in range(num_src):
            ax.text(-0.05, -j, labels[j], ha="right", va="center")
        for i in range(num_dst):
            ax.text(1.05, -i, labels[i], ha="left", va="center")
    ax.set_xlim(-0.5, 1.5)
    ax.set_xticks([0.0, 1.0], [KEY_LABEL, QUERY_LABEL])
    ax.tick_params(axis="x", bottom=False, labelbottom=True)  # networkx hides tick labels
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    return collection


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
):
    """Cost against quality per pattern family, with the Pareto front.

    Parameters
    ----------
    results : pandas.DataFrame or sequence of dict
        One row per experiment with at least the columns ``x``, ``y`` and
        ``family`` (e.g. from :mod:`graphattn.prune`).
    ax : matplotlib Axes, optional
    x : str
        Cost column, default ``"density"`` (fraction of the dense edges kept,
        in [0, 1]; lower is cheaper).
    y : str
        Quality column, default ``"fidelity"``.
    family : str
        Column naming the pattern family; one marker series per family.
    higher_is_better : bool
        Whether a larger ``y`` is better (fidelity) or worse (an error).

    Returns
    -------
    list of matplotlib.lines.Line2D
        One line per family in order of first appearance (label = family,
        points sorted by ``x``), then the Pareto front (label ``"Pareto front"``):
        the points no other point beats on both cost and quality.

    Raises
    ------
    ValueError
        If a column is missing or there are no rows.
    """
    rows = results.to_dict("records") if hasattr(results, "to_dict") else list(results)
    if not rows:
        raise ValueError("Expected 'results' to have at least one row (got 0)")
    for col in (x, y, family):
        if col not in rows[0]:
            raise ValueError(f"Expected 'results' to have a column {col!r} (got {sorted(rows[0])})")
    xs = np.array([float(r[x]) for r in rows])
    ys = np.array([float(r[y]) for r in rows])
    fams = [str(r[family]) for r in rows]

    ax = _get_ax(ax)
    lines = []
    for name in dict.fromkeys(fams):
        idx = np.array([k for k, f in enumerate(fams) if f == name])
        idx = idx[np.argsort(xs[idx], kind="stable")]
        (line,) = ax.plot(xs[idx], ys[idx], marker="o", linestyle="-", label=name)
        lines.append(line)
    front = _pareto_front(xs, ys, higher_is_better)
    (line,) = ax.plot(xs[front], ys[front], color="black", linestyle="--", drawstyle="steps-post",
                      label="Pareto front", zorder=0)
    lines.append(line)
    ax.set_xlabel(f"{x} (lower is cheaper)")
    ax.set_ylabel(f"{y} ({'higher' if higher_is_better else 'lower'} is better)")
    ax.legend(fontsize=8)
    return lines
