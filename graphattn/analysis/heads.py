"""Per-head summaries (self share, attention distance) and over-smoothing (cosine similarity [3]_).

References
----------
.. [3] K. Ethayarajh, "How Contextual are Contextualized Word
   Representations?", EMNLP 2019 (mean pairwise cosine similarity per layer).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from graphattn.analysis._checks import stacked
from graphattn.validate import check_tensor, message

__all__ = ["self_share", "mean_attention_distance", "mean_cosine_similarity", "smoothing_per_layer"]


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

    Raises
    ------
    TypeError, ValueError, IndexError
        ``edge_index`` not a (2, E) integer Tensor; ``alpha`` of the wrong shape
        or with NaN, inf or negative weights.

    Examples
    --------
    >>> import torch
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])
    >>> self_share(edge_index, torch.tensor([[1.0], [0.5], [0.5]]))   # (1 + 0.5) / 2
    tensor([[0.7500]])
    """
    a = stacked(alpha, edge_index)  # (layers, E, H)
    is_self = (edge_index[0] == edge_index[1]).to(a.dtype)  # (E,)
    diag = (a * is_self[None, :, None]).sum(dim=1)  # (layers, E, H) -> (layers, H)
    total = a.sum(dim=1)  # (layers, H)
    return diag / total.masked_fill(total == 0, 1.0)


def mean_attention_distance(edge_index: Tensor, alpha: Tensor | Sequence[Tensor]) -> Tensor:
    """Mean attention distance per layer and head: ``sum_j alpha_ij |i - j|`` averaged over queries i.

    Node indices are taken as token positions, so the unit is tokens. Queries
    with no incoming edge are left out of the average. Parameters as
    :func:`self_share`.

    Returns
    -------
    Tensor, shape (layers, H)
        In tokens, >= 0.

    Raises
    ------
    TypeError, ValueError, IndexError
        As :func:`self_share`.

    Examples
    --------
    >>> import torch
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])
    >>> mean_attention_distance(edge_index, torch.tensor([[1.0], [0.5], [0.5]]))  # (0 + 0.5) / 2
    tensor([[0.2500]])
    """
    a = stacked(alpha, edge_index)  # (layers, E, H)
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
    TypeError
        If ``x`` is not a real Tensor.
    ValueError
        If ``x`` is not 2-D, has fewer than two rows, a NaN or inf, or a zero row.

    Notes
    -----
    Each row is divided by its largest absolute entry before its norm is
    taken, so rows near the float64 range neither overflow nor underflow.

    References
    ----------
    .. [3] Ethayarajh, "How Contextual are Contextualized Word Representations?", EMNLP 2019.

    Examples
    --------
    >>> import torch
    >>> mean_cosine_similarity(torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]]))   # (0 + 1 + 0) / 3
    0.3333333333333333
    """
    check_tensor("x", x, shape_text="(N, F) with N >= 2")
    if x.dtype == torch.bool or x.is_complex():
        raise TypeError(message("x", "a real Tensor", x.dtype))
    if x.dim() != 2 or x.size(0) < 2:
        raise ValueError(message("x", "a Tensor of shape (N, F) with N >= 2", f"shape {tuple(x.shape)}"))
    if not torch.isfinite(x).all():
        raise ValueError(message("x", "finite", f"{int((~torch.isfinite(x)).sum())} NaN or inf"))
    top = x.double().abs().amax(dim=1, keepdim=True)  # (N, 1)
    if (top == 0).any():
        raise ValueError(message("x", "a Tensor with no zero rows", f"{int((top == 0).sum())} zero rows"))
    scaled = x.double() / top  # (N, F) largest entry of each row is +-1
    unit = scaled / scaled.norm(dim=1, keepdim=True)  # (N, F)
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
    if isinstance(hidden_states, str) or not isinstance(hidden_states, (Sequence, Tensor)):
        raise TypeError(
            message("hidden_states", "a sequence of (N, F) Tensors, one per layer", type(hidden_states).__name__)
        )
    return [mean_cosine_similarity(h) for h in hidden_states]
