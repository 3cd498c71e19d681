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

from graphattn.ops.csr import csr_backward
from graphattn.ops.guard import finite
from graphattn.ops.shared import apply_keep, draw_keep
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


def _tile(buffer: Tensor, flat: Tensor, values: Tensor) -> Tensor:
    """``buffer`` zeroed, then ``values (E_c,)`` written at the edges' places ``flat (E_c,)``: a tile from edges."""
    buffer.zero_()
    buffer.view(-1).index_copy_(0, flat, values)
    return buffer


def block_forward(
    graph,
    tiles,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bias: Tensor | None,
    scale: float,
    p: float,
    need_alpha: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``out (L, H, D_v)``, ``alpha (H, E)`` sorted before dropout (``(H, 0)`` unless ``need_alpha``), ``keep``.

    One head and one chunk of query blocks at a time, so that scores and
    probabilities stay in cache: ``(c, B, nt*B)`` tiles. Queries and outputs
    stay node-major ``(L, H, d)``: the matmuls read and write them through
    strided per-head views (no copies); ``scale`` is applied inside the
    matmuls. Dropout's mask is drawn on the edges, ``(H, E)``, as on the CSR
    kernel, and laid into each tile.
    """
    B, L, H, Dv, ntb = tiles.B, graph.L, query.size(1), value.size(2), tiles.nt * tiles.B
    rows = tiles.nqb * B
    qp = _pad_rows(query.contiguous(), rows)  # (nqb*B, H, D), the query itself when L = nqb*B
    kh, vh = tiles.pad_keys(key), tiles.pad_keys(value)  # (H, rows_k, D), (H, rows_k, D_v)
    out = query.new_empty(rows, H, Dv)  # (nqb*B, H, D_v)
    alpha = query.new_empty(H, graph.E if need_alpha else 0)  # (H, E)
    keep = draw_keep(query.new_empty(H, graph.E), p) if p > 0.0 else None  # (H, E)
    flats = _chunk_flats(tiles, need_alpha or bias is not None or keep is not None)
    s = query.new_empty(max(b1 - b0 for b0, b1, _, _ in tiles.chunks) * B * ntb)  # score buffer, reused
    prob_buf = torch.empty_like(s)  # probabilities, reused
    keep_buf = torch.empty(s.shape, dtype=torch.bool, device=query.device) if keep is not None else None
    for h in range(H):
        for (b0, b1, e0, e1), flat in zip(tiles.chunks, flats):
            r0, r1 = b0 * B, b1 * B
            s_c = s[: (r1 - r0) * ntb].view(b1 - b0, B, ntb)  # (c, B, nt*B)
            s_c.baddbmm_(
                _head_rows(qp, h, r0, r1, B), tiles.keys(kh[h], b0, b1).mT, beta=0.0, alpha=scale
            )  # (c, B, D) @ (c, D, nt*B) * scale; beta = 0 ignores the old buffer
            if bias is not None:
                s_c.view(-1).index_add_(0, flat, bias[e0:e1, h if bias.size(1) > 1 else 0])
            s_c.view(r1 - r0, ntb).masked_fill_(tiles.blocked[r0:r1], float("-inf"))
            prob = softmax_rows(s_c.view(r1 - r0, ntb), prob_buf[: (r1 - r0) * ntb].view(r1 - r0, ntb))  # fused
            if bias is not None:  # a row without edges, or whose bias is all -inf: NaN -> exact 0
                prob.masked_fill_(torch.isnan(prob[:, :1]), 0.0)
            elif tiles.has_empty:  # a row without edges is all -inf: NaN -> exact 0
                prob.masked_fill_(tiles.empty_rows[r0:r1].unsqueeze(-1), 0.0)
            if need_alpha:
                alpha[h, e0:e1] = prob.view(-1).index_select(0, flat)  # (E_c,)
            if keep is not None:
                keep_c = _tile(keep_buf[: (r1 - r0) * ntb], flat, keep[h, e0:e1]).view(r1 - r0, ntb)
                prob = apply_keep(prob, keep_c, p)  # (c*B, nt*B)
            torch.bmm(prob.view(-1, B, ntb), tiles.keys(vh[h], b0, b1), out=_head_rows(out, h, r0, r1, B))
    return out[:L], alpha, keep  # (L, H, D_v), (H, E), (H, E) or None


def block_backward(graph, tiles, query, key, value, alpha, keep, p, grad_out, grad_alpha, scale, need_ds: bool):
    """``dq, dk, dv`` and ``d score (H, E)`` (or None unless ``need_ds``) of :func:`block_forward`.

    The probabilities are laid back into tiles from ``alpha (H, E)`` (what the
    forward kept: O(E H), not the ``(H, L, nt*B)`` tiles). With a non-finite
    ``grad_out``, where ``0 * inf`` off the edges would poison a tile, the
    exact CSR backward runs instead.
    """
    L, S, H, B, ntb = graph.L, graph.S, query.size(1), tiles.B, tiles.nt * tiles.B
    if grad_out is None:
        grad_out = query.new_zeros(L, H, value.size(2))
    if not finite(grad_out):
        dq, dk, dv, ds = csr_backward(graph, query, key, value, alpha, keep, p, grad_out, grad_alpha, scale)
        return dq, dk, dv, ds if need_ds else None
    rows = tiles.nqb * B
    qp, gp = _pad_rows(query.contiguous(), rows), _pad_rows(grad_out.contiguous(), rows)  # (nqb*B, H, d)
    kh, vh = tiles.pad_keys(key), tiles.pad_keys(value)  # (H, rows_k, d)
    dq, dk, dv = torch.empty_like(qp), torch.zeros_like(kh), torch.zeros_like(vh)
    ds_edges = qp.new_empty(H, graph.E) if need_ds else None  # (H, E)
    flats = _chunk_flats(tiles, True)
    size = max(b1 - b0 for b0, b1, _, _ in tiles.chunks) * B * ntb
    prob_buf = qp.new_empty(size)
    keep_buf = torch.empty(size, dtype=torch.bool, device=qp.device) if keep is not None else None
    for h in range(H):
        for (b0, b1, e0, e1), flat in zip(tiles.chunks, flats):
            r0, r1 = b0 * B, b1 * B
            n = (r1 - r0) * ntb
            q_c, g_c = _head_rows(qp, h, r0, r1, B), _head_rows(gp, h, r0, r1, B)  # (c, B, d)
            k_c, v_c = tiles.keys(kh[h], b0, b1), tiles.keys(vh[h], b0, b1)  # (c, nt*B, d)
            prob = _tile(prob_buf[:n], flat, alpha[h, e0:e1]).view(-1, B, ntb)  # (c, B, nt*B), 0 off the edges
            keep_c = None if keep is None else _tile(keep_buf[:n], flat, keep[h, e0:e1]).view(-1, B, ntb)
            d_prob = apply_keep(torch.bmm(g_c, v_c.mT), keep_c, p)  # (c, B, D_v) @ (c, D_v, nt*B): dL/d prob
            if grad_alpha is not None:
                d_prob.view(-1).index_add_(0, flat, grad_alpha[h, e0:e1])
            ds = softmax_rows_backward(d_prob, prob)  # (c, B, nt*B): dL/d score
            _head_rows(dq, h, r0, r1, B).baddbmm_(ds, k_c, beta=0.0, alpha=scale)  # (c, B, D)
            tiles.add_keys(dk[h], torch.bmm(ds.mT, q_c).mul_(scale), b0, b1)  # (c, nt*B, D)
            tiles.add_keys(dv[h], torch.bmm(apply_keep(prob, keep_c, p).mT, g_c), b0, b1)  # (c, nt*B, D_v)
            if ds_edges is not None:
                ds_edges[h, e0:e1] = ds.view(-1).index_select(0, flat)  # (E_c,)
    return dq[:L], tiles.unpad_keys(dk, S), tiles.unpad_keys(dv, S), ds_edges
