"""Attention drawn as graphs: one head's weighted bipartite view, the encoder-decoder graph, multi-head.

Edges follow docs/design.md: ``edge_index`` row 0 = source = key j, row 1 = target
= query i; an edge ``(j, i)`` is drawn from key j to query i.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graphattn.validate import as_int, check_float, check_int, message, shape_message
from graphattn.viz._common import KEY_LABEL, QUERY_LABEL, as_numpy, check_labels, get_ax

__all__ = ["attention_graph", "encoder_decoder", "multihead"]


def _node_sizes(edge_index: np.ndarray, tokens, num_nodes) -> tuple[int, int]:
    if num_nodes is None:
        n = len(tokens) if tokens is not None else (int(edge_index.max()) + 1 if edge_index.size else 0)
        return n, n
    if isinstance(num_nodes, int):
        return num_nodes, num_nodes
    return tuple(num_nodes)


def _edge_alpha(ei: np.ndarray, alpha, head: int | None) -> np.ndarray:
    a = as_numpy(alpha, "alpha")
    if a.ndim == 2:
        a = a.mean(axis=1) if head is None else a[:, head]
    if a.ndim != 1 or a.shape[0] != ei.shape[1]:
        raise ValueError(shape_message("alpha", f"(E,) or (E, H) with E = {ei.shape[1]}", np.shape(alpha)))
    return a


MAX_DRAWN_NODES = 100_000  # attention_graph draws every node: beyond this a picture is unreadable and slow


def _check_graph_args(edge_index, alpha, tokens, head, num_nodes, max_width, min_weight, vmax=None):
    """Entry check of :func:`attention_graph`: every refusal names its argument (validate's template).

    Returns ``num_nodes`` as None or a pair of Python ints ``(S, L)``.
    """
    from graphattn.graphs import check_edge_index

    try:
        ei = edge_index.detach().cpu().numpy() if isinstance(edge_index, torch.Tensor) else np.asarray(edge_index)
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
    a = as_numpy(alpha, "alpha")
    if a.dtype.kind not in "fiu" or not np.isfinite(a).all() or (a < 0).any():
        raise ValueError(
            message(
                "alpha",
                "finite non-negative weights",
                "a NaN, inf or negative entry" if a.dtype.kind in "fiu" else str(a.dtype),
            )
        )
    if head is not None and a.ndim == 2:
        if as_int(head) is None:
            raise TypeError(message("head", "an int", repr(head)))
        if not 0 <= as_int(head) < a.shape[1]:
            raise IndexError(message("head", f"an int in [0, {a.shape[1] - 1}] (alpha has H = {a.shape[1]})", head))
    check_float("max_width", max_width, 0.0, low_open=True)
    check_float("min_weight", min_weight)
    if vmax is not None:
        check_float("vmax", vmax, 0.0, low_open=True)
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
    vmax: float | None = None,
    fontsize: float = 8,
):
    """Draw attention as a bipartite graph: keys j on the left, queries i on the right, every node labelled.

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
        Node labels (length ``max(S, L)``); default the node indices ``0, 1, ...``.
    ax : matplotlib Axes, optional
    head : int, optional
        Which head of a 2-D ``alpha`` to draw; ``None`` averages the heads.
    num_nodes : int or (S, L), optional
        Default: one more than the largest index (or ``len(tokens)``).
    max_width : float, default 6.0
        Line width in points of the heaviest edge.
    min_weight : float, default 0.0
        Edges with a weight below this are not drawn (default: draw all).
    vmax : float, optional
        The weight drawn ``max_width`` wide; default the largest drawn weight.
        Pass the same value (e.g. 1.0) to graphs that are compared.
    fontsize : float, default 8

    Returns
    -------
    matplotlib.collections.LineCollection
        One segment per drawn edge, in the order of ``edge_index``;
        ``get_linewidths()`` are ``max_width * alpha / vmax`` (default ``vmax = max(alpha)``).

    Raises
    ------
    ValueError
        If ``alpha`` does not have E rows or holds NaN, inf or a negative weight, or
        ``tokens`` has the wrong length, or more than ``MAX_DRAWN_NODES`` nodes.
    TypeError, IndexError
        A non-integer ``edge_index``, an edge outside ``num_nodes`` (or ``tokens``), a ``head`` out of range.
    """
    num_nodes = _check_graph_args(edge_index, alpha, tokens, head, num_nodes, max_width, min_weight, vmax)
    import networkx as nx

    ei = as_numpy(edge_index, "edge_index", ndim=2).astype(np.int64)
    if ei.shape[0] != 2:
        raise ValueError(shape_message("edge_index", "(2, E)", ei.shape))
    a = _edge_alpha(ei, alpha, head)
    num_src, num_dst = _node_sizes(ei, tokens, num_nodes)
    labels = check_labels(tokens, max(num_src, num_dst), "tokens") if tokens is not None else None
    labels = labels if labels is not None else [str(n) for n in range(max(num_src, num_dst))]

    keep = a >= min_weight  # (E,)
    graph = nx.DiGraph()
    pos = {("key", j): (0.0, -float(j)) for j in range(num_src)}
    pos.update({("query", i): (1.0, -float(i)) for i in range(num_dst)})
    graph.add_nodes_from(pos)
    edgelist = [(("key", int(j)), ("query", int(i))) for (j, i), k in zip(ei.T, keep) if k]
    graph.add_edges_from(edgelist)
    top = float(a[keep].max()) if keep.any() and a[keep].max() > 0 else 1.0
    top = top if vmax is None else float(vmax)
    widths = (max_width * a[keep] / top).tolist()

    ax = get_ax(ax)
    collection = nx.draw_networkx_edges(
        graph, pos, edgelist=edgelist, width=widths, ax=ax, arrows=False, edge_color="tab:blue", alpha=0.7
    )
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_size=30, node_color="0.3")
    for j in range(num_src):
        ax.text(-0.06, -j, labels[j], ha="right", va="center", fontsize=fontsize)
    for i in range(num_dst):
        ax.text(1.06, -i, labels[i], ha="left", va="center", fontsize=fontsize)
    ax.set_xlim(-0.6, 1.6)
    ax.set_xticks([0.0, 1.0], [KEY_LABEL, QUERY_LABEL], fontsize=fontsize)
    ax.tick_params(axis="x", bottom=False, labelbottom=True)  # networkx hides tick labels
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    return collection


def encoder_decoder(
    num_src: int,
    num_tgt: int,
    ax=None,
    *,
    src_tokens: Sequence[str] | None = None,
    tgt_tokens: Sequence[str] | None = None,
) -> dict:
    """The three graphs of an encoder-decoder Transformer in one picture.

    Encoder tokens (bottom row) attend along the complete graph (self-loops
    included), decoder tokens (top row) along the causal DAG (j <= i), and
    every decoder query reads every encoder output along the complete
    bipartite graph (cross-attention). Edges point from key j to query i.

    Parameters
    ----------
    num_src : int
        S, the encoder (source) length.
    num_tgt : int
        L, the decoder (target) length.
    ax : matplotlib Axes, optional
    src_tokens, tgt_tokens : sequence of str, optional
        Node labels (default ``e0, e1, ...`` and ``d0, d1, ...``).

    Returns
    -------
    dict
        ``"encoder"`` (S^2 edges), ``"decoder"`` (L (L + 1) / 2) and ``"cross"``
        (L S): each a list of the drawn ``FancyArrowPatch``, one per edge in the
        order of the builders' ``edge_index``; ``"edge_index"``: the three (2, E) tensors.

    Raises
    ------
    ValueError
        If a length is not positive or a label list has the wrong length.
    """
    import networkx as nx
    from matplotlib.lines import Line2D

    from graphattn.graphs import mask_to_edge_index

    for name, n in (("num_src", num_src), ("num_tgt", num_tgt)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(message(name, "a positive int", repr(n)))
    src = check_labels(src_tokens, num_src, "src_tokens") or [f"e{j}" for j in range(num_src)]
    tgt = check_labels(tgt_tokens, num_tgt, "tgt_tokens") or [f"d{i}" for i in range(num_tgt)]
    graphs = {
        "encoder": mask_to_edge_index(torch.ones(num_src, num_src, dtype=torch.bool)),
        "decoder": mask_to_edge_index(torch.tril(torch.ones(num_tgt, num_tgt, dtype=torch.bool))),
        "cross": mask_to_edge_index(torch.ones(num_tgt, num_src, dtype=torch.bool)),
    }
    offset = (num_src - num_tgt) / 2
    pos = {("e", j): (float(j), 0.0) for j in range(num_src)}
    pos.update({("d", i): (i + offset, 3.0) for i in range(num_tgt)})
    ends = {"encoder": ("e", "e"), "decoder": ("d", "d"), "cross": ("e", "d")}
    style = {
        "encoder": ("tab:blue", "arc3,rad=-0.5"),
        "decoder": ("tab:orange", "arc3,rad=-0.5"),
        "cross": ("tab:green", "arc3,rad=0.0"),
    }
    ax = get_ax(ax)
    graph = nx.MultiDiGraph()
    graph.add_nodes_from(pos)
    artists = {}
    for kind, ei in graphs.items():
        a, b = ends[kind]
        edgelist = [((a, j), (b, i)) for j, i in ei.T.tolist()]
        color, connection = style[kind]
        artists[kind] = nx.draw_networkx_edges(
            graph,
            pos,
            edgelist=edgelist,
            ax=ax,
            edge_color=color,
            arrows=True,
            arrowsize=8,
            connectionstyle=connection,
            node_size=500,
            alpha=0.6,
        )
    nx.draw_networkx_nodes(graph, pos, ax=ax, node_size=500, node_color="white", edgecolors="0.2")
    nx.draw_networkx_labels(
        graph,
        pos,
        ax=ax,
        font_size=8,
        labels={**{("e", j): src[j] for j in range(num_src)}, **{("d", i): tgt[i] for i in range(num_tgt)}},
    )
    counts = {kind: ei.size(1) for kind, ei in graphs.items()}
    handles = [
        Line2D([], [], color=style[k][0], label=text)
        for k, text in (
            (
                "encoder",
                f"encoder self-attention: complete graph, {counts['encoder']} edges ({num_src} self-loops not drawn)",
            ),
            (
                "decoder",
                f"decoder self-attention: causal DAG, {counts['decoder']} edges ({num_tgt} self-loops not drawn)",
            ),
            ("cross", f"cross-attention: bipartite, encoder -> decoder, {counts['cross']} edges"),
        )
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=8, frameon=False)
    ax.text(-1.0, 0.0, "encoder\n(source tokens)", ha="right", va="center", fontsize=8)
    ax.text(min(-1.0, offset - 1.0), 3.0, "decoder\n(target tokens)", ha="right", va="center", fontsize=8)
    ax.set_xlim(min(-2.5, offset - 2.5), max(num_src, num_tgt + offset) + 0.5)
    ax.set_ylim(-1.6, 4.6)
    ax.set_axis_off()
    return {**artists, "edge_index": graphs}


def multihead(
    edge_index,
    alpha,
    *,
    in_channels: int,
    out_channels: int,
    num_nodes: int | None = None,
    tokens: Sequence[str] | None = None,
    fig=None,
) -> dict:
    """Multi-head attention drawn as split -> H graphs -> concat -> W_O, every step with its shape.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E)
        The one graph every head uses (row 0 = key j, row 1 = query i).
    alpha : Tensor, shape (E, H)
        Each head's weights on the same edges (e.g. ``AttentionConv(...,
        return_attention_weights=True)``).
    in_channels : int
        F_in, the width of a node's features.
    out_channels : int
        F_out = H * D, the width after concatenation and W_O.
    num_nodes : int, optional
        N; default from ``edge_index``.
    tokens : sequence of str, optional
        Node labels.
    fig : matplotlib Figure, optional
        Default: a new figure, one panel per step and head.

    Returns
    -------
    dict
        ``"graphs"``: the H ``LineCollection`` of :func:`attention_graph`, one per
        head, on one scale (a line ``6`` points wide is a weight of 1); ``"boxes"``: the two text artists (split, concat -> W_O).

    Raises
    ------
    ValueError
        If ``alpha`` is not (E, H) or ``out_channels`` is not a multiple of H.
    """
    import matplotlib.pyplot as plt

    a = as_numpy(alpha, "alpha", ndim=2)
    heads = a.shape[1]
    if out_channels % heads:
        raise ValueError(message("out_channels", f"a multiple of H = {heads}", repr(out_channels)))
    n = num_nodes if num_nodes is not None else int(as_numpy(edge_index, "edge_index").max()) + 1
    d, e = out_channels // heads, a.shape[0]
    fig = plt.figure(figsize=(2.6 * heads + 5, 3.6), layout="constrained") if fig is None else fig
    axes = fig.subplots(1, heads + 2, width_ratios=[1.3] + [1] * heads + [1.3])
    box = dict(boxstyle="round", facecolor="0.95", edgecolor="0.5")
    split = (
        f"x  ({n}, {in_channels})\n\nQ, K, V = x W\n({n}, {heads}·{d})\n\nsplit into {heads} heads\n"
        f"({n}, {heads}, {d})  ->"
    )
    concat = (
        f"->  concat\n({n}, {heads}·{d}) = ({n}, {out_channels})\n\nW_O  ({out_channels}, {out_channels})"
        f"\n\ny  ({n}, {out_channels})"
    )
    boxes = [
        axes[0].text(0.5, 0.5, split, ha="center", va="center", fontsize=8, bbox=box),
        axes[-1].text(0.5, 0.5, concat, ha="center", va="center", fontsize=8, bbox=box),
    ]
    axes[0].set_title("1) project, split", fontsize=9)
    axes[-1].set_title("3) concat, 4) W_O", fontsize=9)
    for ax in (axes[0], axes[-1]):
        ax.set_axis_off()
    graphs = []
    for h in range(heads):
        graphs.append(attention_graph(edge_index, a[:, h], tokens, axes[h + 1], num_nodes=n, fontsize=7, vmax=1.0))
        axes[h + 1].set_title(f"2) head {h}: alpha[:, {h}]  ({e},)\ny_{h}  ({n}, {d})", fontsize=9)
    return {"graphs": graphs, "boxes": boxes}
