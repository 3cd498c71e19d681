"""Per-edge scores and the softmax over the incoming edges of each target: one implementation.

The CSR kernel (scores ``(H, E)``, edge axis 1, edges sorted by target) and
``AttentionConv``'s readable message-passing path (scores ``(E, H)``, edge axis
0, any order) both call :func:`segment_softmax`; the block kernel's dense tiles
and the CSR kernel's uniform-degree graphs use the fused row softmax
(:func:`softmax_rows`, :func:`softmax_rows_backward`), which is the same
function on rows that hold every edge of a target.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.ops.shared import compute_dtype, resolve_scale

SHORT_ROW = 16  # rows shorter than this skip torch.softmax's fused kernel (see segment_softmax, Notes)


def edge_scores(query_i: Tensor, key_j: Tensor, scale: float | None = None) -> Tensor:
    """``score_e = scale * q_i · k_j`` for every edge e = (j, i): the readable path's scores.

    Parameters
    ----------
    query_i, key_j : Tensor, shape (E, H, D)
        The query of each edge's target i and the key of its source j.
    scale : float, optional
        Default ``1 / sqrt(D)``, as :func:`graphattn.attention`.

    Returns
    -------
    score : Tensor, shape (E, H)
        In float32 for float16/bfloat16 features (as SDPA accumulates them),
        so that a score above the half range stays finite.
    """
    acc = compute_dtype(query_i.dtype)
    scale = resolve_scale(scale, query_i.size(-1))
    return (query_i.to(acc) * key_j.to(acc)).sum(dim=-1) * scale  # (E, H, D) · (E, H, D) -> (E, H)


def softmax_rows(score: Tensor, out: Tensor | None = None) -> Tensor:
    """Fused softmax over the last axis, written into ``out`` (same shape) when given."""
    if out is None:
        return torch.softmax(score, -1)
    return torch._softmax(score, -1, False, out=out)  # private: the public one has no out= (checked on 2.13)


def softmax_rows_backward(grad: Tensor, alpha: Tensor) -> Tensor:
    """``d score = alpha * (grad - sum alpha * grad)`` over the last axis, fused."""
    return torch._softmax_backward_data(grad, alpha, -1, alpha.dtype)  # private, no public fused one (2.13)


def segment_softmax(
    score: Tensor, index: Tensor, num_targets: int, *, dim: int = 0, degree: int | None = None
) -> Tensor:
    """Softmax of edge scores over the incoming edges of each target.

    .. math:: \\alpha_e = \\exp(s_e - m_i) / \\sum_{e' \\to i} \\exp(s_{e'} - m_i),
              \\quad m_i = \\max_{e' \\to i} s_{e'}

    Parameters
    ----------
    score : Tensor, shape (E, H) (``dim=0``) or (H, E) (``dim=1``)
        Edge scores; ``-inf`` gives an edge the weight 0.
    index : Tensor, shape (E,)
        Target i of each edge (``edge_index[1]``), in ``[0, num_targets)``; any order.
    num_targets : int
        L.
    dim : int, default 0
        The edge axis of ``score``.
    degree : int, optional
        Only for edges sorted by target where every target has exactly
        ``degree`` edges: then one fused softmax over ``(L, degree)`` rows.

    Returns
    -------
    alpha : Tensor, the shape of ``score``
        Sums to 1 over the edges of each target that has a finite score, and is
        exactly 0 on the edges of a target whose scores are all ``-inf``.
        Differentiable (the readable path's autograd goes through it).

    Notes
    -----
    With ``degree`` below ``SHORT_ROW`` (16) the softmax runs as max, exp, sum
    and divide instead of ``torch.softmax``: on PyTorch 2.13's CPU kernels a
    fused softmax over rows shorter than one AVX-512 vector (16 floats) is 4-7x
    slower than the four steps (6.4M scores in rows of 4-15: 200-310 ms against
    45-65 ms; rows of 16 and more: 11-16 ms fused against 23-43 ms), and so is
    its backward (85-90 ms against 33-49 ms). Same values to rounding.
    """
    dim = dim % score.dim()
    tracked = score.requires_grad and torch.is_grad_enabled()  # else the temporaries are updated in place
    if degree:  # uniform degree, sorted: a dense (L, degree) softmax per head
        rows = score.unflatten(dim, (num_targets, degree))  # (L, k, H) or (H, L, k)
        row_max = rows.detach().amax(dim=dim + 1, keepdim=True)  # (L, 1, H) or (H, L, 1)
        dead = torch.isneginf(row_max)  # all -inf: NaN -> exact 0
        if degree >= SHORT_ROW:
            alpha = torch.softmax(rows, dim=dim + 1)
            alpha = alpha.masked_fill(dead, 0.0) if tracked else alpha.masked_fill_(dead, 0.0)
        else:  # short rows: the unfused steps are several times faster than torch.softmax (Notes)
            exp = rows - row_max.masked_fill_(dead, 0.0)  # (L, k, H) or (H, L, k)
            exp = exp.exp() if tracked else exp.exp_()
            denom = exp.sum(dim=dim + 1, keepdim=True)  # (L, 1, H) or (H, L, 1)
            denom = denom.masked_fill(denom == 0, 1.0)  # 0 / 1 = 0
            alpha = exp / denom if tracked else exp.div_(denom)
        return alpha.flatten(dim, dim + 1)  # the shape of score
    shape = list(score.shape)
    shape[dim] = num_targets  # (L, H) or (H, L)
    idx = index.view([-1 if d == dim else 1 for d in range(score.dim())]).expand_as(score)  # like score
    seg_max = score.new_full(shape, float("-inf")).scatter_reduce_(dim, idx, score.detach(), "amax")
    seg_max.masked_fill_(torch.isinf(seg_max), 0.0)  # a target without finite scores
    exp = score - seg_max.index_select(dim, index)  # like score
    exp = exp.exp() if tracked else exp.exp_()
    denom = exp.new_zeros(shape).index_add_(dim, index, exp)  # (L, H) or (H, L)
    denom = denom.masked_fill(denom == 0, 1.0).index_select(dim, index)  # like score; 0 / 1 = 0
    return exp / denom if tracked else exp.div_(denom)


def segment_softmax_backward(
    grad: Tensor, alpha: Tensor, index: Tensor, num_targets: int, *, degree: int | None = None
) -> Tensor:
    """``d score = alpha * (grad - sum_{e' -> i} alpha_e' grad_e')`` for ``(H, E)`` tensors (edge axis 1)."""
    if degree:
        rows = (-1, num_targets, degree)  # (H, L, k)
        grad, alpha_rows = grad.reshape(rows), alpha.view(rows)  # (H, L, k), (H, L, k)
        if degree >= SHORT_ROW:
            return softmax_rows_backward(grad, alpha_rows).view(alpha.shape)  # (H, E)
        dot = (alpha_rows * grad).sum(-1, keepdim=True)  # (H, L, 1)
        return (alpha_rows * (grad - dot)).view(alpha.shape)  # (H, E)
    dot = grad.new_zeros(alpha.size(0), num_targets).index_add_(1, index, alpha * grad)  # (H, L)
    return alpha * (grad - dot.index_select(1, index))  # (H, E)
