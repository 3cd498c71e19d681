"""The block kernel: dense 64 x 64 tiles (GEMM) masked to the edges, one fused softmax per tile row.

For graphs whose edges fill at least ``MIN_FILL`` of the tiles they touch
(windows, block-sparse patterns, causal with a bias). Per block of 64
queries, a row of ``nt`` key tiles is multiplied densely, masked to the edges
and normalised by one fused softmax, one head and one cache-sized chunk of
query blocks at a time (:class:`~graphattn.ops.structure._Tiles`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from graphattn.ops.csr import csr_backward
from graphattn.ops.guard import finite
from graphattn.ops.shared import apply_keep, bias_grad
from graphattn.ops.softmax import softmax_rows, softmax_rows_backward


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    """(n, H, d) -> (rows, H, d) with zero rows after n; ``x`` itself when n == rows (no copy)."""
    return x if x.size(0) == rows else F.pad(x, (0, 0, 0, 0, 0, rows - x.size(0)))


def _head_rows(x: Tensor, h: int, r0: int, r1: int, B: int) -> Tensor:
    """Rows ``[r0, r1)`` of head h of a node-major ``(rows, H, d)`` tensor as ``(c, B, d)``, a strided view."""
    return x[r0:r1, h].unflatten(0, (-1, B))  # (c, B, d), row stride H * d


def _chunk_flats(tiles, needed: bool):
    """Each chunk's edges' places in its own ``(c*B, nt*B)`` score plane: ``(E_c,)`` each, or None if not needed."""
    ntb = tiles.nt * tiles.B
    return [tiles.flat[e0:e1] - b0 * tiles.B * ntb if needed else None for b0, b1, e0, e1 in tiles.chunks]


class BlockAttention(torch.autograd.Function):
    """Attention on the block kernel; same contract as :class:`~graphattn.ops.csr.CSRAttention`.

    One head and one chunk of query blocks at a time, so that scores,
    probabilities and their gradients stay in cache: ``(c, B, nt*B)`` tiles.
    Queries, outputs and their gradients stay node-major ``(L, H, d)``: the
    matmuls read and write them through strided per-head views (no copies);
    ``scale`` is applied inside the matmuls. The probabilities are kept for
    backward only when an input needs a gradient.
    """

    @staticmethod
    def forward(ctx, query, key, value, bias, graph, tiles, scale, p, need_weights):
        ctx.set_materialize_grads(False)
        B, L, H, Dv, ntb = tiles.B, graph.L, query.size(1), value.size(2), tiles.nt * tiles.B
        rows = tiles.nqb * B
        keep_probs = any(ctx.needs_input_grad[:4])
        qp = _pad_rows(query.contiguous(), rows)  # (nqb*B, H, D), the query itself when L = nqb*B
        kh, vh = tiles.pad_keys(key), tiles.pad_keys(value)  # (H, rows_k, D), (H, rows_k, D_v)
        out = query.new_empty(rows, H, Dv)  # (nqb*B, H, D_v)
        alpha = query.new_empty(H, graph.E if need_weights else 0)  # (H, E)
        probs = query.new_empty(H, rows, ntb) if keep_probs else None  # (H, nqb*B, nt*B)
        keeps = torch.empty(H, rows, ntb, dtype=torch.bool, device=query.device) if p > 0.0 else None
        flats = _chunk_flats(tiles, need_weights or bias is not None)
        s = query.new_empty(max(b1 - b0 for b0, b1, _, _ in tiles.chunks) * B * ntb)  # score buffer, reused
        for h in range(H):
            for (b0, b1, e0, e1), flat in zip(tiles.chunks, flats):
                r0, r1 = b0 * B, b1 * B
                s_c = s[:(r1 - r0) * ntb].view(b1 - b0, B, ntb)  # (c, B, nt*B)
                s_c.baddbmm_(_head_rows(qp, h, r0, r1, B), tiles.keys(kh[h], b0, b1).mT, beta=0.0,
                             alpha=scale)  # (c, B, D) @ (c, D, nt*B) * scale; beta = 0 ignores the old buffer
                if bias is not None:
                    s_c.view(-1).index_add_(0, flat, bias[e0:e1, h if bias.size(1) > 1 else 0])
                s_c.view(r1 - r0, ntb).masked_fill_(tiles.blocked[r0:r1], float("-inf"))
                kept = None if probs is None else probs[h, r0:r1]  # saved for backward when needed
                prob = softmax_rows(s_c.view(r1 - r0, ntb), kept)  # (c*B, nt*B), fused; 0 off the edges
                if bias is not None:  # a row without edges, or whose bias is all -inf: NaN -> exact 0
                    prob.masked_fill_(torch.isneginf(s_c.view(r1 - r0, ntb).amax(-1, keepdim=True)), 0.0)
                elif tiles.has_empty:  # a row without edges is all -inf: NaN -> exact 0
                    prob.masked_fill_(tiles.empty_rows[r0:r1].unsqueeze(-1), 0.0)
                if keeps is not None:
                    prob = apply_keep(prob, keeps[h, r0:r1].bernoulli_(1.0 - p), p)  # (c*B, nt*B)
                torch.bmm(prob.view(-1, B, ntb), tiles.keys(vh[h], b0, b1), out=_head_rows(out, h, r0, r1, B))
                if need_weights:
                    alpha[h, e0:e1] = prob.view(-1).index_select(0, flat)  # (E_c,)
        ctx.save_for_backward(qp, kh, vh, probs, keeps)
        ctx.graph, ctx.tiles, ctx.scale, ctx.p = graph, tiles, scale, p
        ctx.bias_heads = None if bias is None else bias.size(1)
        return out[:L], alpha  # (L, H, D_v), (H, E)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_alpha):
        qp, kh, vh, probs, keeps = ctx.saved_tensors
        graph, tiles, scale, p = ctx.graph, ctx.tiles, ctx.scale, ctx.p
        L, S, H, B, ntb = graph.L, graph.S, qp.size(1), tiles.B, tiles.nt * tiles.B
        if grad_out is None:
            grad_out = qp.new_zeros(L, H, vh.size(2))
        if not finite(grad_out):  # 0 * inf off the edges would poison: go exact
            return BlockAttention._backward_csr(ctx, grad_out, grad_alpha)
        gp = _pad_rows(grad_out.contiguous(), tiles.nqb * B)  # (nqb*B, H, D_v)
        dq, dk, dv = torch.empty_like(qp), torch.zeros_like(kh), torch.zeros_like(vh)
        ds_edges = qp.new_empty(H, graph.E) if ctx.bias_heads is not None else None  # (H, E)
        flats = _chunk_flats(tiles, grad_alpha is not None or ds_edges is not None)
        for h in range(H):
            for (b0, b1, e0, e1), flat in zip(tiles.chunks, flats):
                r0, r1 = b0 * B, b1 * B
                q_c, g_c = _head_rows(qp, h, r0, r1, B), _head_rows(gp, h, r0, r1, B)  # (c, B, d)
                k_c, v_c = tiles.keys(kh[h], b0, b1), tiles.keys(vh[h], b0, b1)  # (c, nt*B, d)
                prob = probs[h, r0:r1].view(-1, B, ntb)  # (c, B, nt*B)
                d_prob = torch.bmm(g_c, v_c.mT)  # (c, B, D_v) @ (c, D_v, nt*B): dL/d prob_dropped
                if grad_alpha is not None:
                    d_prob.view(-1).index_add_(0, flat, grad_alpha[h, e0:e1])
                keep = None if keeps is None else keeps[h, r0:r1].view(-1, B, ntb)  # (c, B, nt*B)
                d_prob = apply_keep(d_prob, keep, p)  # dL/d prob
                ds = softmax_rows_backward(d_prob, prob)  # (c, B, nt*B): dL/d score
                _head_rows(dq, h, r0, r1, B).baddbmm_(ds, k_c, beta=0.0, alpha=scale)  # (c, B, D)
                tiles.add_keys(dk[h], torch.bmm(ds.mT, q_c).mul_(scale), b0, b1)  # (c, nt*B, D)
                tiles.add_keys(dv[h], torch.bmm(apply_keep(prob, keep, p).mT, g_c), b0, b1)  # (c, nt*B, D_v)
                if ds_edges is not None:
                    ds_edges[h, e0:e1] = ds.view(-1).index_select(0, flat)  # (E_c,)
        dbias = None if ds_edges is None else bias_grad(ds_edges, ctx.bias_heads, ctx.needs_input_grad[3])
        return dq[:L], tiles.unpad_keys(dk, S), tiles.unpad_keys(dv, S), dbias, None, None, None, None, None

    @staticmethod
    def _backward_csr(ctx, grad_out, grad_alpha):
        """Exact backward on the CSR kernel (used when ``grad_out`` is not finite)."""
        qp, kh, vh, probs, keeps = ctx.saved_tensors
        graph, tiles, L, S, p = ctx.graph, ctx.tiles, ctx.graph.L, ctx.graph.S, ctx.p
        H = qp.size(1)
        alpha = probs.view(H, -1).index_select(1, tiles.flat)  # (H, E)
        keep = None if keeps is None else keeps.view(H, -1).index_select(1, tiles.flat)  # (H, E)
        dq, dk, dv, ds = csr_backward(graph, qp[:L], tiles.unpad_keys(kh, S), tiles.unpad_keys(vh, S),
                                      alpha, keep, p, grad_out, grad_alpha, ctx.scale)
        dbias = bias_grad(ds, ctx.bias_heads, ctx.needs_input_grad[3])
        return dq, dk, dv, dbias, None, None, None, None, None
