"""The CSR kernel, exact on any graph: sampled matmul, segment softmax, sparse-dense matmul.

Edges sorted by target (:class:`~graphattn.ops.structure._Graph`); scores by a
sampled dense-dense matmul (``torch.sparse.sampled_addmm``, one batched call
over the heads; a graph with duplicate edges scores its distinct pairs and
copies each score to its duplicates), the softmax over the CSR segments
(:func:`~graphattn.ops.softmax.segment_softmax`), the aggregation as one CSR x
dense matmul for all heads: PyTorch's CPU sparse kernels have no batched CSR x
dense product (checked on 2.13), so the H per-head matrices are laid out as one
block-diagonal CSR ``(H L, H S)`` against the head-major ``(H S, D)`` features.
Backward with the transposed CSR. Plain functions: the operators of
:mod:`graphattn.ops.operators` call them and register their autograd. Measured on N = 10k, 10 keys per query, H = 8
(``benchmarks/train.py``): per-head products and gathered (E, H, D) chunks spent
most of their time copying strided head slices; these calls do not.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from graphattn.ops.shared import apply_keep, draw_keep
from graphattn.ops.softmax import segment_softmax, segment_softmax_backward
from graphattn.ops.structure import _Graph


def _csr(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, ...]) -> Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)


def sddmm(graph: _Graph, a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """``out[h, e] = alpha * a[i_e, h] · b[j_e, h]`` on the sorted edges; a (L, H, D), b (S, H, D) -> (H, E).

    One batched sampled dense-dense matmul over the heads, on strided views;
    with duplicate edges on the distinct (i, j) pairs, then copied to every duplicate.
    """
    H, E = a.size(1), graph.E
    if E == 0:
        return a.new_empty(H, 0)  # (H, E)
    if a.size(-1) == 0:  # no channels: every product is 0 (scored attention: the score is the bias alone)
        return a.new_zeros(H, E)  # (H, E)
    crow, col, inverse = graph.distinct()  # sampled_addmm wants each (i, j) once
    pattern = _csr(
        crow.expand(H, -1), col.expand(H, -1), a.new_zeros(()).expand(H, col.numel()), (H, graph.L, graph.S)
    )  # one sparsity for every head; zero values: beta * NaN cannot arise
    out = torch.sparse.sampled_addmm(
        pattern, a.transpose(0, 1), b.permute(1, 2, 0), beta=0.0, alpha=alpha
    ).values()  # (H, L, D) @ (H, D, S) sampled -> (H, U)
    return out if inverse is None else out.index_select(1, inverse)  # (H, E)


def spmm(blocks: tuple[Tensor, Tensor], values: Tensor, dense: Tensor, num_rows: int) -> Tensor:
    """``out[:, h] = A_h @ dense[:, h]``, ``A_h`` the CSR (num_rows, n) holding ``values[h]``; dense (n, H, d).

    One product of the block-diagonal CSR ``(H rows, H n)`` (``blocks`` from
    :meth:`~graphattn.ops.structure._Graph.head_blocks`, block h = ``A_h``) with
    the head-major ``(H n, d)`` features; returns a (rows, H, d) view of the
    head-major result.
    """
    n, H, d = dense.shape
    if values.size(1) == 0 or num_rows == 0 or n == 0 or d == 0:
        return dense.new_zeros(num_rows, H, d)  # (rows, H, d)
    block = _csr(*blocks, values.reshape(-1), (H * num_rows, H * n))  # (H rows, H n), values (H, E) flat
    dense = dense.transpose(0, 1).reshape(H * n, d)  # (H n, d) head-major
    if dense.device.type == "cpu":  # into a preallocated result: without out= the CPU kernel fills zeros and
        out = dense.new_empty(H * num_rows, d)  # copies (2x slower on 2.13); beta=0 ignores the empty input
        torch.addmm(out, block, dense, beta=0.0, out=out)  # (H rows, H n) @ (H n, d) -> (H rows, d)
    else:  # other devices: the plain product (no out=)
        out = block @ dense  # (H rows, H n) @ (H n, d) -> (H rows, d)
    return out.view(H, num_rows, d).transpose(0, 1)  # (rows, H, d)


def csr_forward(
    graph: _Graph, query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None, scale: float, p: float
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``out (L, H, D_v)``, ``alpha (H, E)`` (sorted, before dropout) and ``keep (H, E)`` or None.

    ``bias`` is ``(E, H or 1)`` in sorted edge order, or None.
    """
    score = sddmm(graph, query, key, alpha=scale)  # (H, E)
    if bias is not None:
        score += bias.t()  # (H, E) + (H or 1, E)
    alpha = segment_softmax(score, graph.dst, graph.L, dim=1, degree=graph.uniform_degree)  # (H, E)
    keep = draw_keep(alpha, p) if p > 0.0 else None  # (H, E)
    out = spmm(graph.head_blocks(value.size(1)), apply_keep(alpha, keep, p), value, graph.L)  # (L, H, D_v)
    return out, alpha, keep


def csr_backward(graph: _Graph, q, k, v, alpha, keep, p, grad_out, grad_alpha, scale, q_scaled=False):
    """Gradients of the CSR kernel: ``dq, dk, dv`` (n, H, d) and ``d score`` (H, E).

    ``q, k, v`` are (n, H, d) (``q`` already multiplied by ``scale`` if ``q_scaled``);
    ``alpha`` (H, E) the weights before dropout, ``keep`` (H, E) the dropout mask or None;
    ``grad_alpha`` (H, E) or None is the gradient of ``alpha`` itself (before dropout).
    """
    if grad_out is None:
        grad_out = v.new_zeros(graph.L, v.size(1), v.size(2))
    grad_out = grad_out.contiguous()  # (L, H, D_v); sum().backward() hands in a stride-0 expansion
    g = apply_keep(sddmm(graph, grad_out, v), keep, p)  # (H, E) dL/d alpha through the output
    if grad_alpha is not None:
        g = g + grad_alpha
    ds = segment_softmax_backward(g, alpha, graph.dst, graph.L, degree=graph.uniform_degree)  # (H, E)
    H = q.size(1)
    dq = spmm(graph.head_blocks(H), ds, k, graph.L).mul_(scale)  # (L, H, D)
    perm_t = graph.transposed()[0]
    blocks_t = graph.head_blocks(H, transposed=True)
    dk = spmm(blocks_t, ds.index_select(1, perm_t), q, graph.S)  # (S, H, D)
    if not q_scaled:
        dk.mul_(scale)
    dv = spmm(blocks_t, apply_keep(alpha, keep, p).index_select(1, perm_t), grad_out, graph.S)  # (S, H, D_v)
    return dq, dk, dv, ds
