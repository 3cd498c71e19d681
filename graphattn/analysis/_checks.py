"""Argument checks shared by the analysis functions (validate's template, one place)."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence

import networkx as nx
import torch
from torch import Tensor

from graphattn.graphs import check_edge_index
from graphattn.patterns import MAX_LENGTH
from graphattn.validate import check_int, check_tensor, message

ANY_INDEX = 2**63  # "no upper bound" for check_edge_index: any int64 index is in range


def check_weights(name: str, alpha, shape_text: str = "(E,) or (E, H)") -> Tensor:
    """``alpha`` as attention weights: a floating-point Tensor, finite and non-negative."""
    check_tensor(name, alpha, shape_text=shape_text, floating=True)
    bad = ~torch.isfinite(alpha)
    if bad.any():
        raise ValueError(message(name, "finite attention weights", f"{int(bad.sum())} NaN or inf"))
    if alpha.numel() and float(alpha.min()) < 0:
        raise ValueError(message(name, "non-negative attention weights", f"a minimum of {float(alpha.min())}"))
    return alpha


def edge_weights(edge_index: Tensor, alpha, head: int | None, name: str = "alpha") -> Tensor:
    """The per-edge weight, shape (E,): one head of ``alpha`` or the mean over heads."""
    num_edges = edge_index.size(1)
    shape_text = f"(E,) or (E, H) with E = {num_edges}"
    check_weights(name, alpha, shape_text)
    if alpha.dim() not in (1, 2) or alpha.size(0) != num_edges:
        raise ValueError(message(name, f"a Tensor of shape {shape_text}", f"shape {tuple(alpha.shape)}"))
    if alpha.dim() == 1:
        return alpha
    if head is None:
        return alpha.mean(dim=1)  # (E, H) -> (E,)
    heads, head = alpha.size(1), check_int("head", head, None, None)
    if not -heads <= head < heads:
        raise IndexError(message("head", f"an int in [0, {heads})", head))
    return alpha[:, head]  # (E,)


def num_nodes_of(edge_index, num_nodes, name: str = "edge_index") -> int:
    """N: ``num_nodes`` checked, or one more than the largest index; the edges checked against it."""
    check_edge_index(edge_index, ANY_INDEX, ANY_INDEX, name)
    if num_nodes is None:
        n = int(edge_index.max()) + 1 if edge_index.numel() else 0
    else:
        n = check_int("num_nodes", num_nodes, 0, MAX_LENGTH)
    check_edge_index(edge_index, n, n, name)
    return n


def layer_list(edge_index, alphas, name: str = "alphas") -> list[tuple[Tensor, Tensor, str]]:
    """Each layer's edges, head-averaged weights and the edges' name: list of ((2, E), (E,), str).

    Layers of different floating dtypes are promoted to one (``torch.promote_types``: float32 and float64
    give float64), so products of layers never mix dtypes.
    """
    if isinstance(alphas, Tensor):
        if alphas.dim() not in (2, 3):
            raise ValueError(
                message(name, "a Tensor of shape (layers, E) or (layers, E, H)", f"shape {tuple(alphas.shape)}")
            )
        alphas = list(alphas.unbind(0))
    if not isinstance(alphas, Sequence) or isinstance(alphas, str):
        raise TypeError(message(name, "a Tensor (layers, E, H) or a sequence of (E, H) Tensors", type(alphas).__name__))
    alphas = list(alphas)
    if not alphas:
        raise ValueError(message(name, "at least one layer", 0))
    if isinstance(edge_index, Tensor):
        edges, names = [edge_index] * len(alphas), ["edge_index"] * len(alphas)
    elif isinstance(edge_index, Sequence) and all(isinstance(e, Tensor) for e in edge_index):
        edges, names = list(edge_index), [f"edge_index[{layer}]" for layer in range(len(edge_index))]
    else:
        raise TypeError(
            message("edge_index", "a LongTensor (2, E) or a sequence of them, one per layer", type(edge_index).__name__)
        )
    if len(edges) != len(alphas):
        raise ValueError(message("edge_index", f"one Tensor per layer ({len(alphas)})", len(edges)))
    layers = []
    for layer, (ei, ei_name, a) in enumerate(zip(edges, names, alphas)):
        check_edge_index(ei, ANY_INDEX, ANY_INDEX, ei_name)
        layers.append((ei, edge_weights(ei, a, None, f"{name}[{layer}]"), ei_name))
    dtype = functools.reduce(torch.promote_types, [w.dtype for _, w, _ in layers])  # float32 + float64 -> float64
    return [(ei, w.to(dtype), ei_name) for ei, w, ei_name in layers]


def stacked(alpha, edge_index, name: str = "alpha") -> Tensor:
    """``alpha`` as (layers, E, H) from (E, H), (layers, E, H) or a sequence of (E, H); E as in ``edge_index``."""
    check_edge_index(edge_index, ANY_INDEX, ANY_INDEX)
    if not isinstance(alpha, Tensor):
        if not isinstance(alpha, Sequence) or isinstance(alpha, str) or not alpha:
            raise TypeError(
                message(name, "a Tensor (E, H) or (layers, E, H), or a sequence of (E, H)", type(alpha).__name__)
            )
        for layer, a in enumerate(alpha):
            check_tensor(f"{name}[{layer}]", a, dim=2, shape_text=f"(E, H) with E = {edge_index.size(1)}")
        if len({tuple(a.shape) for a in alpha}) != 1:
            raise ValueError(message(name, "layers of one shape (E, H)", [tuple(a.shape) for a in alpha]))
        alpha = torch.stack(list(alpha))  # (layers, E, H)
    check_weights(name, alpha, "(E, H) or (layers, E, H)")
    alpha = alpha.unsqueeze(0) if alpha.dim() == 2 else alpha  # (layers, E, H)
    if alpha.dim() != 3 or alpha.size(1) != edge_index.size(1):
        raise ValueError(
            message(
                name,
                f"a Tensor of shape (E, H) or (layers, E, H) with E = {edge_index.size(1)}",
                f"shape {tuple(alpha.shape)}",
            )
        )
    return alpha


def check_graph(graph, weight) -> None:
    """A networkx DiGraph whose ``weight`` attributes (where present) are finite, non-negative numbers."""
    if not isinstance(graph, nx.DiGraph):
        raise TypeError(
            message("graph", "a networkx.DiGraph with edges j -> i (see to_networkx)", type(graph).__name__)
        )
    if not isinstance(weight, str):
        raise TypeError(message("weight", "the name of an edge attribute (a str)", weight))
    for j, i, w in graph.edges(data=weight, default=1.0):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not 0 <= w < math.inf:
            raise ValueError(
                message(
                    "graph",
                    f"edges whose {weight!r} is a finite non-negative number",
                    f"{w!r} on the edge ({j!r}, {i!r})",
                )
            )
