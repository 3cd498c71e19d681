"""Data-dependent patterns read off dense scores: the one top-k, and the one threshold.

:func:`topk_mask` is the one top-k of the project: batched over any leading
axes (layers, heads), ties to the lower key index; :func:`threshold_mask` the
one threshold, batched the same way. :func:`topk` and :func:`threshold` wrap
one layer and head as a :class:`~graphattn.patterns.Pattern`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.patterns.base import Pattern
from graphattn.patterns.spec import spec_family
from graphattn.validate import check_float, check_int, check_tensor, message

__all__ = ["topk_mask", "threshold_mask", "topk", "threshold"]


def _scores(scores, dim=None, shape_text="(..., L, S)") -> Tensor:
    """``scores`` checked: a floating-point Tensor of ``dim`` (or >= 2) dimensions, no NaN."""
    check_tensor("scores", scores, shape_text=shape_text, floating=True)
    bad_dim = scores.dim() != dim if dim is not None else scores.dim() < 2
    if bad_dim:
        fix = "pass one layer and head, e.g. weights[h]" if dim == 2 else ""
        raise ValueError(message("scores", f"a Tensor of shape {shape_text}", f"shape {tuple(scores.shape)}", fix))
    if torch.isnan(scores).any():
        raise ValueError(message("scores", "a Tensor without NaN", f"{int(torch.isnan(scores).sum())} NaN"))
    return scores


def _budget(k, batch_shape: torch.Size, S: int, device) -> Tensor:
    """Keys per query as a (..., L, 1) LongTensor in [0, S] from an int or an int Tensor."""
    if isinstance(k, Tensor):
        if k.is_floating_point() or k.is_complex() or k.dtype == torch.bool:
            raise TypeError(message("k", "an int or an integer Tensor of keys per query", k.dtype))
        try:
            shape = torch.broadcast_shapes(k.shape, batch_shape)
        except RuntimeError:
            shape = None
        if shape != batch_shape:
            raise ValueError(
                message("k", f"an int or a Tensor broadcastable to {tuple(batch_shape)}", f"shape {tuple(k.shape)}")
            )
        if k.numel() and int(k.min()) < 0:
            raise ValueError(message("k", "non-negative keys per query", f"a minimum of {int(k.min())}"))
        return k.to(device=device, dtype=torch.long).clamp(max=S).expand(batch_shape).unsqueeze(-1)
    return torch.full((*batch_shape, 1), min(check_int("k", k), S), dtype=torch.long, device=device)


def topk_mask(scores: Tensor, k) -> Tensor:
    """The k highest-scoring keys of each query, batched: (..., L, S) scores -> (..., L, S) bool.

    Rule: for each query i (and every leading index: layer, head), the min(k, S)
    keys j with the highest ``scores[..., i, j]``; among equal scores the lower
    key index j wins, so exactly min(k, S) keys are kept. Pre-softmax scores or
    softmax weights give the same keys (the ranking is the same); ``-inf``
    scores rank last and ``+inf`` first.

    Parameters
    ----------
    scores : Tensor, shape (..., L, S), floating point
        E.g. per-layer, per-head weights (layers, H, L, S); rows are queries.
    k : int >= 0, or integer Tensor broadcastable to (..., L)
        Keys per query; a tensor gives each query its own budget (e.g. a fixed
        pattern's in-degrees). Values >= S keep every key.

    Returns
    -------
    Tensor, shape (..., L, S), dtype bool
        True = query i keeps key j.

    Raises
    ------
    TypeError
        ``scores`` not a floating-point Tensor, or ``k`` neither an int nor an integer Tensor.
    ValueError
        ``scores`` with fewer than 2 dimensions or a NaN; a negative ``k`` or one of the wrong shape.

    Notes
    -----
    ``torch.topk`` finds the k-th largest score v_i of each row (O(S) per row,
    no full sort); every key above v_i is kept, and of the keys equal to v_i the
    first (lowest j) ``k - #{scores > v_i}`` by a running count: the keys a
    stable descending sort would put first.

    Examples
    --------
    >>> topk_mask(torch.tensor([[0.1, 0.7, 0.7], [0.5, 0.5, 0.0]]), k=1).int().tolist()
    [[0, 1, 0], [1, 0, 0]]
    >>> topk_mask(torch.tensor([[3.0, 1.0, 2.0], [3.0, 1.0, 2.0]]), torch.tensor([2, 0])).int().tolist()
    [[1, 0, 1], [0, 0, 0]]
    """
    scores = _scores(scores)
    counts = _budget(k, scores.shape[:-1], scores.shape[-1], scores.device)  # (..., L, 1)
    k_max = int(counts.max()) if counts.numel() else 0
    if k_max == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    top = scores.topk(k_max, dim=-1).values  # (..., L, k_max), descending
    kth = top.gather(-1, (counts - 1).clamp(min=0))  # (..., L, 1) the counts-th largest score
    above = scores > kth  # (..., L, S) fewer than counts keys
    tie = scores == kth  # (..., L, S)
    need = counts - above.sum(-1, keepdim=True)  # (..., L, 1) ties still to keep, >= 1
    return (above | (tie & (tie.cumsum(-1) <= need))) & (counts > 0)  # (..., L, S)


def threshold_mask(scores: Tensor, tau: float) -> Tensor:
    """The keys whose score reaches ``tau``, batched: (..., L, S) scores -> (..., L, S) bool.

    Rule: query i keeps key j when ``scores[..., i, j] >= tau``, for every
    leading index (layer, head). A query may keep no key.

    Parameters
    ----------
    scores : Tensor, shape (..., L, S), floating point
        E.g. per-layer, per-head softmax weights (layers, H, L, S); rows are queries.
    tau : float
        A finite threshold in the scores' units (for softmax weights, a probability in [0, 1]).

    Returns
    -------
    Tensor, shape (..., L, S), dtype bool
        ``scores >= tau``: True = query i keeps key j.

    Raises
    ------
    TypeError
        ``scores`` not a floating-point Tensor, or ``tau`` not a real number.
    ValueError
        ``scores`` with fewer than 2 dimensions or a NaN; ``tau`` not finite.

    Examples
    --------
    >>> threshold_mask(torch.tensor([[0.1, 0.7], [0.5, 0.5]]), 0.5).int().tolist()
    [[0, 1], [1, 1]]
    """
    scores, tau = _scores(scores), check_float("tau", tau)
    return scores >= tau  # (..., L, S)


class _Scored(Pattern):
    """A pattern read off dense scores (L, S) of one layer and head; its size is fixed."""

    def __init__(self, table, name, call):
        super().__init__(name, call)
        self.table = table  # (L, S) bool

    def _sizes(self, L=None, S=None):
        shape = tuple(self.table.shape)
        got = super()._sizes(shape[0] if L is None else L, shape[1] if S is None else S)
        if got != shape:
            raise ValueError(message("(L, S)", f"{shape}, the shape of 'scores'", got))
        return got

    def edge_index(self, L=None, S=None):
        return super().edge_index(L, S)

    def mask(self, L=None, S=None):
        return super().mask(L, S)

    def _edges(self, L, S):
        i, j = self.table.nonzero().T  # (E,), (E,) row-major: sorted by i, then j
        return torch.stack([j, i])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        L, S = self.table.shape
        return self.table.to(q_idx.device)[q_idx.clamp(0, L - 1), kv_idx.clamp(0, S - 1)] & (q_idx < L) & (kv_idx < S)


@spec_family("topk")
def topk(scores: Tensor, k: int) -> Pattern:
    """Top-k keys per query, chosen from dense scores (oracle pruning), as a Pattern.

    Rule: :func:`topk_mask` of one layer and head: for each query i, the
    min(k, S) keys j with the highest ``scores[i, j]``; ties go to the lower j;
    k >= S keeps all. L min(k, S) edges. For H heads build one pattern per
    head, or take ``topk_mask(weights, k)`` for all heads at once;
    ``edge_index()`` and ``mask()`` default to the scores' (L, S), and other
    sizes raise ValueError.

    Examples
    --------
    >>> p = topk(torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.5, 0.0]]), k=1)
    >>> p.name, p.edge_index().tolist()
    ('topk_1', [[1, 0], [0, 1]])
    """
    scores, k = _scores(scores, 2, "(L, S)").detach().cpu(), check_int("k", k)
    L, S = scores.shape
    return _Scored(topk_mask(scores, k), f"topk_{k}", f"topk(scores=<Tensor {(L, S)}>, k={k})")


@spec_family("threshold")
def threshold(scores: Tensor, tau: float) -> Pattern:
    """Keys whose score reaches a threshold: (i, j) is an edge when scores[i, j] >= tau.

    Rule: :func:`threshold_mask` of one layer and head.

    ``scores`` is one layer and head, shape (L, S); tau is a finite number in the
    scores' units (for softmax weights, a probability in [0, 1]). A query may keep
    no key (its output row is then exactly 0). Sizes as in :func:`topk`.

    Examples
    --------
    >>> threshold(torch.tensor([[0.1, 0.7], [0.5, 0.5]]), 0.5).edge_index().tolist()
    [[1, 0, 1], [0, 1, 1]]
    """
    scores, tau = _scores(scores, 2, "(L, S)").detach().cpu(), check_float("tau", tau)
    return _Scored(
        threshold_mask(scores, tau),
        f"threshold_{tau:g}",
        f"threshold(scores=<Tensor {tuple(scores.shape)}>, tau={tau!r})",
    )
