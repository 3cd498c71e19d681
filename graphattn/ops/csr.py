"""The CSR kernel, exact on any graph: sampled matmul, segment softmax, sparse-dense matmul.

Edges sorted by target (:class:`~graphattn.ops.structure._Graph`); scores by a
sampled dense-dense matmul (``torch.sparse.sampled_addmm``), the softmax over
the CSR segments (:func:`~graphattn.ops.softmax.segment_softmax`), the
aggregation as CSR x dense; backward with the transposed CSR. The scores are
one batched ``sampled_addmm`` over the heads; the aggregation is one CSR x
dense matmul per head, because PyTorch's CPU sparse kernels have no batched
CSR x dense product (checked on 2.13).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from graphattn.ops import structure
from graphattn.ops.shared import apply_keep, bias_grad, draw_keep
from graphattn.ops.softmax import segment_softmax, segment_softmax_backward
from graphattn.ops.structure import _Graph


def _csr(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, ...]) -> Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)


def sddmm(graph: _Graph, a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """``out[h, e] = alpha * a[i_e, h] · b[j_e, h]`` on the sorted edges; a (L, H, D), b (S, H, D) -> (H, E).

    One batched sampled dense-dense matmul over the heads, on strided views.
    """
    H, E = a.size(1), graph.E
    if E == 0:
        return a.new_empty(H, 0)  # (H, E)
    if graph.has_duplicates:  # sampled_addmm wants each (i, j) once: bounded chunks of gathered rows instead
        out = a.new_empty(H, E)  # (H, E)
        step = max(1, structure.TILE_FLOATS // max(1, H * a.size(2)))
        for e0 in range(0, E, step):
            dst, src = graph.dst[e0:e0 + step], graph.src[e0:e0 + step]
            prod = torch.einsum("ehd,ehd->he", a.index_select(0, dst), b.index_select(0, src))  # (H, chunk)
            out[:, e0:e0 + step] = prod.mul_(alpha)
        return out
    pattern = _csr(graph.crow.expand(H, -1), graph.src.expand(H, -1), a.new_zeros(()).expand(H, E),
                   (H, graph.L, graph.S))  # one sparsity for every head; zero values: beta * NaN cannot arise
    return torch.sparse.sampled_addmm(pattern, a.transpose(0, 1), b.permute(1, 2, 0), beta=0.0,
                                      alpha=alpha).values()  # (H, L, D) @ (H, D, S) sampled -> (H, E)


def spmm(crow: Tensor, col: Tensor, values: Tensor, dense: Tensor, num_rows: int) -> Tensor:
    """``out[:, h] = A_h @ dense[:, h]``, ``A_h`` the CSR (num_rows, n) holding ``values[h]``; dense (n, H, d)."""
    n, H, d = dense.shape
    out = dense.new_empty(num_rows, H, d)  # (rows, H, d)
    if values.size(1) == 0:
        return out.zero_()
    for h in range(H):
        out[:, h] = _csr(crow, col, values[h], (num_rows, n)) @ dense[:, h]  # (rows, n) @ (n, d) -> (rows, d)
    return out


def csr_backward(graph: _Graph, q, k, v, alpha, keep, p, grad_out, grad_alpha, scale, q_scaled=False):
    """Gradients of the CSR kernel: ``dq, dk, dv`` (n, H, d) and ``d score`` (H, E).

    ``q, k, v`` are (n, H, d) (``q`` already multiplied by ``scale`` if ``q_scaled``);
    ``alpha`` (H, E) the weights before dropout, ``keep`` (H, E) the dropout mask or None.
    """
    if grad_out is None:
        grad_out = v.new_zeros(graph.L, v.size(1), v.size(2))
    grad_out = grad_out.contiguous()  # (L, H, D_v); sum().backward() hands in a stride-0 expansion
    g = sddmm(graph, grad_out, v)  # (H, E) dL/d alpha_dropped
    if grad_alpha is not None:
        g = g + grad_alpha
    g = apply_keep(g, keep, p)  # (H, E) dL/d alpha
    ds = segment_softmax_backward(g, alpha, graph.dst, graph.L, degree=graph.uniform_degree)  # (H, E)
    dq = spmm(graph.crow, graph.src, ds, k, graph.L).mul_(scale)  # (L, H, D)
    perm_t, crow_t, col_t = graph.transposed()
    dk = spmm(crow_t, col_t, ds[:, perm_t], q, graph.S)  # (S, H, D)
    if not q_scaled:
        dk.mul_(scale)
    dv = spmm(crow_t, col_t, apply_keep(alpha, keep, p)[:, perm_t], grad_out, graph.S)  # (S, H, D_v)
    return dq, dk, dv, ds


class CSRAttention(torch.autograd.Function):
    """Attention on the CSR kernel; returns ``out (L, H, D_v)`` and ``alpha (H, E)`` in sorted edge order."""

    @staticmethod
    def forward(ctx, query, key, value, bias, graph, scale, p):
        ctx.set_materialize_grads(False)
        score = sddmm(graph, query, key, alpha=scale)  # (H, E)
        if bias is not None:
            score += bias.t()  # (H, E) + (H or 1, E)
        alpha = segment_softmax(score, graph.dst, graph.L, dim=1, degree=graph.uniform_degree)  # (H, E)
        keep = draw_keep(alpha, p) if p > 0.0 else None  # (H, E)
        alpha_d = apply_keep(alpha, keep, p)  # (H, E)
        out = spmm(graph.crow, graph.src, alpha_d, value, graph.L)  # (L, H, D_v)
        ctx.save_for_backward(query, key, value, alpha, keep)
        ctx.graph, ctx.scale, ctx.p, ctx.bias_heads = graph, scale, p, None if bias is None else bias.size(1)
        return out, alpha_d  # (L, H, D_v), (H, E)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_alpha):
        q, k, v, alpha, keep = ctx.saved_tensors
        dq, dk, dv, ds = csr_backward(ctx.graph, q, k, v, alpha, keep, ctx.p, grad_out, grad_alpha, ctx.scale)
        return dq, dk, dv, bias_grad(ds, ctx.bias_heads, ctx.needs_input_grad[3]), None, None, None
