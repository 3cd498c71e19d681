"""The public entry :func:`scored_attention`: attention over given edge scores (GAT's additive attention)."""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn import _compat
from graphattn.ops.dispatch import _check_edge_list, _edge_attention, check_edge_bias
from graphattn.ops.guard import maybe_nan_or_posinf
from graphattn.validate import check_bool, check_int, check_probability, check_tensor, message

__all__ = ["scored_attention"]


def scored_attention(
    score: Tensor,
    value: Tensor,
    edge_index: Tensor,
    num_targets: int,
    *,
    dropout: float = 0.0,
    training: bool = True,
    need_weights: bool = False,
    loops: int = 0,
) -> tuple[Tensor, Tensor | None]:
    r"""Softmax of given edge scores over each target's incoming edges, then the weighted sum of values.

    .. math::
        \alpha_{ij}^h = \mathrm{softmax}_{j \in \mathcal{N}(i)}(s_{ij}^h), \qquad
        y_i^h = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}^h v_j^h

    The additive attention of GAT [1]_ and GATv2 [2]_ computes ``s_ij`` from
    per-node halves and an edge term (:class:`graphattn.GATConv`); this runs
    the rest on the ``graphattn::attention`` operator (the CSR kernel with the
    scores as its ``edge_bias`` and no query/key channels), so no ``(E, H, D)``
    message tensor is formed.

    Parameters
    ----------
    score : Tensor, shape (E + loops, H)
        Score of each edge and head, in the order of ``edge_index`` (then
        the loops); ``-inf`` gives an edge the weight 0 (NaN and ``+inf`` are
        refused).
    value : Tensor, shape (S, H, D_v)
        One row per source node j.
    edge_index : Tensor, shape (2, E)
        Row 0 = source j, row 1 = target i.
    num_targets : int
        L, the number of target (query) nodes.
    dropout : float, default 0.0
        Dropout on the weights, in [0, 1).
    training : bool, default True
    need_weights : bool, default False
        Also return ``alpha (E + loops, H)`` (after dropout).
    loops : int, default 0
        PyG's self-loops (GAT's ``remove_self_loops`` then ``add_self_loops``)
        with shapes known before the values: the edges ``(i, i)`` for
        ``i < loops`` (at most ``min(S, L)``) follow ``edge_index``'s, as if
        concatenated to it, and when ``loops > 0`` the graph's own loops
        ``(i, i)`` in ``edge_index`` are left out: weight exactly 0, their
        scores' gradient 0, as edges PyG removed. The structure is cached
        under ``edge_index`` itself, so a model that appends the loops on every
        call (compiled too) sorts the edges once and masks nothing per call.

    Returns
    -------
    output : Tensor, shape (L, H, D_v)
        A target without incoming edges gets an exact zero row.
    alpha : Tensor, shape (E + loops, H), or None
        0 for the own loops left out (``loops > 0``).

    Raises
    ------
    TypeError, ValueError, IndexError
        As :func:`attention` for ``edge_index``, ``value`` and ``dropout``;
        ``score`` not of shape (E, H) or not of ``value``'s dtype.

    References
    ----------
    .. [1] Velickovic et al., "Graph Attention Networks", ICLR 2018, eq. (3)-(4).
    .. [2] Brody, Alon and Yahav, "How Attentive are Graph Attention Networks?", ICLR 2022, eq. (7).

    Examples
    --------
    >>> import torch
    >>> edge_index = torch.tensor([[0, 1, 1], [1, 1, 0]])   # 0 -> 1, 1 -> 1, 1 -> 0
    >>> score = torch.tensor([[0.0], [0.0], [5.0]])         # (E, H = 1)
    >>> value = torch.tensor([[[1.0]], [[3.0]]])            # (S = 2, H, D_v = 1)
    >>> scored_attention(score, value, edge_index, 2)[0].flatten()
    tensor([3., 2.])
    """
    check_tensor("value", value, dim=3, shape_text="(S, H, D_v)", floating=True)
    _check_edge_list(edge_index)
    S, H, _ = value.shape
    num_targets = check_int("num_targets", num_targets, low=0)
    loops = check_int("loops", loops, low=0)
    if not torch.compiler.is_compiling() and loops > min(S, num_targets):  # (compiled: the operator checks)
        raise ValueError(message("loops", f"at most min(S, num_targets) = {min(S, num_targets)}", loops))
    E = edge_index.size(1) + loops
    if not isinstance(score, Tensor) or score.dim() != 2 or score.shape != (E, H):
        got = tuple(score.shape) if isinstance(score, Tensor) else type(score).__name__
        shape_text = "(E + loops, H)" if loops else "(E, H)"
        raise ValueError(message("score", f"shape {shape_text} = {(E, H)}", got))
    check_tensor("score", score, floating=True)
    if score.dtype != value.dtype:
        raise TypeError(message("score", f"of the dtype of 'value' ({value.dtype})", score.dtype))
    readable = not torch.compiler.is_compiling() and not _compat.functorch_active()  # (vmap: values unreadable)
    if readable and score.numel() and bool(_read_non_finite(score, edge_index, loops)):
        raise ValueError(message("score", "free of NaN and +inf", "a NaN or +inf entry", "-inf gives weight 0"))
    dropout = check_probability("dropout", dropout)
    p = dropout if check_bool("training", training) else 0.0
    check_bool("need_weights", need_weights)
    edge_bias = check_edge_bias(score, E, H, dtype=value.dtype, check_values=False)
    empty = value.new_empty(num_targets, H, 0), value.new_empty(S, H, 0)  # no query/key channels
    return _edge_attention(*empty, value, edge_index, edge_bias, 1.0, p, need_weights, "auto", loops)


def _read_non_finite(score: Tensor, edge_index: Tensor, loops: int) -> Tensor | bool:
    """True if a score that is read is NaN or ``+inf`` (with ``loops``, the graph's own loops' are never read)."""
    if not maybe_nan_or_posinf(score):  # one sum: no NaN or +inf anywhere (the common case)
        return False
    bad = (score.isnan() | score.isposinf()).any(1)  # (E + loops,)
    if loops:
        bad[: edge_index.size(1)] &= edge_index[0] != edge_index[1]  # own loops: left out, as PyG removes them
    return bad.any()
