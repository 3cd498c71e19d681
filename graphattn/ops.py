"""Attention kernels over an edge list: scores, per-target softmax, aggregation.

For every edge ``(j, i)`` of ``edge_index`` (row 0 = source = key j, row 1 =
target = query i) and every head h:

1) score      ``s_ijh = (q_ih · k_jh) * scale (+ edge_bias_ijh)``
2) softmax    ``alpha_ijh = exp(s_ijh) / sum_{j' -> i} exp(s_ij'h)`` over the incoming edges of i
3) aggregate  ``y_ih = sum_{j -> i} alpha_ijh v_jh``

A query with no incoming edge gets an exact zero row (DESIGN.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn.graphs import check_edge_index

__all__ = ["attention", "segment_softmax", "check_qkv"]


def check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Validate ``query (L, H, D)``, ``key (S, H, D)``, ``value (S, H, D_v)``.

    Raises
    ------
    TypeError
        If they are not floating-point tensors of one dtype.
    ValueError
        If their shapes do not agree.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"Expected '{name}' to be a Tensor (got {type(t).__name__})")
        if t.dim() != 3:
            raise ValueError(f"Expected '{name}' to have shape (n, H, D) (got {tuple(t.shape)})")
        if not t.is_floating_point():
            raise TypeError(f"Expected '{name}' to be floating point (got {t.dtype})")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"Expected 'query', 'key' and 'value' to share one dtype (got {query.dtype}, {key.dtype}, {value.dtype})"
        )
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(
            f"Expected 'key' (S, H, D) and 'value' (S, H, D_v) to agree on S and H "
            f"(got {tuple(key.shape)} and {tuple(value.shape)})"
        )
    if query.shape[1:] != key.shape[1:]:
        raise ValueError(
            f"Expected 'query' (L, H, D) and 'key' (S, H, D) to agree on H and D "
            f"(got {tuple(query.shape)} and {tuple(key.shape)})"
        )


def check_edge_bias(edge_bias: Tensor | None, num_edges: int, heads: int) -> Tensor | None:
    """Validate ``edge_bias`` of shape ``(E,)`` or ``(E, H)``; return it as ``(E, H)`` or ``(E, 1)``."""
    if edge_bias is None:
        return None
    if not isinstance(edge_bias, Tensor) or not edge_bias.is_floating_point():
        got = edge_bias.dtype if isinstance(edge_bias, Tensor) else type(edge_bias).__name__
        raise TypeError(f"Expected 'edge_bias' to be a floating-point Tensor (got {got})")
    if edge_bias.dim() == 1:
        edge_bias = edge_bias.unsqueeze(-1)  # (E, 1)
    if edge_bias.dim() != 2 or edge_bias.size(0) != num_edges or edge_bias.size(1) not in (1, heads):
        raise ValueError(
            f"Expected 'edge_bias' to have shape (E,) or (E, H) = ({num_edges},) or ({num_edges}, {heads}) "
            f"(got {tuple(edge_bias.shape)})"
        )
    if torch.isnan(edge_bias).any() or torch.isposinf(edge_bias).any():
        raise ValueError("Expected 'edge_bias' to hold no NaN or +inf (-inf is allowed and removes the edge)")
    return edge_bias


def segment_softmax(score: Tensor, index: Tensor, num_targets: int) -> Tensor:
    """Softmax of edge scores over the incoming edges of each target.

    Parameters
    ----------
    score : Tensor, shape (E, H)
        Edge scores; ``-inf`` removes an edge.
    index : Tensor, shape (E,)
        Target i of each edge (``edge_index[1]``), in ``[0, num_targets)``.
    num_targets : int
        L.

    Returns
    -------
    alpha : Tensor, shape (E, H)
        Sums to 1 over the edges of each target that has a finite score, and is
        exactly 0 on the edges of a target whose scores are all ``-inf``.
    """
    heads = score.size(1)
    idx = index.unsqueeze(-1).expand_as(score)  # (E, H)
    seg_max = score.new_full((num_targets, heads), float("-inf"))
    seg_max = seg_max.scatter_reduce(0, idx, score.detach(), reduce="amax", include_self=True)  # (L, H)
    seg_max = seg_max.masked_fill(torch.isinf(seg_max), 0.0)  # a target without finite scores
    exp = torch.exp(score - seg_max[index])  # (E, H)
    denom = exp.new_zeros(num_targets, heads).index_add_(0, index, exp)  # (L, H)
    denom = denom[index]  # (E, H)
    return exp / denom.masked_fill(denom == 0, 1.0)  # (E, H); 0 / 1 = 0 for all -inf targets


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    edge_index: Tensor,
    *,
    scale: float | None = None,
    edge_bias: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = True,
) -> tuple[Tensor, Tensor]:
    """Multi-head attention restricted to the edges of a graph (no parameters).

    .. math::
        \\alpha_{ij}^h = \\mathrm{softmax}_{j \\in \\mathcal{N}(i)}
        \\big(\\mathrm{scale}\\; q_i^h \\cdot k_j^h + b_{ij}^h\\big),
        \\qquad y_i^h = \\sum_{j \\in \\mathcal{N}(i)} \\alpha_{ij}^h v_j^h

    where :math:`\\mathcal{N}(i)` are the sources of the edges into target i.

    Parameters
    ----------
    query : Tensor, shape (L, H, D)
        One row per query (target) node i.
    key : Tensor, shape (S, H, D)
        One row per key (source) node j.
    value : Tensor, shape (S, H, D_v)
    edge_index : Tensor, shape (2, E)
        Row 0 = source j (key), row 1 = target i (query). Any order; duplicate
        edges count as separate edges (each gets its own weight).
    scale : float, optional
        Default ``1 / sqrt(D)``.
    edge_bias : Tensor, shape (E,) or (E, H), optional
        Added to the scaled scores before the softmax (relative positions,
        ALiBi, graph distances); ``-inf`` removes an edge.
    dropout : float
        Dropout probability on the attention weights, in [0, 1).
    training : bool
        Apply dropout only when True (pass ``module.training``).

    Returns
    -------
    output : Tensor, shape (L, H, D_v)
        A query with no incoming edge gets an exact zero row.
    alpha : Tensor, shape (E, H)
        Attention weight of each edge, in the order of ``edge_index``; for each
        query i they sum to 1 over its edges (after dropout if applied, as
        ``nn.MultiheadAttention`` returns them).

    Raises
    ------
    TypeError
        Non-float features, mixed dtypes, or a non-integer ``edge_index``.
    ValueError
        Shapes that do not agree, ``edge_bias`` of the wrong shape or holding
        NaN/+inf, ``dropout`` outside [0, 1).
    IndexError
        An ``edge_index`` entry outside ``[0, S)`` (sources) or ``[0, L)`` (targets).

    Examples
    --------
    >>> import torch
    >>> q = k = v = torch.eye(2).reshape(2, 1, 2)          # L = S = 2, H = 1, D = 2
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])  # 0 -> 0, 0 -> 1, 1 -> 1
    >>> out, alpha = attention(q, k, v, edge_index)
    >>> alpha.squeeze(-1)
    tensor([1.0000, 0.3302, 0.6698])
    """
    check_qkv(query, key, value)
    check_edge_index(edge_index, key.size(0), query.size(0))
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"Expected 'dropout' to be in [0, 1) (got {dropout})")
    num_targets, heads, dim = query.shape
    edge_bias = check_edge_bias(edge_bias, edge_index.size(1), heads)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    src, dst = edge_index[0].long(), edge_index[1].long()  # (E,), (E,)

    # 1) score: q_i · k_j on every edge
    score = (query[dst] * key[src]).sum(dim=-1) * scale  # (E, H, D) · (E, H, D) -> (E, H)
    if edge_bias is not None:
        score = score + edge_bias  # (E, H)
    # 2) softmax over the incoming edges of each query
    alpha = segment_softmax(score, dst, num_targets)  # (E, H)
    if dropout > 0.0 and training:
        alpha = F.dropout(alpha, p=dropout)
    # 3) aggregate: weighted sum of the values at each query
    msg = alpha.unsqueeze(-1) * value[src]  # (E, H, 1) * (E, H, D_v) -> (E, H, D_v)
    out = value.new_zeros(num_targets, heads, value.size(-1)).index_add_(0, dst, msg)  # (L, H, D_v)
    return out, alpha
