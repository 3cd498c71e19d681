"""Attention graphs as networkx graphs: export, rollout, flow, hubs, smoothing.

Every function follows DESIGN.md: an edge ``(j, i)`` (``edge_index[0] = j``,
``edge_index[1] = i``) says query i reads key j with weight alpha_ij, and for
each query the weights sum to 1 over its incoming edges. Node indices are token
positions, so ``|i - j|`` is a distance in tokens.

- :func:`to_networkx` turns one layer's ``(edge_index, alpha)`` into a
  ``networkx.DiGraph`` with edges j -> i (GraphML export works).
- :func:`attention_received` and :func:`attention_pagerank` rank the tokens
  that collect attention (hubs such as [CLS] and [SEP]); graph first,
  ``weight="weight"``, dicts keyed by node holding Python floats.
- :func:`attention_rollout` and :func:`attention_flow` follow information
  through the layers (Abnar & Zuidema 2020 [1]_).
- :func:`self_share` and :func:`mean_attention_distance` summarise each head;
  :func:`mean_cosine_similarity` measures over-smoothing of representations.

References
----------
.. [1] S. Abnar and W. Zuidema, "Quantifying Attention Flow in Transformers",
   ACL 2020, section 3. https://arxiv.org/abs/2005.00928
.. [2] L. Page, S. Brin, R. Motwani and T. Winograd, "The PageRank Citation
   Ranking: Bringing Order to the Web", Stanford InfoLab, 1999.
.. [3] K. Ethayarajh, "How Contextual are Contextualized Word
   Representations?", EMNLP 2019 (mean pairwise cosine similarity per layer).
"""

from __future__ import annotations

import warnings
from typing import Sequence

import networkx as nx
from networkx.algorithms.flow import build_residual_network, shortest_augmenting_path
import torch
from torch import Tensor

from graphattn.graphs import check_edge_index

__all__ = [
    "to_networkx",
    "attention_received",
    "attention_pagerank",
    "attention_rollout",
    "attention_flow",
    "self_share",
    "mean_attention_distance",
    "mean_cosine_similarity",
    "smoothing_per_layer",
]

FLOW_MAX_NODES = 32  # attention flow runs N^2 max-flows on a graph of (layers + 1) N nodes


def _edge_weights(edge_index: Tensor, alpha: Tensor, head: int | None, name: str = "alpha") -> Tensor:
    """Return the per-edge weight, shape (E,): one head of ``alpha`` or the mean over heads."""
    if not isinstance(alpha, Tensor):
        raise TypeError(f"Expected '{name}' to be a Tensor (got {type(alpha).__name__})")
    num_edges = edge_index.size(1)
    if alpha.dim() not in (1, 2) or alpha.size(0) != num_edges:
        raise ValueError(f"Expected '{name}' to have shape (E,) or (E, H) with E = {num_edges} "
                         f"(got {tuple(alpha.shape)})")
    if alpha.dim() == 1:
        return alpha
    if head is None:
        return alpha.mean(dim=1)  # (E, H) -> (E,)
    if not -alpha.size(1) <= head < alpha.size(1):
        raise IndexError(f"Expected 'head' to be in [0, {alpha.size(1)}) (got {head})")
    return alpha[:, head]  # (E,)


def _num_nodes(edge_index: Tensor, num_nodes: int | None) -> int:
    n = (int(edge_index.max()) + 1 if edge_index.numel() else 0) if num_nodes is None else int(num_nodes)
    check_edge_index(edge_index, n, n)
    return n


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
    ValueError
        Bad shapes, or ``tokens`` of the wrong length.
    IndexError
        An index outside ``[0, N)`` or a bad ``head``.

    Examples
    --------
    >>> import torch
    >>> g = to_networkx(torch.tensor([[0, 0, 1], [0, 1, 1]]), torch.tensor([1.0, 0.25, 0.75]),
    ...                 tokens=["a", "b", "c"])
    >>> sorted(g.edges(data="weight")), g.nodes[2]
    ([(0, 0, 1.0), (0, 1, 0.25), (1, 1, 0.75)], {'token': 'c'})
    """
    if num_nodes is None and tokens is not None:
        num_nodes = len(tokens)
    n = _num_nodes(edge_index, num_nodes)
    if tokens is not None and len(tokens) != n:
        raise ValueError(f"Expected 'tokens' to have {n} entries (got {len(tokens)})")
    weight = _edge_weights(edge_index, alpha, head).detach().cpu().double()  # (E,)

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
    weight : str
        Edge attribute holding alpha_ij.

    Returns
    -------
    dict
        Node -> Python float.

    Examples
    --------
    >>> import networkx as nx
    >>> g = nx.DiGraph([(0, 0, {"weight": 1.0}), (0, 1, {"weight": 0.5}), (1, 1, {"weight": 0.5})])
    >>> attention_received(g)
    {0: 1.5, 1: 0.5}
    """
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
    weight : str
        Edge attribute holding alpha_ij.
    alpha : float
        Damping factor in (0, 1).

    Returns
    -------
    dict
        Node -> Python float; the values sum to 1.

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
    ranks = nx.pagerank(graph.reverse(copy=False), alpha=alpha, weight=weight, tol=1e-12, max_iter=1000)
    return {node: float(r) for node, r in ranks.items()}


def _layer_list(edge_index, alphas, name: str = "alphas") -> list[tuple[Tensor, Tensor]]:
    """Pair each layer's edges with its head-averaged weights: list of ((2, E), (E,))."""
    if isinstance(alphas, Tensor):
        if alphas.dim() not in (2, 3):
            raise ValueError(f"Expected '{name}' to have shape (layers, E) or (layers, E, H) "
                             f"(got {tuple(alphas.shape)})")
        alphas = list(alphas.unbind(0))
    alphas = list(alphas)
    if not alphas:
        raise ValueError(f"Expected '{name}' to hold at least one layer (got 0)")
    edges = [edge_index] * len(alphas) if isinstance(edge_index, Tensor) else list(edge_index)
    if len(edges) != len(alphas):
        raise ValueError(f"Expected one 'edge_index' per layer ({len(alphas)}) (got {len(edges)})")
    return [(ei, _edge_weights(ei, a, None, name)) for ei, a in zip(edges, alphas)]


def _augmented(edge_index: Tensor, weight: Tensor, n: int, residual: bool) -> Tensor:
    """Sparse (N, N) matrix, rows = queries i: ``A`` or the rollout's ``(A + I) / 2``, rows renormalised."""
    dst, src = edge_index[1].long(), edge_index[0].long()  # (E,), (E,)
    if residual:
        diag = torch.arange(n, device=weight.device)  # (N,)
        dst, src = torch.cat([dst, diag]), torch.cat([src, diag])  # (E + N,)
        weight = torch.cat([0.5 * weight, weight.new_full((n,), 0.5)])  # (E + N,)
        row_sum = weight.new_zeros(n).index_add_(0, dst, weight)  # (N,)
        weight = weight / row_sum[dst]  # (E + N,); every row holds the 0.5 diagonal, so > 0
    matrix = torch.sparse_coo_tensor(torch.stack([dst, src]), weight, (n, n),
                                     check_invariants=True)  # (N, N)
    return matrix.coalesce()


def attention_rollout(
    edge_index: Tensor | Sequence[Tensor],
    alphas: Tensor | Sequence[Tensor],
    num_nodes: int | None = None,
    *,
    residual: bool = True,
) -> Tensor:
    """Attention rollout: how much each input token reaches each output position.

    .. math::
        \\hat A^{(l)} = \\mathrm{rownorm}\\big(\\tfrac12 (\\bar A^{(l)} + I)\\big), \\qquad
        R = \\hat A^{(n)} \\hat A^{(n-1)} \\cdots \\hat A^{(1)}

    where :math:`\\bar A^{(l)}` is layer l's attention averaged over heads
    (rows = queries i, columns = keys j) and the identity models the residual
    connection [1]_. Computed with ``torch.sparse`` on the edge lists; the
    result is sparse as long as the layers' reachability stays sparse.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E), or a sequence of them (one per layer)
        Row 0 = source j (key), row 1 = target i (query).
    alphas : Tensor of shape (layers, E, H), or a sequence of (E, H) or (E,) tensors
        Per-layer attention weights in the order of the edges; heads are averaged.
    num_nodes : int, optional
        N; default one more than the largest index in the first layer.
    residual : bool
        Add the identity and renormalise (rollout as published); False gives
        the plain product of the attention matrices.

    Returns
    -------
    Tensor, sparse COO, shape (N, N)
        ``R[i, j]``: share of output position i that comes from input token j;
        rows sum to 1 (with ``residual``; without it, rows of queries that
        reach no edge are 0). ``.to_dense()`` for a matrix.

    Raises
    ------
    ValueError, IndexError
        Shapes that do not agree, no layers, indices out of range.

    References
    ----------
    .. [1] Abnar and Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, eq. (1).

    Examples
    --------
    >>> import torch
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])          # causal, N = 2
    >>> alpha = torch.tensor([1.0, 0.5, 0.5])
    >>> attention_rollout(edge_index, [alpha]).to_dense()          # (A + I) / 2
    tensor([[1.0000, 0.0000],
            [0.2500, 0.7500]])
    """
    layers = _layer_list(edge_index, alphas)
    n = _num_nodes(layers[0][0], num_nodes)
    result = None
    for ei, weight in layers:
        _num_nodes(ei, n)
        matrix = _augmented(ei, weight, n, residual)  # (N, N)
        with warnings.catch_warnings():  # torch.sparse.mm goes through CSR internally and says it is beta
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            result = matrix if result is None else torch.sparse.mm(matrix, result)  # (N, N) · (N, N) -> (N, N)
    return result.coalesce()


def attention_flow(
    edge_index: Tensor | Sequence[Tensor],
    alphas: Tensor | Sequence[Tensor],
    num_nodes: int | None = None,
    *,
    residual: bool = True,
    normalize: bool = True,
    max_nodes: int = FLOW_MAX_NODES,
) -> Tensor:
    """Attention flow: max-flow from each input token to each output position.

    The layered graph has a node (l, i) per layer boundary l = 0..n and token
    i; an edge (l-1, j) -> (l, i) has capacity :math:`\\hat A^{(l)}_{ij}` (the
    rollout's residual-augmented, head-averaged attention). ``F[i, j]`` is the
    maximum flow from (0, j) to (n, i) [1]_, computed with networkx
    (shortest augmenting paths on one residual network reused for all pairs). Unlike rollout, a path's
    contribution is limited by its weakest edge rather than multiplied.

    Parameters
    ----------
    edge_index, alphas, num_nodes, residual
        As :func:`attention_rollout`.
    normalize : bool
        Divide each output row by its sum, as in the paper's code, so rows
        sum to 1 (rows with no flow stay 0).
    max_nodes : int
        Refuse longer inputs: the cost is N^2 max-flow problems on a graph of
        (layers + 1) N nodes and up to layers * N^2 edges: about 1.5 s for
        N = 16 and 6 layers on one CPU core, growing as N^4. Default 32.

    Returns
    -------
    Tensor, shape (N, N), float64
        Rows = output positions i (after the last layer), columns = input tokens j.

    Raises
    ------
    ValueError
        If N exceeds ``max_nodes``, or as :func:`attention_rollout`.

    References
    ----------
    .. [1] Abnar and Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020, section 3.

    Examples
    --------
    >>> import torch
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])
    >>> alpha = torch.tensor([1.0, 0.5, 0.5])
    >>> attention_flow(edge_index, [alpha, alpha], residual=False, normalize=False)
    tensor([[1.0000, 0.0000],
            [1.0000, 0.5000]], dtype=torch.float64)
    """
    layers = _layer_list(edge_index, alphas)
    n = _num_nodes(layers[0][0], num_nodes)
    if n > max_nodes:
        raise ValueError(f"Expected at most 'max_nodes' = {max_nodes} tokens for attention flow (got {n}); "
                         "use attention_rollout for longer inputs or raise max_nodes")
    graph = nx.DiGraph()
    graph.add_nodes_from((0, j) for j in range(n))
    for layer, (ei, weight) in enumerate(layers, start=1):
        _num_nodes(ei, n)
        matrix = _augmented(ei, weight.detach().cpu().double(), n, residual)  # (N, N) rows = queries
        (dst, src), cap = matrix.indices().tolist(), matrix.values().tolist()
        graph.add_nodes_from((layer, i) for i in range(n))
        graph.add_edges_from(((layer - 1, j), (layer, i), {"capacity": c}) for i, j, c in zip(dst, src, cap))
    last = len(layers)
    flow = torch.zeros(n, n, dtype=torch.float64)  # (N, N) rows = outputs i, columns = inputs j
    residual_net = build_residual_network(graph, "capacity")  # built once, reset by every call
    for i in range(n):
        for j in range(n):
            flow[i, j] = shortest_augmenting_path(graph, (0, j), (last, i), capacity="capacity",
                                                  residual=residual_net).graph["flow_value"]
    if normalize:
        total = flow.sum(dim=1, keepdim=True)  # (N, 1)
        flow = flow / total.masked_fill(total == 0, 1.0)
    return flow


def _stacked(alpha, name: str = "alpha", edge_index: Tensor | None = None) -> Tensor:
    """``alpha`` as (layers, E, H) from (E, H), (layers, E, H) or a list of (E, H); E checked against ``edge_index``."""
    if not isinstance(alpha, Tensor):
        alpha = torch.stack(list(alpha))  # (layers, E, H)
    if alpha.dim() == 2:
        alpha = alpha.unsqueeze(0)  # (1, E, H)
    if alpha.dim() != 3:
        raise ValueError(f"Expected '{name}' to have shape (E, H) or (layers, E, H) (got {tuple(alpha.shape)})")
    if edge_index is not None:
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"Expected 'edge_index' to have shape (2, E) (got {tuple(edge_index.shape)})")
        if alpha.size(1) != edge_index.size(1):
            raise ValueError(f"Expected '{name}' to have E = {edge_index.size(1)} rows (got {alpha.size(1)})")
    return alpha


def self_share(edge_index: Tensor, alpha: Tensor | Sequence[Tensor]) -> Tensor:
    """Share of the attention on the diagonal (query i reading itself), per layer and head.

    .. math:: s^h = \\frac{\\sum_i \\alpha^h_{ii}}{\\sum_{(j,i)} \\alpha^h_{ij}}

    which is the mean of alpha_ii over the queries that have edges, since each
    such query's weights sum to 1.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E)
        Row 0 = source j (key), row 1 = target i (query).
    alpha : Tensor, shape (E, H) or (layers, E, H), or a sequence of (E, H)

    Returns
    -------
    Tensor, shape (layers, H)
        Fractions in [0, 1] (``layers = 1`` for a 2-D ``alpha``); 0 for a head
        with no weight at all.

    Examples
    --------
    >>> import torch
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])
    >>> self_share(edge_index, torch.tensor([[1.0], [0.5], [0.5]]))   # (1 + 0.5) / 2
    tensor([[0.7500]])
    """
    a = _stacked(alpha, edge_index=edge_index)  # (layers, E, H)
    is_self = (edge_index[0] == edge_index[1]).to(a.dtype)  # (E,)
    diag = (a * is_self[None, :, None]).sum(dim=1)  # (layers, E, H) -> (layers, H)
    total = a.sum(dim=1)  # (layers, H)
    return diag / total.masked_fill(total == 0, 1.0)


def mean_attention_distance(edge_index: Tensor, alpha: Tensor | Sequence[Tensor]) -> Tensor:
    """Mean attention distance per layer and head: ``sum_j alpha_ij |i - j|`` averaged over queries i.

    Node indices are taken as token positions, so the unit is tokens. Queries
    with no incoming edge are left out of the average.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E)
        Row 0 = source j (key), row 1 = target i (query).
    alpha : Tensor, shape (E, H) or (layers, E, H), or a sequence of (E, H)

    Returns
    -------
    Tensor, shape (layers, H)
        In tokens, >= 0.

    Examples
    --------
    >>> import torch
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])
    >>> mean_attention_distance(edge_index, torch.tensor([[1.0], [0.5], [0.5]]))  # (0 + 0.5) / 2
    tensor([[0.2500]])
    """
    a = _stacked(alpha, edge_index=edge_index)  # (layers, E, H)
    dist = (edge_index[1] - edge_index[0]).abs().to(a.dtype)  # (E,)
    num_queries = edge_index[1].unique().numel()  # queries with at least one edge
    per_head = (a * dist[None, :, None]).sum(dim=1)  # (layers, E, H) -> (layers, H)
    return per_head / max(num_queries, 1)


def mean_cosine_similarity(x: Tensor) -> float:
    """Mean pairwise cosine similarity of token representations (over-smoothing).

    .. math:: \\frac{1}{N (N - 1)} \\sum_{i \\ne j} \\frac{x_i \\cdot x_j}{\\|x_i\\| \\|x_j\\|}

    1 means every token has the same direction (fully smoothed); apply it to
    the hidden states of each layer to see smoothing grow with depth [3]_.

    Parameters
    ----------
    x : Tensor, shape (N, F)
        One row per token; N >= 2, no zero rows.

    Returns
    -------
    float
        In [-1, 1].

    Raises
    ------
    ValueError
        If ``x`` is not 2-D, has fewer than two rows, or has a zero row.

    References
    ----------
    .. [3] Ethayarajh, "How Contextual are Contextualized Word Representations?", EMNLP 2019.

    Examples
    --------
    >>> import torch
    >>> mean_cosine_similarity(torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]))   # (0 + 1 + 0) / 3
    0.3333333333333333
    """
    if not isinstance(x, Tensor) or x.dim() != 2 or x.size(0) < 2:
        raise ValueError(f"Expected 'x' to have shape (N, F) with N >= 2 (got {tuple(getattr(x, 'shape', ()))})")
    norm = x.double().norm(dim=1, keepdim=True)  # (N, 1)
    if (norm == 0).any():
        raise ValueError(f"Expected 'x' to have no zero rows (got {int((norm == 0).sum())})")
    unit = x.double() / norm  # (N, F)
    sim = unit @ unit.T  # (N, F) · (F, N) -> (N, N)
    n = x.size(0)
    return float((sim.sum() - sim.diagonal().sum()) / (n * (n - 1)))


def smoothing_per_layer(hidden_states: Sequence[Tensor]) -> list[float]:
    """:func:`mean_cosine_similarity` of each layer's token representations.

    Parameters
    ----------
    hidden_states : sequence of Tensor, each shape (N, F)
        E.g. the embedding output and every layer's output of one sequence
        (``AttentionRecord.hidden_states``, or a Hugging Face model's
        ``hidden_states`` with the batch axis removed and padding dropped).

    Returns
    -------
    list of float
        One value in [-1, 1] per entry; a rising sequence is over-smoothing.

    Raises
    ------
    ValueError
        As :func:`mean_cosine_similarity`, for any entry.

    Examples
    --------
    >>> import torch
    >>> [round(s, 6) for s in smoothing_per_layer([torch.eye(3), torch.ones(3, 2)])]
    [0.0, 1.0]
    """
    return [mean_cosine_similarity(h) for h in hidden_states]
