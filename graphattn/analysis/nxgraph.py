"""One layer's attention as a networkx graph, and the tokens that collect attention (hubs, PageRank [2]_).

References
----------
.. [2] L. Page, S. Brin, R. Motwani and T. Winograd, "The PageRank Citation
   Ranking: Bringing Order to the Web", Stanford InfoLab, 1999.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
from torch import Tensor

from graphattn.analysis._checks import check_graph, edge_weights, num_nodes_of
from graphattn.validate import check_float, message

__all__ = ["to_networkx", "attention_received", "attention_pagerank"]


def to_networkx(
    edge_index: Tensor,
    alpha: Tensor,
    tokens: Sequence[str] | None = None,
    num_nodes: int | None = None,
    head: int | None = None,
) -> nx.DiGraph:
    """One layer's attention as a directed graph with edges j -> i weighted by alpha_ij.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E)
        Row 0 = source j (key), row 1 = target i (query); self-attention, so
        both index the same N nodes.
    alpha : Tensor, shape (E,) or (E, H)
        Attention weights in the order of ``edge_index``.
    tokens : sequence of str, length N, optional
        Stored as the node attribute ``"token"``.
    num_nodes : int, optional
        N; default ``len(tokens)``, else one more than the largest index. Every
        node is kept, also nodes without edges.
    head : int, optional
        Which head; ``None`` averages the heads.

    Returns
    -------
    networkx.DiGraph
        Nodes ``0 .. N-1``; edge ``(j, i)`` with attribute ``"weight"`` (a
        Python float; exact zeros are kept as edges). Duplicate edges are
        summed. Graph attribute ``"head"``: the head index or ``"mean"``.

    Raises
    ------
    TypeError
        ``edge_index`` not an integer Tensor (a nested list too), ``alpha`` not floating point.
    ValueError
        Bad shapes, NaN, inf or negative weights, or ``tokens`` of the wrong length.
    IndexError
        An index outside ``[0, N)`` (``num_nodes`` given) or a bad ``head``.

    Examples
    --------
    >>> import torch
    >>> g = to_networkx(torch.tensor([[0, 0, 1], [0, 1, 1]]), torch.tensor([1.0, 0.25, 0.75]),
    ...                 tokens=["a", "b", "c"])
    >>> sorted(g.edges(data="weight")), g.nodes[2]
    ([(0, 0, 1.0), (0, 1, 0.25), (1, 1, 0.75)], {'token': 'c'})
    """
    if tokens is not None and (isinstance(tokens, str) or not isinstance(tokens, Sequence)):
        raise TypeError(message("tokens", "a sequence of str, one per node", type(tokens).__name__))
    if num_nodes is None and tokens is not None:
        needed = num_nodes_of(edge_index, None)  # one more than the largest index (edge_index checked)
        if len(tokens) < needed:
            raise ValueError(
                message(
                    "tokens",
                    f"a sequence of at least {needed} entries, one per node (edge_index reaches node {needed - 1})",
                    len(tokens),
                )
            )
        num_nodes = len(tokens)
    n = num_nodes_of(edge_index, num_nodes)
    if tokens is not None and len(tokens) != n:
        raise ValueError(message("tokens", f"a sequence of {n} entries, one per node", len(tokens)))
    weight = edge_weights(edge_index, alpha, head).detach().cpu().double()  # (E,)

    graph = nx.DiGraph(head="mean" if head is None else int(head))
    graph.add_nodes_from(range(n))
    if tokens is not None:
        nx.set_node_attributes(graph, {k: str(t) for k, t in enumerate(tokens)}, "token")
    for (j, i), w in zip(edge_index.t().tolist(), weight.tolist()):
        if graph.has_edge(j, i):
            graph[j][i]["weight"] += w
        else:
            graph.add_edge(j, i, weight=w)
    return graph


def attention_received(graph: nx.DiGraph, weight: str = "weight") -> dict:
    """Total attention each token receives as a key: ``sum_i alpha_ij``.

    On the graph of :func:`to_networkx` (edges j -> i) this is the weighted
    out-degree of j; read the other way round (i reads j) it is j's
    in-strength. With N queries whose weights sum to 1, the values lie in
    ``[0, N]`` and sum to the number of queries with at least one edge.

    Parameters
    ----------
    graph : networkx.DiGraph
        Edges j -> i.
    weight : str, default "weight"
        Edge attribute holding alpha_ij.

    Returns
    -------
    dict
        Node -> Python float.

    Raises
    ------
    TypeError, ValueError
        ``graph`` not a DiGraph; a weight that is not a finite non-negative number.

    Examples
    --------
    >>> import networkx as nx
    >>> g = nx.DiGraph([(0, 0, {"weight": 1.0}), (0, 1, {"weight": 0.5}), (1, 1, {"weight": 0.5})])
    >>> attention_received(g)
    {0: 1.5, 1: 0.5}
    """
    check_graph(graph, weight)
    return {node: float(s) for node, s in graph.out_degree(weight=weight)}


def attention_pagerank(graph: nx.DiGraph, weight: str = "weight", alpha: float = 0.85) -> dict:
    """PageRank of the tokens as keys: a random reader that follows attention.

    The walker at query i moves to key j with probability alpha_ij (each
    query's weights sum to 1, so this is a proper random walk), or jumps to
    a uniformly random token with probability ``1 - alpha``. A token ranks
    high when tokens that rank high attend to it [2]_. Computed with
    :func:`networkx.pagerank` on the reversed graph (edges i -> j).

    Parameters
    ----------
    graph : networkx.DiGraph
        Edges j -> i as from :func:`to_networkx`.
    weight : str, default "weight"
        Edge attribute holding alpha_ij.
    alpha : float, default 0.85
        Damping factor in (0, 1), open at both ends.

    Returns
    -------
    dict
        Node -> Python float; the values sum to 1.

    Raises
    ------
    TypeError, ValueError
        As :func:`attention_received`, and ``alpha`` outside (0, 1).

    References
    ----------
    .. [2] Page, Brin, Motwani and Winograd, "The PageRank Citation Ranking", 1999.

    Examples
    --------
    >>> import networkx as nx
    >>> star = nx.DiGraph([(0, i, {"weight": 1.0}) for i in range(5)])  # everyone reads token 0
    >>> {k: round(v, 4) for k, v in attention_pagerank(star).items()}
    {0: 0.88, 1: 0.03, 2: 0.03, 3: 0.03, 4: 0.03}
    """
    check_graph(graph, weight)
    alpha = check_float("alpha", alpha, 0.0, 1.0, low_open=True, high_open=True)
    ranks = nx.pagerank(graph.reverse(copy=False), alpha=alpha, weight=weight, tol=1e-12, max_iter=1000)
    return {node: float(r) for node, r in ranks.items()}
