"""The one top-k: each query's highest-scoring keys, batched over any leading axes.

:func:`budget_mask` keeps ``counts[..., i]`` keys for query i (a per-query
budget, e.g. a fixed pattern's in-degrees); :func:`topk_mask` is the same
budget for every query. Ties go to the lower key j, so the result is a
function of the scores alone. ``graphattn.patterns.topk`` builds a one-head
pattern with the same rule; the pruning experiment (per layer and head) and the
benchmark (head-averaged scores) call these.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.validate import check_int, check_tensor

__all__ = ["topk_mask", "budget_mask"]


def topk_mask(scores: Tensor, k: int) -> Tensor:
    """The k highest-scoring keys of each query; ties to the lower key.

    Parameters
    ----------
    scores : Tensor, shape (..., L, S)
        Scores or softmax weights (the ranking is the same), rows = queries.
    k : int
        Keys per query, at least 1; k >= S keeps every key.

    Returns
    -------
    Tensor, shape (..., L, S), dtype bool
        True = may attend; ``min(k, S)`` keys in every row.

    Raises
    ------
    TypeError
        If ``scores`` is not a floating-point tensor or ``k`` is not an int.
    ValueError
        If ``k`` < 1 or ``scores`` has fewer than 2 dimensions.

    Examples
    --------
    >>> topk_mask(torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.5, 0.0]]), 1).int().tolist()
    [[0, 1, 0], [1, 0, 0]]
    """
    check_tensor("scores", scores, floating=True)
    k = check_int("k", k, low=1)
    counts = torch.full(scores.shape[:-1], min(k, scores.shape[-1]), dtype=torch.long,
                        device=scores.device)  # (..., L)
    return budget_mask(scores, counts)


def budget_mask(scores: Tensor, counts: Tensor) -> Tensor:
    """Top-k with a per-query budget: query i keeps its ``counts[..., i]`` highest-scoring keys.

    Parameters
    ----------
    scores : Tensor, shape (..., L, S)
        Floating point, rows = queries.
    counts : Tensor, shape broadcastable to (..., L), int in [0, S]
        Keys per query, e.g. a fixed pattern's in-degrees, so that the result
        keeps exactly as many edges as the pattern, query by query.

    Returns
    -------
    Tensor, shape (..., L, S), dtype bool
        True = may attend; ties go to the lower key j.

    Raises
    ------
    ValueError
        If ``scores`` has fewer than 2 dimensions or a count is outside [0, S].
    """
    check_tensor("scores", scores, floating=True)
    if scores.dim() < 2:
        raise ValueError(f"Expected 'scores' to have shape (..., L, S) (got {tuple(scores.shape)})")
    num_k = scores.shape[-1]
    counts = counts.to(scores.device).unsqueeze(-1)  # (..., L, 1)
    k_max = int(counts.max()) if counts.numel() else 0
    if counts.numel() and (int(counts.min()) < 0 or k_max > num_k):
        raise ValueError(f"Expected 'counts' to be in [0, {num_k}] (got [{int(counts.min())}, {k_max}])")
    if k_max == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    # fast path: every key at least as high as the counts[i]-th highest (torch.topk, no full sort)
    top = scores.topk(k_max, dim=-1, sorted=True).values  # (..., L, k_max) descending
    kth = top.gather(-1, (counts.clamp(min=1) - 1).expand(*top.shape[:-1], 1))  # (..., L, 1)
    keep = (scores >= kth) & (counts > 0)  # (..., L, S)
    if bool((keep.sum(-1, keepdim=True) == counts).all()):
        return keep
    # a tie at the boundary: rank by a stable sort, so ties go to the lower key
    order = scores.sort(dim=-1, descending=True, stable=True).indices  # (..., L, S)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(num_k, device=order.device)
                                             .expand_as(order))  # (..., L, S)
    return ranks < counts  # (..., L, S)
