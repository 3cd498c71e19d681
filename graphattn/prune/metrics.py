"""What sparse attention loses, measured against dense attention.

Notation, for one layer and head: the dense weights of query i are
``p_ij = softmax_j(s_ij)`` over every valid key j (``s`` the scaled scores);
a pattern keeps the keys ``K_i``; the sparse weights, computed from the *same*
scores, are the softmax over the kept keys only,
``q_ij = exp(s_ij) / sum_{j' in K_i} exp(s_ij') = p_ij / m_i`` for j in K_i
(0 elsewhere), where ``m_i = sum_{j in K_i} p_ij`` is the attention mass the
pattern retains.

- :func:`attention_mass`: ``m_i`` in [0, 1]; 1 when every edge is kept.
- :func:`kl_sparse_dense`: ``KL(q_i || p_i) = sum_{j in K_i} q_ij log(q_ij / p_ij)``,
  in nats, in [0, inf). It is finite whenever ``K_i`` is not empty, unlike
  ``KL(p || q)``, which is infinite as soon as one key with p_ij > 0 is dropped.
  With q computed from the same scores it equals ``-log m_i`` exactly (a check
  the tests make), so it weighs the queries that lose most of their mass.
  A query with no kept key has no sparse distribution: +inf.
- :func:`relative_error`: ``||y - y_ref||_F / ||y_ref||_F``.
- :func:`retrieval_fidelity`: Spearman correlation between two pairwise
  cosine-similarity matrices (upper triangle) and top-1 neighbour agreement.
- :func:`attention_flops`: ``4 E D`` per head-edge, see its docstring; :func:`score_flops`: ``2 E D``,
  the dense scores a data-dependent selection needs first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.validate import check_int, check_tensor, message

__all__ = [
    "attention_mass",
    "kl_sparse_dense",
    "relative_error",
    "cosine_similarity",
    "retrieval_fidelity",
    "attention_flops",
    "score_flops",
]


def _check_pair(a: Tensor, b: Tensor, names: tuple[str, str]) -> None:
    if a.shape != b.shape:
        raise ValueError(message(names[1], f"the shape of '{names[0]}', {tuple(a.shape)}", tuple(b.shape), verb="have"))


def _check_values(name: str, t: Tensor, kind: str) -> None:
    """Entry check: ``"mask"`` a bool tensor; ``"weights"`` finite and >= 0, ``"floats"`` finite, both floating
    point; ``"numbers"`` finite, any real dtype but bool. ``TypeError``/``ValueError`` naming ``name``.
    """
    check_tensor(name, t, floating=kind in ("weights", "floats") or None)
    if kind == "mask":
        if t.dtype != torch.bool:
            raise TypeError(message(name, "a bool Tensor (True = may attend)", t.dtype))
        return
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(message(name, "a real-valued Tensor", t.dtype))
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(message(name, "finite", "a NaN or inf entry"))
    if kind == "weights" and t.numel() and bool((t < 0).any()):
        raise ValueError(message(name, "non-negative", f"a minimum of {float(t.min())}"))


def attention_mass(weights: Tensor, keep: Tensor) -> Tensor:
    """Dense attention mass that falls on the kept edges, per query.

    .. math:: m_i = \\sum_{j \\in K_i} p_{ij}

    Parameters
    ----------
    weights : Tensor, shape (..., L, S)
        Dense weights p; rows (queries i) sum to 1 over keys j.
    keep : Tensor, shape (..., L, S), dtype bool
        True where the pattern keeps edge (j, i) (True = may attend).

    Returns
    -------
    Tensor, shape (..., L)
        In [0, 1]; 1 for a query that keeps every key with nonzero weight.

    Examples
    --------
    >>> w = torch.tensor([[0.5, 0.3, 0.2]])
    >>> attention_mass(w, torch.tensor([[True, False, True]]))
    tensor([0.7000])
    """
    _check_values("weights", weights, "weights")
    _check_values("keep", keep, "mask")
    _check_pair(weights, keep, ("weights", "keep"))
    return (weights * keep).sum(-1)  # (..., L, S) -> (..., L)


def kl_sparse_dense(scores: Tensor, keep: Tensor, valid: Tensor | None = None) -> Tensor:
    """KL divergence of the sparse weights from the dense ones, per query, in nats.

    .. math::
        \\mathrm{KL}(q_i \\,\\|\\, p_i) = \\sum_{j \\in K_i} q_{ij} \\log \\frac{q_{ij}}{p_{ij}},
        \\quad p_i = \\mathrm{softmax}_{j \\in V_i}(s_{ij}),
        \\quad q_i = \\mathrm{softmax}_{j \\in K_i}(s_{ij})

    Computed from log-softmaxes, so tiny weights do not underflow. Equals
    ``-log(attention_mass)`` when ``K_i`` is inside ``V_i``.

    Parameters
    ----------
    scores : Tensor, shape (..., L, S)
        Scaled attention scores s (pre-softmax).
    keep : Tensor, shape (..., L, S), dtype bool
        Kept edges K (True = may attend); must lie inside ``valid``.
    valid : Tensor, shape (..., L, S), dtype bool, optional
        The dense graph V (default: every key).

    Returns
    -------
    Tensor, shape (..., L)
        In [0, inf); 0 when every valid key is kept; +inf for a query with no
        kept key (its sparse output is the zero vector).

    Raises
    ------
    ValueError
        If the shapes differ, ``keep`` holds an edge outside ``valid``, or a
        score is NaN or inf (mark absent keys in ``valid``, not with -inf).
    TypeError
        Non-floating ``scores``, or masks that are not bool.

    Examples
    --------
    >>> s = torch.zeros(1, 4)                          # uniform p = 1/4
    >>> kl_sparse_dense(s, torch.tensor([[True, True, False, False]]))   # log 2
    tensor([0.6931])
    """
    _check_values("scores", scores, "floats")  # -inf would give NaN: absent keys go in 'valid'
    _check_values("keep", keep, "mask")
    if valid is not None:
        _check_values("valid", valid, "mask")
    _check_pair(scores, keep, ("scores", "keep"))
    neg = torch.finfo(scores.dtype).min
    if valid is None:
        log_p = torch.log_softmax(scores, dim=-1)  # (..., L, S)
    else:
        _check_pair(scores, valid, ("scores", "valid"))
        if (keep & ~valid).any():
            raise ValueError(message("keep", "inside 'valid'", "kept edges outside the dense graph", verb="lie"))
        log_p = torch.log_softmax(scores.masked_fill(~valid, neg), dim=-1)  # (..., L, S)
    log_q = torch.log_softmax(scores.masked_fill(~keep, neg), dim=-1)  # (..., L, S)
    log_q = log_q.masked_fill(~keep, 0.0)  # (..., L, S): exp() of the dropped keys' -inf is slow on CPU
    term = torch.where(keep, log_q.exp() * (log_q - log_p), torch.zeros_like(scores))  # (..., L, S)
    kl = term.sum(-1).clamp(min=0.0)  # (..., L); clamp float noise below 0
    return kl.masked_fill(~keep.any(-1), float("inf"))  # (..., L)


def relative_error(actual: Tensor, reference: Tensor) -> float:
    """``||actual - reference||_F / ||reference||_F`` (a float >= 0).

    Raises
    ------
    ValueError
        If the shapes differ, ``reference`` is all zero, or an entry is NaN or inf.
    TypeError
        For bool or complex tensors.
    """
    _check_values("actual", actual, "numbers")
    _check_values("reference", reference, "numbers")
    _check_pair(actual, reference, ("actual", "reference"))
    denom = float(torch.linalg.vector_norm(reference.double()))
    if denom == 0.0:
        raise ValueError(message("reference", "nonzero", "all zeros"))
    return float(torch.linalg.vector_norm((actual - reference).double())) / denom


def cosine_similarity(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise cosine similarity, shape (N, F) x (N, F) -> (N,), in [-1, 1].

    Examples
    --------
    >>> cosine_similarity(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[2.0, 0.0], [1.0, 0.0]]))
    tensor([1.0000, 0.7071])
    """
    for name, t in (("a", a), ("b", b)):
        _check_values(name, t, "floats")
        check_tensor(name, t, dim=2, shape_text="(N, F)")
    _check_pair(a, b, ("a", "b"))
    # rows scaled by their largest |entry| first (cosine is scale-free): torch clamps each norm at 1e-8,
    # which would turn rows of scale 1e-30 into a cosine of ~1e-44
    a64, b64 = (t.double() / t.double().abs().amax(dim=-1, keepdim=True).clamp(min=1e-300) for t in (a, b))  # (N, F)
    return torch.nn.functional.cosine_similarity(a64, b64, dim=-1).to(a.dtype)  # (N,)


def retrieval_fidelity(reference: Tensor, embeddings: Tensor, tie_tol: float = 1e-6) -> tuple[float, float]:
    """How well sparse embeddings preserve retrieval over a corpus.

    Parameters
    ----------
    reference, embeddings : Tensor, shape (N, F)
        Dense (reference) and sparse sentence embeddings of the same N >= 3 passages.

    Returns
    -------
    spearman : float
        Spearman rank correlation (``scipy.stats.spearmanr``) between the upper
        triangles (i < j, N (N - 1) / 2 pairs) of the two pairwise cosine-similarity
        matrices; 1 when the sparse model orders all pairs as the dense one does.
    top1 : float
        Fraction of passages whose nearest other passage under ``embeddings``
        is a nearest one under ``reference`` (its reference cosine within
        ``tie_tol``, default 1e-6, of the highest: a repeated passage has two
        equally near neighbours, and either counts), in [0, 1].

    Raises
    ------
    ValueError
        If the shapes differ or N < 3.
    """
    from scipy.stats import spearmanr

    for name, t in (("reference", reference), ("embeddings", embeddings)):
        _check_values(name, t, "floats")
        check_tensor(name, t, dim=2, shape_text="(N, F)")
    _check_pair(reference, embeddings, ("reference", "embeddings"))
    n = reference.shape[0]
    if n < 3:
        raise ValueError(message("embeddings", "at least 3 passages for retrieval fidelity", n, verb="hold"))

    def sims(x: Tensor) -> Tensor:
        x = torch.nn.functional.normalize(x.double(), dim=-1)  # (N, F)
        return x @ x.T  # (N, F) · (F, N) -> (N, N)

    s_ref, s = sims(reference), sims(embeddings)
    upper = torch.triu_indices(n, n, offset=1)  # (2, N (N - 1) / 2)
    rho = spearmanr(s_ref[upper[0], upper[1]].numpy(), s[upper[0], upper[1]].numpy()).statistic
    eye = torch.eye(n, dtype=torch.bool)
    best_ref = s_ref.masked_fill(eye, -2.0).max(1).values  # (N,): the reference's nearest similarity
    top = s.masked_fill(eye, -2.0).argmax(1)  # (N,)
    # tie-robust: the sparse nearest neighbour agrees when it is one of the reference's (tied) nearest
    agree = s_ref.gather(1, top.unsqueeze(1)).squeeze(1) >= best_ref - tie_tol  # (N,)
    return float(rho), float(agree.double().mean())


def attention_flops(head_edges: int, head_dim: int) -> int:
    """Floating-point operations of attention restricted to a graph.

    Per kept (edge, head) pair: the score ``q_i · k_j`` costs D multiplies and
    D adds (2 D), and adding ``alpha_ij v_j`` into ``y_i`` another 2 D; the
    softmax (a few operations per edge) and the projections (independent of
    the pattern) are not counted. Total ``4 E_h D`` with ``E_h`` the kept
    edges summed over heads (``E H`` when every head keeps the same E edges).

    Examples
    --------
    >>> attention_flops(head_edges=10 * 12, head_dim=32)
    15360
    """
    return 4 * check_int("head_edges", head_edges) * check_int("head_dim", head_dim)


def score_flops(head_edges: int, head_dim: int) -> int:
    """FLOPs of the scores ``q_i · k_j`` alone (2 D per (edge, head)): what choosing edges by weight costs.

    Top-k, threshold and the oracle rows need the dense scores of every edge
    of the model's graph before they can keep any; this is that price.

    Examples
    --------
    >>> score_flops(head_edges=10 * 12, head_dim=32)
    7680
    """
    return 2 * check_int("head_edges", head_edges) * check_int("head_dim", head_dim)
