"""Attention weights as pictures: one head's heatmap, a layers-by-heads grid, a pattern's mask.

Orientation everywhere (docs/design.md): queries i on rows (y axis, query 0 at the
top, whatever ``rcParams["image.origin"]`` says), keys j on columns (x axis).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphattn.validate import as_int, message
from graphattn.viz._common import (
    KEY_LABEL,
    QUERY_LABEL,
    as_numpy,
    check_labels,
    color_range,
    get_ax,
    set_ticks,
    write_values,
)

__all__ = ["attention_heatmap", "head_grid", "pattern_mask"]

ANNOTATE_MAX = 10  # numbers are written into maps of at most this many rows and columns (annotate=None)


def attention_heatmap(
    weights,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    ax=None,
    mask=None,
    *,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    fmt: str = ".2f",
    colorbar: bool = True,
    label: str = "attention weight",
    max_labels: int = 40,
):
    """Heatmap of one head's attention weights, queries on rows, keys on columns, with a colour bar.

    Parameters
    ----------
    weights : Tensor or array, shape (L, S)
        ``weights[i, j]`` = alpha_ij, the weight with which query i reads key j;
        each allowed row sums to 1 (any real matrix is accepted, e.g. a difference).
    row_labels : sequence of str, length L, optional
        Query tokens (y axis, top to bottom). Default: integer ticks.
    col_labels : sequence of str, length S, optional
        Key tokens (x axis, left to right). Default: integer ticks.
    ax : matplotlib Axes, optional
        Default: the current axes.
    mask : Tensor or array, shape (L, S), dtype bool, optional
        True = edge ``(j, i)`` exists (may attend). Cells outside the edge set
        are masked in the returned image and drawn as grey hatching, so they
        are distinct from an edge whose weight is exactly zero.
    cmap : str, default "viridis"
    vmin, vmax : float, optional
        The colour scale. Pass the same values to pictures that are compared
        (e.g. rollout, flow and raw attention on one scale). Default: from
        ``min(0, min(weights))`` to ``max(weights)``.
    title : str, optional
    annotate : bool, optional
        Write each cell's value in it. Default (None): only for maps of at
        most 10 x 10 cells, where the numbers fit.
    fmt : str, default ".2f"
        Format of the written numbers.
    colorbar : bool, default True
        Draw a colour bar labelled ``label`` next to ``ax`` (``image.colorbar``).
    label : str, default "attention weight"
    max_labels : int, default 40
        At most this many tick labels per axis (every k-th beyond), so labels never overlap.

    Returns
    -------
    matplotlib.image.AxesImage
        ``get_array()`` is a masked array of shape (L, S), masked where ``mask``
        is False; ``image.colorbar`` is the colour bar (or None).

    Raises
    ------
    ValueError
        If ``weights`` is not 2-D, ``mask`` or the labels do not match its shape,
        or ``vmax <= vmin``.
    TypeError
        If ``mask`` is not boolean.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import torch, matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots()
    >>> im = attention_heatmap(torch.tensor([[1.0, 0.0], [0.25, 0.75]]), ax=ax,
    ...                        mask=torch.tensor([[True, False], [True, True]]))
    >>> im.get_array().mask.tolist(), [t.get_text() for t in ax.texts]
    ([[False, True], [False, False]], ['1.00', '0.25', '0.75'])
    >>> plt.close(fig)
    """
    from matplotlib.patches import Rectangle

    w = as_numpy(weights, "weights", ndim=2)
    num_q, num_k = w.shape
    if mask is None:
        data = np.ma.masked_array(w, mask=np.zeros_like(w, dtype=bool))
    else:
        m = as_numpy(mask, "mask", ndim=2)
        if m.dtype != bool:
            raise TypeError(message("mask", "boolean, True means may attend", str(m.dtype)))
        if m.shape != w.shape:
            raise ValueError(message("mask", f"the shape of 'weights' {w.shape}", repr(m.shape), verb="have"))
        data = np.ma.masked_array(w, mask=~m)
    rows = check_labels(row_labels, num_q, "row_labels")
    cols = check_labels(col_labels, num_k, "col_labels")
    low, high = color_range(np.ma.compressed(data) if data.count() else w, vmin, vmax)

    ax = get_ax(ax)
    # masked (non-edge) cells transparent: the hatched grey patch below shows through
    colormap = _colormap(cmap).with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    image = ax.imshow(data, cmap=colormap, vmin=low, vmax=high, origin="upper", aspect="auto", interpolation="nearest")
    if np.ma.getmaskarray(data).any():
        ax.add_patch(
            Rectangle(
                (-0.5, -0.5),
                num_k,
                num_q,
                facecolor="0.85",
                edgecolor="0.6",
                hatch="///",
                linewidth=0,
                zorder=image.get_zorder() - 1,
            )
        )
    ax.set_xlabel(KEY_LABEL)
    ax.set_ylabel(QUERY_LABEL)
    set_ticks(ax, "x", cols, num_k, max_labels)
    set_ticks(ax, "y", rows, num_q, max_labels)
    if annotate or (annotate is None and max(num_q, num_k) <= ANNOTATE_MAX):
        write_values(ax, data, image, fmt)
    if title is not None:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label=label)
    return image


def _colormap(cmap):
    """Matplotlib's colormap named ``cmap`` (or ``cmap`` itself), ValueError naming it otherwise."""
    import matplotlib as mpl

    if not isinstance(cmap, str):
        return cmap
    if cmap not in mpl.colormaps:
        raise ValueError(message("cmap", "a matplotlib colormap name such as 'viridis'", cmap))
    return mpl.colormaps[cmap]


def _grid_panel(ax, image_data, cmap, low, high, xlabels, ylabels, n_x, n_y):
    """One panel of :func:`head_grid`: the map with query 0 on top, ticks only where labelled."""
    image = ax.imshow(
        image_data, cmap=cmap, vmin=low, vmax=high, origin="upper", aspect="auto", interpolation="nearest"
    )
    ax.set_xticks(range(n_x) if xlabels is not None else [])
    ax.set_yticks(range(n_y) if ylabels is not None else [])
    if xlabels is not None:
        ax.set_xticklabels(xlabels, rotation=90, fontsize=6)
    if ylabels is not None:
        ax.set_yticklabels(ylabels, fontsize=6)
    return image


def head_grid(
    weights,
    tokens: Sequence[str] | None = None,
    query: int | None = None,
    fig=None,
    *,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    max_labels: int = 24,
) -> np.ndarray:
    """A layers-by-heads grid of attention maps, or one query's weights per layer, on one colour scale.

    Parameters
    ----------
    weights : Tensor or array, shape (layers, H, L, S)
        Dense attention weights, queries on rows (e.g. a Hugging Face model's
        ``attentions`` stacked, batch removed).
    tokens : sequence of str, optional
        Token labels; length S (keys), and also used for the queries when L == S.
    query : int, optional
        ``None``: a ``layers x H`` grid of full (L, S) maps, token labels on the
        outer panels only. An int i: one panel per layer, each an (H, S) map
        with heads on rows and keys on columns, row h = what query i reads in head h.
    fig : matplotlib Figure, optional
        Default: a new pyplot figure sized to the grid.
    cmap : str, default "viridis"
    vmin, vmax : float, optional
        The shared colour scale; default 0 to the largest weight. Pass the same
        values to two grids that are compared.
    max_labels : int, default 24
        Token labels are written only when there are at most this many (at
        most 12 on the panels of the full grid); beyond, they would overlap.

    Returns
    -------
    numpy.ndarray of matplotlib.image.AxesImage
        Shape (layers, H) without ``query``, (layers,) with it; every image
        shares one colour scale and the figure gets one colour bar. Query 0
        (or head 0) is the top row whatever ``rcParams["image.origin"]`` says.
        ``image.axes`` is the panel.

    Raises
    ------
    ValueError
        If ``weights`` is not 4-D or ``tokens`` has the wrong length.
    IndexError
        If ``query`` is outside ``[0, L)``.
    """
    import matplotlib.pyplot as plt

    w = as_numpy(weights, "weights", ndim=4)
    num_layers, heads, num_q, num_k = w.shape
    if 0 in w.shape:
        raise ValueError(message("weights", "a non-empty (layers, H, L, S) array", f"shape {w.shape}"))
    if query is not None and as_int(query) is None:
        raise TypeError(message("query", "an int (the query position) or None", query))
    _colormap(cmap)
    cols = check_labels(tokens, num_k, "tokens")
    # labels only while they fit: 6-point labels need about 0.1 inch each; a grid panel is 1.3 inches
    cols = cols if cols is not None and num_k <= (max_labels if query is not None else min(max_labels, 12)) else None
    rows = cols if cols is not None and num_q == num_k else None
    if query is not None and not -num_q <= query < num_q:
        raise IndexError(message("query", f"in [0, {num_q})", repr(query)))
    low, high = color_range(w, vmin, vmax)
    if query is None:
        fig = plt.figure(figsize=(1.3 * heads + 2, 1.3 * num_layers + 1), layout="constrained") if fig is None else fig
        axes = fig.subplots(num_layers, heads, squeeze=False)  # (layers, H)
        images = np.empty((num_layers, heads), dtype=object)
        for layer in range(num_layers):
            for h in range(heads):
                last, first = layer == num_layers - 1, h == 0
                images[layer, h] = _grid_panel(
                    axes[layer, h],
                    w[layer, h],
                    cmap,
                    low,
                    high,
                    cols if last else None,
                    rows if first else None,
                    num_k,
                    num_q,
                )
                if layer == 0:
                    axes[layer, h].set_title(f"head {h}", fontsize=8)
                if first:
                    axes[layer, h].set_ylabel(f"layer {layer}", fontsize=8)
        # one line under the grid for both axes: a figure-level y label collides with the row labels
        # whenever the caller's figure has no constrained layout
        fig.supxlabel(f"in every panel: rows = {QUERY_LABEL}, columns = {KEY_LABEL}", fontsize=9)
    else:
        fig = plt.figure(figsize=(2.3 * num_layers + 2, 4), layout="constrained") if fig is None else fig
        axes = fig.subplots(1, num_layers, squeeze=False)[0]  # (layers,)
        images = np.empty((num_layers,), dtype=object)
        name = f"'{rows[query]}'" if rows is not None else f"{query % num_q}"
        for layer in range(num_layers):
            images[layer] = _grid_panel(
                axes[layer],
                w[layer, :, query, :],
                cmap,
                low,
                high,
                cols,
                [str(h) for h in range(heads)] if layer == 0 else None,
                num_k,
                heads,
            )
            axes[layer].set_title(f"layer {layer}", fontsize=8)
            axes[layer].set_xlabel(KEY_LABEL, fontsize=7)
        axes[0].set_ylabel("head", fontsize=7)
        fig.suptitle(f"query {name}: weights per head and layer")
    fig.colorbar(images.flat[0], ax=list(np.ravel(axes)), label="attention weight", shrink=0.8)
    return images


def pattern_mask(pattern, L: int | None = None, ax=None, *, S: int | None = None, legend: bool = True):
    """Draw a sparsity pattern's mask: edges (may attend) black, integer ticks, a legend.

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
    legend : bool, default True
        A legend naming the two colours (edge j -> i / no edge), right of the axes.

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
    from matplotlib.patches import Patch

    if hasattr(pattern, "mask") and callable(pattern.mask):
        if L is None:
            raise ValueError(message("L", "given (the number of queries) when 'pattern' is a Pattern", None))
        mask = pattern.mask(L, S)
        name = getattr(pattern, "name", type(pattern).__name__)
    else:
        mask, name = pattern, "mask"
    m = as_numpy(mask, "pattern", ndim=2)
    if m.dtype != bool:
        raise TypeError(message("pattern", "a boolean mask, True means may attend", str(m.dtype)))
    ax = get_ax(ax)
    image = ax.imshow(
        m.astype(float), cmap="Greys", vmin=0.0, vmax=1.0, origin="upper", interpolation="nearest", aspect="equal"
    )
    edges = int(m.sum())
    density = edges / m.size if m.size else 0.0
    ax.set_title(f"{name}: {edges} edges, density {density:.2f}", fontsize=9)
    ax.set_xlabel(KEY_LABEL)
    ax.set_ylabel(QUERY_LABEL)
    set_ticks(ax, "x", None, m.shape[1])
    set_ticks(ax, "y", None, m.shape[0])
    if legend:
        handles = [
            Patch(facecolor="black", edgecolor="0.5", label="edge j -> i (may attend)"),
            Patch(facecolor="white", edgecolor="0.5", label="no edge"),
        ]
        ax.legend(
            handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False, handlelength=1.0
        )
    return image
