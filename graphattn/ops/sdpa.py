"""The dense kernel for the complete graph and the causal DAG: ``F.scaled_dot_product_attention``.

Two callers. A ``"full"``/``"causal"`` *pattern* (no edge is ever built) runs
:func:`run_sdpa` directly, differentiated by PyTorch's own autograd: one SDPA
call without weights (its fused flash kernel where available), its math,
``softmax(q k^T * scale) v``, with them. An *edge list* that is exactly one of
those sets runs inside the ``graphattn::attention`` operator
(:func:`dense_forward`, :func:`dense_backward`): fused SDPA when nothing needs
the weights (inference), else the math with the weights kept as ``(H, E)``
for the hand-written backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn.ops.guard import guarded
from graphattn.ops.shared import apply_keep, draw_keep
from graphattn.ops.softmax import softmax_rows_backward
from graphattn.validate import message


class _SDPA(torch.autograd.Function):
    """``F.scaled_dot_product_attention`` with SDPA's own backward, and a differentiable one under ``create_graph``.

    PyTorch's fused CPU kernel has no double backward ("derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not
    implemented", checked on 2.13). Forward runs SDPA on a local graph, so a
    first-order backward is SDPA's own; with ``create_graph=True`` the
    backward recomputes SDPA's math backend, which is composite and so
    differentiable to any order (dropout's mask cannot be redrawn there: refused).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, p, causal, scale):
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
            out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, dropout_p=p, is_causal=causal, scale=scale)
        ctx.leaves, ctx.local = leaves, out
        ctx.save_for_backward(q, k, v)
        ctx.mask, ctx.p, ctx.causal, ctx.scale = mask, p, causal, scale
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph=True: SDPA's math backend, differentiable again
            if ctx.p > 0.0:
                raise NotImplementedError(
                    message(
                        "create_graph",
                        "False with attention dropout on SDPA",
                        True,
                        "set dropout=0 for second derivatives (the mask cannot be redrawn)",
                    )
                )
            q, k, v = (t.view_as(t) if t.requires_grad else t.detach().requires_grad_() for t in ctx.saved_tensors)
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask, is_causal=ctx.causal, scale=ctx.scale)
            grads = torch.autograd.grad(out, (q, k, v), grad, create_graph=True)
        else:
            needed = [leaf for leaf in ctx.leaves if leaf.requires_grad]
            # retain_graph: the local graph lives as long as this node does (the caller may backward twice)
            found = iter(torch.autograd.grad(ctx.local, needed, grad, retain_graph=True) if needed else ())
            grads = [next(found) if leaf.requires_grad else None for leaf in ctx.leaves]
        return (*grads, None, None, None, None)


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """``F.scaled_dot_product_attention`` (4-D), with exact second derivatives when eager (:class:`_SDPA`).

    Under ``torch.compile`` the plain call (AOTAutograd refuses double backward itself, loudly).
    """
    if torch.compiler.is_compiling() or not (
        torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    ):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
    return _SDPA.apply(q, k, v, attn_mask, dropout_p, is_causal, scale)


def _heads_first(*xs: Tensor) -> tuple[Tensor, ...]:
    return tuple(x.transpose(0, 1).unsqueeze(0) for x in xs)  # (1, H, n, d): 4-D takes flash


def _causal_blocked(L: int, S: int, device) -> Tensor:
    return torch.ones(L, S, dtype=torch.bool, device=device).triu(1)  # (L, S) True above the diagonal: j > i


def to_edges(kind: str, dense: Tensor) -> Tensor:
    """``(H, L, S)`` -> ``(H, E)`` in sorted edge order (by target, then source)."""
    H, L, S = dense.shape
    if kind == "full":
        return dense.reshape(H, L * S)  # row-major = sorted
    i, j = torch.tril_indices(L, S, device=dense.device)  # (E,) each, row-major = sorted; no host sync
    return dense[:, i, j]  # (H, E)


def to_dense(kind: str, edges: Tensor, L: int, S: int) -> Tensor:
    """Inverse of :func:`to_edges`: ``(H, E)`` -> ``(H, L, S)``, zeros off the edges."""
    H = edges.size(0)
    if kind == "full":
        return edges.reshape(H, L, S)
    out = edges.new_zeros(H, L, S)
    i, j = torch.tril_indices(L, S, device=edges.device)  # (E,) each
    out[:, i, j] = edges
    return out  # (H, L, S)


def _sdpa(query, key, value, kind: str, scale: float, p: float, need_weights: bool):
    """The pattern path: ``out (L, H, D_v)`` and ``alpha (H, E)`` after dropout (``(H, 0)`` without weights)."""
    L, S = query.size(0), key.size(0)
    q, k, v = _heads_first(query, key, value)  # (1, H, n, d)
    causal = kind == "causal"
    if not need_weights:
        out = sdpa(q, k, v, dropout_p=p, is_causal=causal, scale=scale)  # (1, H, L, D_v)
        return out[0].transpose(0, 1), query.new_empty(query.size(1), 0), None  # (L, H, D_v), a view: no copy
    scores = (q * scale) @ k.mT  # (1, H, L, D) @ (1, H, D, S) -> (1, H, L, S)
    if causal:  # top-left aligned: j <= i
        scores = scores.masked_fill(_causal_blocked(L, S, query.device), float("-inf"))
    weights = torch.softmax(scores, dim=-1)[0]  # (H, L, S)
    if p > 0.0:
        weights = apply_keep(weights, draw_keep(weights, p), p)  # (H, L, S)
    out = weights @ v[0]  # (H, L, S) @ (H, S, D_v) -> (H, L, D_v)
    return out.transpose(0, 1).contiguous(), to_edges(kind, weights), None  # (L, H, D_v), (H, E)


def run_sdpa(query, key, value, kind, scale, p, need_weights, guards, fix):
    """:func:`_sdpa` for a pattern: ``out``, ``alpha (H, E)`` after dropout or None; guarded for "causal"."""

    def kernel(q, k, v):
        return _sdpa(q, k, v, kind, scale, p, need_weights)

    if guards is None:  # the complete graph: every query reads every node, nothing can leak
        out, alpha, _ = kernel(query, key, value)
    else:
        out, alpha, _ = guarded(kernel, fix, query, key, value, *guards)
    return out, alpha if need_weights else None


def dense_forward(kind: str, query, key, value, scale: float, p: float, need_alpha: bool):
    """Inside the operator: ``out (L, H, D_v)``, ``alpha (H, E)`` before dropout (or ``(H, 0)``), ``keep``."""
    L, S = query.size(0), key.size(0)
    if not need_alpha:  # nothing differentiates or reads the weights: SDPA's fused kernel
        out, alpha, _ = _sdpa(query, key, value, kind, scale, p, False)
        return out.contiguous(), alpha, None
    q, k, v = _heads_first(query, key, value)  # (1, H, n, d)
    scores = torch.bmm(q[0], k[0].mT).mul_(scale)  # (H, L, D) @ (H, D, S) -> (H, L, S)
    if kind == "causal":
        scores.masked_fill_(_causal_blocked(L, S, query.device), float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (H, L, S)
    alpha = to_edges(kind, weights)  # (H, E)
    keep = draw_keep(alpha, p) if p > 0.0 else None  # (H, E)
    if keep is not None:
        weights = apply_keep(weights, to_dense(kind, keep, L, S), p)  # (H, L, S)
    out = torch.bmm(weights, v[0])  # (H, L, S) @ (H, S, D_v) -> (H, L, D_v)
    return out.transpose(0, 1).contiguous(), alpha, keep


def dense_backward(
    kind: str, query, key, value, alpha, keep, p: float, grad_out, grad_alpha, scale: float, need_ds: bool
):
    """Gradients of :func:`dense_forward`'s math: ``dq, dk, dv`` and ``d score (H, E)`` or None."""
    L, S = query.size(0), key.size(0)
    if grad_out is None:
        grad_out = value.new_zeros(L, value.size(1), value.size(2))
    q, k, v, g = (x[0] for x in _heads_first(query, key, value, grad_out))  # (H, n, d)
    weights = to_dense(kind, alpha, L, S)  # (H, L, S), 0 off the edges
    keep_d = None if keep is None else to_dense(kind, keep, L, S)  # (H, L, S)
    d_w = apply_keep(torch.bmm(g, v.mT), keep_d, p)  # (H, L, D_v) @ (H, D_v, S) -> (H, L, S): dL/d alpha
    if grad_alpha is not None:
        d_w = d_w + to_dense(kind, grad_alpha, L, S)
    ds = softmax_rows_backward(d_w, weights)  # (H, L, S); 0 off the edges (weight 0 there)
    dq = torch.bmm(ds, k).mul_(scale)  # (H, L, S) @ (H, S, D) -> (H, L, D)
    dk = torch.bmm(ds.mT, q).mul_(scale)  # (H, S, L) @ (H, L, D) -> (H, S, D)
    dv = torch.bmm(apply_keep(weights, keep_d, p).mT, g)  # (H, S, L) @ (H, L, D_v) -> (H, S, D_v)
    return (
        dq.transpose(0, 1),
        dk.transpose(0, 1),
        dv.transpose(0, 1),
        to_edges(kind, ds) if need_ds else None,
    )  # (n, H, d) each, (H, E)
