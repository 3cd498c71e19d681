"""Following information through the layers: attention rollout and attention flow [1]_.

References
----------
.. [1] S. Abnar and W. Zuidema, "Quantifying Attention Flow in Transformers",
   ACL 2020, section 3. https://arxiv.org/abs/2005.00928
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import networkx as nx
import torch
from networkx.algorithms.flow import build_residual_network, shortest_augmenting_path
from torch import Tensor

from graphattn.analysis._checks import layer_list, num_nodes_of
from graphattn.validate import check_bool, check_int, message

__all__ = ["attention_rollout", "attention_flow", "FLOW_MAX_NODES"]

FLOW_MAX_NODES = 32  # attention flow runs N^2 max-flows on a graph of (layers + 1) N nodes


def _augmented(edge_index: Tensor, weight: Tensor, n: int, residual: bool) -> Tensor:
    """Sparse (N, N) matrix, rows = queries i: ``A`` or the rollout's ``(A + I) / 2``, rows renormalised."""
    dst, src = edge_index[1].long(), edge_index[0].long()  # (E,), (E,)
    if residual:
        diag = torch.arange(n, device=weight.device)  # (N,)
        dst, src = torch.cat([dst, diag]), torch.cat([src, diag])  # (E + N,)
        weight = torch.cat([0.5 * weight, weight.new_full((n,), 0.5)])  # (E + N,)
        row_sum = weight.new_zeros(n).index_add_(0, dst, weight)  # (N,)
        weight = weight / row_sum[dst]  # (E + N,); every row holds the 0.5 diagonal, so > 0
    matrix = torch.sparse_coo_tensor(torch.stack([dst, src]), weight, (n, n), check_invariants=True)  # (N, N)
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
    residual : bool, default True
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
    TypeError
        Edge lists not integer Tensors (nested lists too), weights not floating point.
    ValueError
        Shapes that do not agree, no layers, NaN, inf or negative weights.
    IndexError
        Indices out of range (``edge_index[l]`` names the layer).

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
    residual = check_bool("residual", residual)
    layers = layer_list(edge_index, alphas)
    n = num_nodes_of(layers[0][0], num_nodes, layers[0][2])
    result = None
    for ei, weight, name in layers:
        num_nodes_of(ei, n, name)
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
    normalize : bool, default True
        Divide each output row by its sum, as in the paper's code, so rows
        sum to 1 (rows with no flow stay 0).
    max_nodes : int, default 32
        Refuse longer inputs: the cost is N^2 max-flow problems on a graph of
        (layers + 1) N nodes and up to layers * N^2 edges: about 1.5 s for
        N = 16 and 6 layers on one CPU core, growing as N^4. Default 32.

    Returns
    -------
    Tensor, shape (N, N), float64
        Rows = output positions i (after the last layer), columns = input tokens j.

    Raises
    ------
    TypeError, ValueError, IndexError
        N above ``max_nodes``, or as :func:`attention_rollout`.

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
    residual, normalize = check_bool("residual", residual), check_bool("normalize", normalize)
    max_nodes = check_int("max_nodes", max_nodes, 1)
    layers = layer_list(edge_index, alphas)
    n = num_nodes_of(layers[0][0], num_nodes, layers[0][2])
    if n > max_nodes:
        raise ValueError(
            message(
                "num_nodes",
                f"at most 'max_nodes' = {max_nodes} tokens for attention flow",
                n,
                "use attention_rollout for longer inputs or raise max_nodes",
            )
        )
    graph = nx.DiGraph()
    graph.add_nodes_from((0, j) for j in range(n))
    for layer, (ei, weight, name) in enumerate(layers, start=1):
        num_nodes_of(ei, n, name)
        matrix = _augmented(ei, weight.detach().cpu().double(), n, residual)  # (N, N) rows = queries
        (dst, src), cap = matrix.indices().tolist(), matrix.values().tolist()
        graph.add_nodes_from((layer, i) for i in range(n))
        graph.add_edges_from(((layer - 1, j), (layer, i), {"capacity": c}) for i, j, c in zip(dst, src, cap))
    last = len(layers)
    flow = torch.zeros(n, n, dtype=torch.float64)  # (N, N) rows = outputs i, columns = inputs j
    residual_net = build_residual_network(graph, "capacity")  # built once, reset by every call
    for i in range(n):
        for j in range(n):
            flow[i, j] = shortest_augmenting_path(
                graph, (0, j), (last, i), capacity="capacity", residual=residual_net
            ).graph["flow_value"]
    if normalize:
        total = flow.sum(dim=1, keepdim=True)  # (N, 1)
        flow = flow / total.masked_fill(total == 0, 1.0)
    return flow
