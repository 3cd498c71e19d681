"""The dense kernel for the complete graph and the causal DAG: ``F.scaled_dot_product_attention``.

Without weights one SDPA call (its fused flash kernel where available); with
weights its math, ``softmax(q k^T * scale) v``, which forms the ``(H, L, S)``
weights. The edges of a ``"full"``/``"causal"`` pattern are never built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from graphattn.ops.guard import guarded
from graphattn.ops.shared import apply_keep, draw_keep


def _sdpa(query, key, value, kind: str, scale: float, p: float, need_weights: bool):
    """Attention on the complete graph (``kind="full"``) or the causal DAG (j <= i, top-left aligned).

    Returns ``out (L, H, D_v)`` and ``alpha (E, H)`` in sorted edge order (by
    target, then source), or None when ``need_weights`` is False.
    """
    L, S = query.size(0), key.size(0)
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))  # (1, H, n, d): 4-D takes flash
    causal = kind == "causal"
    if not need_weights:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, scale=scale)  # (1, H, L, D_v)
        return out[0].transpose(0, 1), None  # (L, H, D_v), a view: no copy of the output
    scores = (q * scale) @ k.mT  # (1, H, L, D) @ (1, H, D, S) -> (1, H, L, S)
    if causal:  # top-left aligned: j <= i
        scores = scores.masked_fill(torch.ones(L, S, dtype=torch.bool, device=query.device).triu(1), float("-inf"))
    weights = torch.softmax(scores, dim=-1)[0]  # (H, L, S)
    if p > 0.0:
        weights = apply_keep(weights, draw_keep(weights, p), p)  # (H, L, S)
    out = weights @ v[0]  # (H, L, S) @ (H, S, D_v) -> (H, L, D_v)
    alpha = weights.permute(1, 2, 0)  # (L, S, H)
    if not causal:
        return out.transpose(0, 1).contiguous(), alpha.reshape(L * S, -1)  # (E, H), row-major = sorted
    i, j = torch.tril_indices(L, S, device=query.device)  # (E,) each, row-major = sorted; no host sync
    return out.transpose(0, 1).contiguous(), alpha[i, j]  # (E, H)


def run_sdpa(query, key, value, kind, scale, p, need_weights, guards):
    """:func:`_sdpa` with alpha as (H, E) (or None), guarded against non-finite features for "causal"."""
    def kernel(q, k, v, bias):
        out, alpha = _sdpa(q, k, v, kind, scale, p, need_weights)
        return out, (q.new_empty(q.size(1), 0) if alpha is None else alpha.t())  # (L, H, D_v), (H, E)

    if guards is None:  # the complete graph: every query reads every node, nothing can leak
        out, alpha = kernel(query, key, value, None)
    else:
        out, alpha = guarded(kernel, query, key, value, *guards, None, scale, p)
    return out, alpha if need_weights else None
