"""Per-edge weights <-> dense per-head weights (part of :mod:`graphattn.graphs`)."""

from __future__ import annotations

from torch import Tensor

from graphattn.graphs.edges import _check_dense, _size_pair, check_edge_index
from graphattn.validate import check_tensor, message

__all__ = ["edge_weights_to_dense", "dense_to_edge_weights"]


def edge_weights_to_dense(edge_index: Tensor, alpha: Tensor, size) -> Tensor:
    """Scatter per-edge weights into dense per-head matrices, zero off the edges.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E)
        Row 0 = source j (key), row 1 = target i (query).
    alpha : Tensor, shape (E,) or (E, H)
        One weight per edge (and head). Duplicate edges are summed.
    size : int or (int, int)
        ``N`` for a square graph, or the PyG pair ``(S, L)`` (sources, targets).

    Returns
    -------
    weights : Tensor, shape (H, L, S), or (L, S) for a 1-D ``alpha``
        Queries on rows: ``weights[h, i, j] = alpha[e, h]`` for the edge ``e = (j, i)``.

    Raises
    ------
    TypeError, ValueError, IndexError
        As :func:`edge_index_to_mask`, and ``alpha`` not ``(E,)`` or ``(E, H)``.

    Examples
    --------
    >>> import torch
    >>> edge_weights_to_dense(torch.tensor([[0, 0, 1], [0, 1, 1]]), torch.tensor([1.0, 0.25, 0.75]), 2)
    tensor([[1.0000, 0.0000],
            [0.2500, 0.7500]])
    """
    num_src, num_dst = _size_pair(size)
    check_edge_index(edge_index, num_src, num_dst)
    shape_text = f"(E,) or (E, H) with E = {edge_index.size(1)}"
    check_tensor("alpha", alpha, dim=(1, 2), shape_text=shape_text)
    if alpha.size(0) != edge_index.size(1):
        raise ValueError(message("alpha", f"a Tensor of shape {shape_text}", f"shape {tuple(alpha.shape)}"))
    flat = alpha.unsqueeze(-1) if alpha.dim() == 1 else alpha  # (E, H)
    _check_dense(num_dst, num_src, flat.size(1))
    dense = flat.new_zeros(num_dst, num_src, flat.size(1))  # (L, S, H)
    dense.index_put_((edge_index[1], edge_index[0]), flat, accumulate=True)
    dense = dense.permute(2, 0, 1)  # (H, L, S)
    return dense[0] if alpha.dim() == 1 else dense


def dense_to_edge_weights(weights: Tensor, edge_index: Tensor) -> Tensor:
    """Read dense per-head weights at the edges: the inverse of :func:`edge_weights_to_dense`.

    Parameters
    ----------
    weights : Tensor, shape (H, L, S) or (L, S)
        Queries on rows, keys on columns.
    edge_index : Tensor, shape (2, E)

    Returns
    -------
    alpha : Tensor, shape (E, H), or (E,) for 2-D ``weights``
        ``alpha[e, h] = weights[h, i, j]`` for the edge ``e = (j, i)``.

    Examples
    --------
    >>> import torch
    >>> dense_to_edge_weights(torch.tensor([[1.0, 0.0], [0.25, 0.75]]), torch.tensor([[0, 0, 1], [0, 1, 1]]))
    tensor([1.0000, 0.2500, 0.7500])
    """
    check_tensor("weights", weights, dim=(2, 3), shape_text="(H, L, S) or (L, S)")
    num_dst, num_src = weights.shape[-2:]
    check_edge_index(edge_index, num_src, num_dst)
    if weights.dim() == 2:
        return weights[edge_index[1], edge_index[0]]  # (E,)
    return weights[:, edge_index[1], edge_index[0]].t()  # (H, E) -> (E, H)
