"""Attention kernels over an edge list: scores, per-target softmax, aggregation, dispatch.

For every edge ``(j, i)`` of ``edge_index`` (row 0 = source = key j, row 1 =
target = query i) and every head h:

1) score      ``s_ijh = (q_ih · k_jh) * scale (+ edge_bias_ijh)``
2) softmax    ``alpha_ijh = exp(s_ijh) / sum_{j' -> i} exp(s_ij'h)`` over the incoming edges of i
3) aggregate  ``y_ih = sum_{j -> i} alpha_ijh v_jh``

A query with no incoming edge gets an exact zero row (DESIGN.md).

Three exact kernels, none of which copies features onto edges (no ``(E, H, D)``
tensor; extra memory is O(E H) + O(N H D)):

- ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` when the
  edge set is the complete graph or the causal DAG (a ``Pattern`` of kind
  ``"full"``/``"causal"``, or an edge list that is exactly that set).
- ``"block"``: graphs whose edges fill at least a quarter of the 64 x 64 tiles
  they touch (windows, block-sparse, causal given as edges): per block of 64
  queries, the key tiles it touches are gathered and multiplied densely
  (GEMM), masked to the edges, and normalised with one fused softmax.
- ``"csr"``: any graph (random, top-k, duplicates, non-finite features): the
  edges sorted by target as CSR; scores by sampled dense-dense matmul
  (:func:`torch.sparse.sampled_addmm`), the softmax over CSR segments, and the
  aggregation as a sparse-dense matmul; backward with the transposed CSR.

``"block"`` and ``"csr"`` are :class:`torch.autograd.Function` objects whose
backward is written by hand (same kernels, no per-edge features); gradients
equal the dense oracle's.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn.graphs import check_edge_index

__all__ = ["attention", "segment_softmax", "check_qkv", "check_edge_bias", "choose_impl", "IMPLS"]

IMPLS = ("auto", "sdpa", "block", "csr")
BLOCK = 64  # tile size of the "block" kernel (queries and keys)
MIN_FILL = 0.25  # "block" when edges fill at least this fraction of the padded tiles
CHUNK_ROWS = 1024  # the block kernel gathers about max(S, CHUNK_ROWS) key rows at a time


def check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Validate ``query (L, H, D)``, ``key (S, H, D)``, ``value (S, H, D_v)``.

    Raises
    ------
    TypeError
        If they are not floating-point tensors of one dtype.
    ValueError
        If their shapes do not agree.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"Expected '{name}' to be a Tensor (got {type(t).__name__})")
        if t.dim() != 3:
            raise ValueError(f"Expected '{name}' to have shape (n, H, D) (got {tuple(t.shape)})")
        if not t.is_floating_point():
            raise TypeError(f"Expected '{name}' to be floating point (got {t.dtype})")
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(
            f"Expected 'query', 'key' and 'value' to share one dtype (got {query.dtype}, {key.dtype}, {value.dtype})"
        )
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(
            f"Expected 'key' (S, H, D) and 'value' (S, H, D_v) to agree on S and H "
            f"(got {tuple(key.shape)} and {tuple(value.shape)})"
        )
    if query.shape[1:] != key.shape[1:]:
        raise ValueError(
            f"Expected 'query' (L, H, D) and 'key' (S, H, D) to agree on H and D "
            f"(got {tuple(query.shape)} and {tuple(key.shape)})"
        )


def check_edge_bias(edge_bias: Tensor | None, num_edges: int, heads: int) -> Tensor | None:
    """Validate ``edge_bias`` of shape ``(E,)`` or ``(E, H)``; return it as ``(E, H)`` or ``(E, 1)``."""
    if edge_bias is None:
        return None
    if not isinstance(edge_bias, Tensor) or not edge_bias.is_floating_point():
        got = edge_bias.dtype if isinstance(edge_bias, Tensor) else type(edge_bias).__name__
        raise TypeError(f"Expected 'edge_bias' to be a floating-point Tensor (got {got})")
    if edge_bias.dim() == 1:
        edge_bias = edge_bias.unsqueeze(-1)  # (E, 1)
    if edge_bias.dim() != 2 or edge_bias.size(0) != num_edges or edge_bias.size(1) not in (1, heads):
        raise ValueError(
            f"Expected 'edge_bias' to have shape (E,) or (E, H) = ({num_edges},) or ({num_edges}, {heads}) "
            f"(got {tuple(edge_bias.shape)})"
        )
    if torch.isnan(edge_bias).any() or torch.isposinf(edge_bias).any():
        raise ValueError("Expected 'edge_bias' to hold no NaN or +inf (-inf is allowed and removes the edge)")
    return edge_bias


def segment_softmax(score: Tensor, index: Tensor, num_targets: int) -> Tensor:
    """Softmax of edge scores over the incoming edges of each target (any edge order).

    Parameters
    ----------
    score : Tensor, shape (E, H)
        Edge scores; ``-inf`` removes an edge.
    index : Tensor, shape (E,)
        Target i of each edge (``edge_index[1]``), in ``[0, num_targets)``.
    num_targets : int
        L.

    Returns
    -------
    alpha : Tensor, shape (E, H)
        Sums to 1 over the edges of each target that has a finite score, and is
        exactly 0 on the edges of a target whose scores are all ``-inf``.
    """
    heads = score.size(1)
    idx = index.unsqueeze(-1).expand_as(score)  # (E, H)
    seg_max = score.new_full((num_targets, heads), float("-inf"))
    seg_max = seg_max.scatter_reduce(0, idx, score.detach(), reduce="amax", include_self=True)  # (L, H)
    seg_max = seg_max.masked_fill(torch.isinf(seg_max), 0.0)  # a target without finite scores
    exp = torch.exp(score - seg_max[index])  # (E, H)
    denom = exp.new_zeros(num_targets, heads).index_add_(0, index, exp)  # (L, H)
    denom = denom[index]  # (E, H)
    return exp / denom.masked_fill(denom == 0, 1.0)  # (E, H); 0 / 1 = 0 for all -inf targets


# ------------------------------------------------------------------------------------------------
# structure: the edges sorted by target once per call, with the views the kernels need


class _Graph:
    """Edges sorted by (target, source) as CSR; the transpose and the tile layout on demand."""

    def __init__(self, edge_index: Tensor, num_targets: int, num_sources: int):
        L, S = num_targets, num_sources
        src, dst = edge_index[0].long(), edge_index[1].long()  # (E,), (E,)
        self.L, self.S, self.E = L, S, src.numel()
        key = dst * S + src  # (E,) row-major position in the (L, S) grid
        self.perm = None  # sorted = caller[perm]; None when the caller's order is already sorted
        if self.E > 1 and not bool((key[1:] >= key[:-1]).all()):
            key, self.perm = torch.sort(key, stable=True)  # (E,), (E,)
            src, dst = src[self.perm], dst[self.perm]  # (E,), (E,)
        self.src, self.dst = src, dst
        self.has_duplicates = self.E > 1 and bool((key[1:] == key[:-1]).any())
        self.deg = torch.bincount(dst, minlength=L)  # (L,) in-degree of each query
        self.crow = F.pad(self.deg.cumsum(0), (1, 0))  # (L + 1,)
        k = self.E // L if L else 0
        self.uniform_degree = k if L and k * L == self.E and bool((self.deg == k).all()) else None
        self._transposed = None
        self._tiles = {}

    def unsort(self, x: Tensor) -> Tensor:
        """Per-edge rows from sorted order back to the caller's order."""
        if self.perm is None:
            return x
        return x.new_empty(x.shape).index_copy_(0, self.perm, x)  # (E, ...)

    def sort(self, x: Tensor) -> Tensor:
        """Per-edge rows from the caller's order to sorted order."""
        return x if self.perm is None else x[self.perm]  # (E, ...)

    def edge_set(self) -> str | None:
        """``"full"`` or ``"causal"`` if the edges are exactly that set (each once), else None."""
        if self.has_duplicates or self.E == 0:
            return None
        if self.E == self.L * self.S:
            return "full"
        n = min(self.L, self.S)  # causal, top-left aligned as SDPA's is_causal: j <= i
        expected = n * (n + 1) // 2 + (self.L - n) * self.S
        if self.E == expected and bool((self.src <= self.dst).all()):
            return "causal"
        return None

    def transposed(self) -> tuple[Tensor, Tensor, Tensor]:
        """CSR of the transpose: ``(perm_t (E,), crow_t (S + 1,), col_t (E,))``, by source."""
        if self._transposed is None:
            _, perm_t = torch.sort(self.src, stable=True)  # (E,) by source, then target
            crow_t = F.pad(torch.bincount(self.src, minlength=self.S).cumsum(0), (1, 0))  # (S + 1,)
            self._transposed = (perm_t, crow_t, self.dst[perm_t])
        return self._transposed

    def tiles(self, block: int = BLOCK, min_fill: float = MIN_FILL):
        """Tile layout for the block kernel, or None when it does not pay (see :class:`_Tiles`)."""
        if (block, min_fill) not in self._tiles:
            self._tiles[(block, min_fill)] = _Tiles.build(self, block, min_fill)
        return self._tiles[(block, min_fill)]


class _Tiles:
    """For each block of ``B`` queries, the ``nt`` key blocks its edges touch (padded with a dummy).

    ``rows (nqb, nt * B)``: key row of each column of a query block's tile row
    (the dummy block ``nkb`` is all zeros); ``mask (nqb * B, nt * B)``: True at
    edges; ``qb``, ``r``, ``c`` ``(E,)``: where each sorted edge sits, as
    ``scores[qb, :, r, c]`` of the per-block scores ``(nqb, H, B, nt * B)``.
    """

    @staticmethod
    def build(graph: _Graph, B: int, min_fill: float):
        L, S, E = graph.L, graph.S, graph.E
        nqb, nkb = -(-L // B), -(-S // B)
        if E == 0 or graph.has_duplicates or nqb * nkb > max(4 * E, 1 << 20):
            return None
        src, dst = graph.src, graph.dst
        tile = (dst // B) * nkb + src // B  # (E,)
        present = torch.zeros(nqb * nkb, dtype=torch.bool, device=src.device)
        present[tile] = True
        present = present.view(nqb, nkb)  # (nqb, nkb)
        nt = int(present.sum(1).max())
        fill = E / (nqb * B * nt * B)
        if fill < min_fill:
            return None
        slot = present.cumsum(1) - 1  # (nqb, nkb) position of a present tile in its block row
        qbs, kbs = present.nonzero(as_tuple=True)  # (T,), (T,)
        kb_list = torch.full((nqb, nt), nkb, dtype=torch.long, device=src.device)  # (nqb, nt), nkb = dummy
        kb_list[qbs, slot[qbs, kbs]] = kbs
        self = _Tiles()
        self.B, self.nt, self.nqb, self.nkb, self.fill = B, nt, nqb, nkb, fill
        arange_b = torch.arange(B, device=src.device)
        self.rows = (kb_list.unsqueeze(-1) * B + arange_b).view(nqb, nt * B)  # (nqb, nt*B)
        self.qb, self.r = dst // B, dst % B  # (E,), (E,)
        self.c = slot.view(-1)[tile] * B + src % B  # (E,)
        self.mask = torch.zeros(nqb * B, nt * B, dtype=torch.bool, device=src.device)
        self.mask[dst, self.c] = True  # (nqb*B, nt*B)
        self.empty_rows = F.pad(graph.deg == 0, (0, nqb * B - L), value=True)  # (nqb*B,)
        self.has_empty = bool(self.empty_rows.any())
        # chunks of query blocks whose gathered keys stay about the size of the keys (O(N H D))
        step = max(1, max(S, CHUNK_ROWS) // (nt * B))
        self.chunks = [(b0, min(nqb, b0 + step)) for b0 in range(0, nqb, step)]
        return self


def _csr(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)


def _sddmm(crow, col, a: Tensor, b: Tensor, out: Tensor, alpha: float = 1.0) -> Tensor:
    """``out[h, e] = alpha * a[h, i_e] · b[h, j_e]`` on the CSR entries; a (H, L, D), b (H, S, D)."""
    if out.size(1) == 0:
        return out
    size = (a.size(1), b.size(1))
    pattern = _csr(crow, col, out.new_zeros(out.size(1)), size)  # zeros: beta * NaN garbage would be NaN
    for h in range(a.size(0)):  # one sampled matmul per head, written in place into out[h]
        torch.sparse.sampled_addmm(pattern, a[h], b[h].mT, beta=0.0, alpha=alpha,
                                   out=_csr(crow, col, out[h], size))  # (E,) per head
    return out  # (H, E)


def _spmm(crow, col, values: Tensor, dense: Tensor, num_rows: int) -> Tensor:
    """``out[h] = A_h @ dense[h]`` with ``A_h`` the CSR (num_rows, n) holding ``values[h]``."""
    H, n, d = dense.shape
    out = dense.new_zeros(H, num_rows, d)  # (H, rows, d)
    if values.size(1) == 0:
        return out
    for h in range(H):
        torch.mm(_csr(crow, col, values[h], (num_rows, n)), dense[h], out=out[h])  # (rows, d)
    return out


def _heads_first(x: Tensor, scale: float = 1.0) -> Tensor:
    """(n, H, d) -> contiguous (H, n, d), optionally scaled (one copy)."""
    x = x.permute(1, 0, 2)  # (H, n, d)
    return (x * scale).contiguous() if scale != 1.0 else x.contiguous()


# ------------------------------------------------------------------------------------------------
# the CSR kernel: sampled matmul, segment softmax, sparse-dense matmul


def _csr_softmax(graph: _Graph, score: Tensor) -> Tensor:
    """Softmax of ``score (H, E)`` over the CSR segments (targets); all -inf segment -> 0."""
    H, k = score.size(0), graph.uniform_degree
    if k is not None and k > 0 and not bool(torch.isneginf(score).any()):
        return torch.softmax(score.view(H, graph.L, k), dim=-1).view(H, -1)  # (H, E), fused
    dst = graph.dst.expand(H, -1)  # (H, E)
    seg_max = score.new_full((H, graph.L), float("-inf")).scatter_reduce_(1, dst, score, "amax")  # (H, L)
    seg_max.masked_fill_(torch.isneginf(seg_max), 0.0)
    exp = (score - seg_max.index_select(1, graph.dst)).exp_()  # (H, E)
    denom = score.new_zeros(H, graph.L).index_add_(1, graph.dst, exp)  # (H, L)
    return exp.div_(denom.masked_fill_(denom == 0, 1.0).index_select(1, graph.dst))  # (H, E)


def _csr_softmax_backward(graph: _Graph, grad: Tensor, alpha: Tensor) -> Tensor:
    """``d score = alpha * (grad - sum_{segment} alpha * grad)``, all (H, E)."""
    H, k = alpha.size(0), graph.uniform_degree
    if k is not None and k > 0:
        shape = (H, graph.L, k)
        return torch._softmax_backward_data(grad.view(shape), alpha.view(shape), -1, alpha.dtype).view(H, -1)
    dot = grad.new_zeros(H, graph.L).index_add_(1, graph.dst, alpha * grad)  # (H, L)
    return alpha * (grad - dot.index_select(1, graph.dst))  # (H, E)


def _csr_backward(graph, qh, kh, vh, alpha, keep, p, grad_out, grad_alpha, scale):
    """Gradients of the CSR kernel; every tensor heads-first. Returns dq, dk, dv (n, H, d), d score (H, E)."""
    H, L, S = qh.size(0), graph.L, graph.S
    if grad_out is None:
        grad_out = vh.new_zeros(L, H, vh.size(2))
    gh = _heads_first(grad_out)  # (H, L, D_v)
    g = _sddmm(graph.crow, graph.src, gh, vh, torch.empty_like(alpha))  # (H, E) dL/d alpha_dropped
    if grad_alpha is not None:
        g = g + grad_alpha
    a_d = alpha
    if keep is not None:
        g = g * keep / (1.0 - p)  # (H, E) dL/d alpha
        a_d = alpha * keep / (1.0 - p)
    ds = _csr_softmax_backward(graph, g, alpha)  # (H, E)
    dq = _spmm(graph.crow, graph.src, ds, kh, L) * scale  # (H, L, D)
    perm_t, crow_t, col_t = graph.transposed()
    dk = _spmm(crow_t, col_t, ds[:, perm_t], qh, S)  # (H, S, D); qh already holds q * scale
    dv = _spmm(crow_t, col_t, a_d[:, perm_t], gh, S)  # (H, S, D_v)
    return dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1), ds


class _CSRAttention(torch.autograd.Function):
    """Attention on the CSR kernel; returns ``out (L, H, D_v)`` and ``alpha (H, E)`` in sorted edge order."""

    @staticmethod
    def forward(ctx, query, key, value, bias, graph, scale, p):
        ctx.set_materialize_grads(False)
        qh, kh, vh = _heads_first(query, scale), _heads_first(key), _heads_first(value)  # (H, n, d)
        score = _sddmm(graph.crow, graph.src, qh, kh, qh.new_empty(qh.size(0), graph.E))  # (H, E)
        if bias is not None:
            score += bias.t()  # (H, E) + (H or 1, E)
        alpha = _csr_softmax(graph, score)  # (H, E)
        keep, alpha_d = None, alpha
        if p > 0.0:
            keep = torch.empty_like(alpha, dtype=torch.bool).bernoulli_(1.0 - p)  # (H, E)
            alpha_d = alpha * keep / (1.0 - p)
        out = _spmm(graph.crow, graph.src, alpha_d, vh, graph.L)  # (H, L, D_v)
        ctx.save_for_backward(qh, kh, vh, alpha, keep)
        ctx.graph, ctx.scale, ctx.p, ctx.bias_heads = graph, scale, p, None if bias is None else bias.size(1)
        return out.transpose(0, 1).contiguous(), alpha_d  # (L, H, D_v), (H, E)

    @staticmethod
    def backward(ctx, grad_out, grad_alpha):
        qh, kh, vh, alpha, keep = ctx.saved_tensors
        dq, dk, dv, ds = _csr_backward(ctx.graph, qh, kh, vh, alpha, keep, ctx.p, grad_out, grad_alpha, ctx.scale)
        dbias = None
        if ctx.bias_heads is not None and ctx.needs_input_grad[3]:
            dbias = ds.t() if ctx.bias_heads > 1 else ds.sum(0).unsqueeze(-1)  # (E, H) or (E, 1)
        return dq, dk, dv, dbias, None, None, None


# ------------------------------------------------------------------------------------------------
# the block kernel: dense tiles (GEMM) masked to the edges, one fused softmax per block row


def _block_rows(x: Tensor, tiles: _Tiles, b0: int, b1: int) -> Tensor:
    """Query blocks ``[b0, b1)`` of a padded ``(nqb * B, H, d)`` tensor as ``(c, H, B, d)``."""
    B = tiles.B
    return x[b0 * B:b1 * B].view(b1 - b0, B, x.size(1), x.size(2)).transpose(1, 2)  # (c, H, B, d)


def _block_keys(x: Tensor, tiles: _Tiles, b0: int, b1: int) -> Tensor:
    """The key tiles of query blocks ``[b0, b1)``, gathered from padded ``(S', H, d)``: ``(c, H, nt*B, d)``."""
    rows = tiles.rows[b0:b1]  # (c, nt*B)
    return x.index_select(0, rows.reshape(-1)).view(*rows.shape, x.size(1), x.size(2)).transpose(1, 2)


def _pad_rows(x: Tensor, n: int) -> Tensor:
    """Zero rows appended to ``x (m, H, d)`` up to n rows."""
    return F.pad(x, (0, 0, 0, 0, 0, n - x.size(0)))  # (n, H, d)


class _BlockAttention(torch.autograd.Function):
    """Attention on the block kernel; same contract as :class:`_CSRAttention`."""

    @staticmethod
    def forward(ctx, query, key, value, bias, graph, tiles, scale, p):
        ctx.set_materialize_grads(False)
        B, L = tiles.B, graph.L
        H, Dv = query.size(1), value.size(2)
        qp = _pad_rows(query * scale, tiles.nqb * B)  # (nqb*B, H, D)
        kp = _pad_rows(key, (tiles.nkb + 1) * B)  # (S' + B, H, D), last block = dummy zeros
        vp = _pad_rows(value, (tiles.nkb + 1) * B)  # (S' + B, H, D_v)
        out = query.new_empty(tiles.nqb, H, B, Dv)  # (nqb, H, B, D_v)
        alpha = query.new_empty(H, graph.E)  # (H, E)
        probs, keeps = [], []
        for b0, b1 in tiles.chunks:
            e0, e1 = int(graph.crow[min(b0 * B, L)]), int(graph.crow[min(b1 * B, L)])
            qb, r, c = tiles.qb[e0:e1] - b0, tiles.r[e0:e1], tiles.c[e0:e1]  # (E_c,) each
            s = _block_rows(qp, tiles, b0, b1) @ _block_keys(kp, tiles, b0, b1).mT  # (c, H, B, D) @ (c, H, D, nt*B)
            if bias is not None:
                s[qb, :, r, c] += bias[e0:e1]  # (E_c, H) at the edges of the chunk
            s.masked_fill_(~tiles.mask[b0 * B:b1 * B].view(b1 - b0, 1, B, -1), float("-inf"))
            prob = torch.softmax(s, dim=-1)  # (c, H, B, nt*B), fused; 0 off the edges
            if tiles.has_empty:  # a row without edges is all -inf: NaN -> exact 0
                prob.masked_fill_(tiles.empty_rows[b0 * B:b1 * B].view(b1 - b0, 1, B, 1), 0.0)
            prob_d, keep = prob, None
            if p > 0.0:
                keep = torch.empty_like(prob, dtype=torch.bool).bernoulli_(1.0 - p)  # (c, H, B, nt*B)
                prob_d = prob * keep / (1.0 - p)
            out[b0:b1] = prob_d @ _block_keys(vp, tiles, b0, b1)  # (c, H, B, nt*B) @ (c, H, nt*B, D_v)
            alpha[:, e0:e1] = prob_d[qb, :, r, c].t()  # (H, E_c)
            probs.append(prob)
            keeps.append(keep)
        ctx.save_for_backward(qp, kp, vp, alpha)
        ctx.graph, ctx.tiles, ctx.scale, ctx.p, ctx.probs, ctx.keeps = graph, tiles, scale, p, probs, keeps
        ctx.bias_heads = None if bias is None else bias.size(1)
        out = out.transpose(1, 2).reshape(tiles.nqb * B, H, Dv)[:L]  # (L, H, D_v)
        return out.contiguous(), alpha

    @staticmethod
    def backward(ctx, grad_out, grad_alpha):
        qp, kp, vp, alpha = ctx.saved_tensors
        graph, tiles, scale, p = ctx.graph, ctx.tiles, ctx.scale, ctx.p
        L, S = graph.L, graph.S
        if grad_out is None:
            grad_out = qp.new_zeros(L, qp.size(1), vp.size(2))
        if not _finite(grad_out):  # 0 * inf off the edges would poison: go exact
            return _BlockAttention._backward_csr(ctx, grad_out, grad_alpha)
        B, H = tiles.B, qp.size(1)
        gp = _pad_rows(grad_out, tiles.nqb * B)  # (nqb*B, H, D_v)
        dq, dk, dv = torch.zeros_like(qp), torch.zeros_like(kp), torch.zeros_like(vp)
        ds_edges = alpha.new_empty(H, graph.E) if ctx.bias_heads is not None else None  # (H, E)
        for (b0, b1), prob, keep in zip(tiles.chunks, ctx.probs, ctx.keeps):
            e0, e1 = int(graph.crow[min(b0 * B, L)]), int(graph.crow[min(b1 * B, L)])
            qb, r, c = tiles.qb[e0:e1] - b0, tiles.r[e0:e1], tiles.c[e0:e1]  # (E_c,) each
            rows = tiles.rows[b0:b1].reshape(-1)  # (c*nt*B,)
            q_c, g_c = _block_rows(qp, tiles, b0, b1), _block_rows(gp, tiles, b0, b1)  # (c, H, B, d)
            k_c, v_c = _block_keys(kp, tiles, b0, b1), _block_keys(vp, tiles, b0, b1)  # (c, H, nt*B, d)
            d_prob = g_c @ v_c.mT  # (c, H, B, D_v) @ (c, H, D_v, nt*B) -> dL/d prob_dropped
            if grad_alpha is not None:
                d_prob[qb, :, r, c] += grad_alpha[:, e0:e1].t()  # (E_c, H)
            prob_d = prob
            if keep is not None:
                d_prob = d_prob * keep / (1.0 - p)
                prob_d = prob * keep / (1.0 - p)
            ds = torch._softmax_backward_data(d_prob, prob, -1, prob.dtype)  # (c, H, B, nt*B)
            dq[b0 * B:b1 * B] = (ds @ k_c).transpose(1, 2).reshape(-1, H, qp.size(2))  # (c*B, H, D)
            dk.index_add_(0, rows, (ds.mT @ q_c).transpose(1, 2).reshape(-1, H, kp.size(2)))  # (c*nt*B, H, D)
            dv.index_add_(0, rows, (prob_d.mT @ g_c).transpose(1, 2).reshape(-1, H, vp.size(2)))
            if ds_edges is not None:
                ds_edges[:, e0:e1] = ds[qb, :, r, c].t()  # (H, E_c)
        dbias = None
        if ds_edges is not None and ctx.needs_input_grad[3]:
            dbias = ds_edges.t() if ctx.bias_heads > 1 else ds_edges.sum(0).unsqueeze(-1)
        return dq[:L] * scale, dk[:S], dv[:S], dbias, None, None, None, None

    @staticmethod
    def _backward_csr(ctx, grad_out, grad_alpha):
        """Exact backward on the CSR kernel (used when ``grad_out`` is not finite)."""
        qp, kp, vp, alpha_d = ctx.saved_tensors
        graph, tiles, L, S, p = ctx.graph, ctx.tiles, ctx.graph.L, ctx.graph.S, ctx.p
        alpha = torch.cat([prob[tiles.qb[e0:e1] - b0, :, tiles.r[e0:e1], tiles.c[e0:e1]]
                           for (b0, b1), prob, (e0, e1) in zip(tiles.chunks, ctx.probs, _edge_ranges(graph, tiles))]).t()
        keep = None if p == 0.0 else alpha_d != 0  # same backward: where alpha = 0 the keep bit is moot
        qh, kh, vh = _heads_first(qp[:L]), _heads_first(kp[:S]), _heads_first(vp[:S])
        dq, dk, dv, ds = _csr_backward(graph, qh, kh, vh, alpha.contiguous(), keep, p, grad_out, grad_alpha,
                                       ctx.scale)
        dbias = None
        if ctx.bias_heads is not None and ctx.needs_input_grad[3]:
            dbias = ds.t() if ctx.bias_heads > 1 else ds.sum(0).unsqueeze(-1)
        return dq, dk, dv, dbias, None, None, None, None


def _edge_ranges(graph: _Graph, tiles: _Tiles) -> list[tuple[int, int]]:
    B, L = tiles.B, graph.L
    return [(int(graph.crow[min(b0 * B, L)]), int(graph.crow[min(b1 * B, L)])) for b0, b1 in tiles.chunks]


# ------------------------------------------------------------------------------------------------
# the dense kernel for the complete graph and the causal DAG


def _finite(*tensors: Tensor) -> bool:
    """True when every entry is finite (``aminmax`` propagates NaN; no tensor-sized temporary)."""
    for t in tensors:
        if t.numel():
            lo, hi = torch.aminmax(t.detach())
            if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
                return False
    return True


def _sdpa(query, key, value, kind: str, scale: float, p: float, need_weights: bool):
    """Attention on the complete graph (``kind="full"``) or the causal DAG, dense.

    Returns ``out (L, H, D_v)`` and ``alpha (E, H)`` in sorted edge order (by
    target, then source), or None when ``need_weights`` is False. Without
    weights this is one ``F.scaled_dot_product_attention`` call (flash kernel
    where available); with weights, its math: ``softmax(q k^T * scale) v``.
    """
    L, S = query.size(0), key.size(0)
    q, k, v = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)  # (H, n, d)
    causal = kind == "causal"
    if not need_weights:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, scale=scale)  # (H, L, D_v)
        return out.transpose(0, 1).contiguous(), None
    scores = (q * scale) @ k.mT  # (H, L, D) @ (H, D, S) -> (H, L, S)
    mask = None
    if causal:
        mask = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()  # (L, S), top-left aligned
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (H, L, S)
    if p > 0.0:
        weights = F.dropout(weights, p=p)
    out = weights @ v  # (H, L, S) @ (H, S, D_v) -> (H, L, D_v)
    alpha = weights.permute(1, 2, 0)  # (L, S, H)
    alpha = alpha.reshape(L * S, -1) if mask is None else alpha[mask]  # (E, H), row-major = sorted
    return out.transpose(0, 1).contiguous(), alpha


# ------------------------------------------------------------------------------------------------
# dispatch


def _is_pattern(obj) -> bool:
    return hasattr(obj, "edge_index") and hasattr(obj, "kind") and callable(obj.edge_index)


def choose_impl(graph: _Graph, query: Tensor, key: Tensor, value: Tensor, edge_bias: Tensor | None = None,
                impl: str = "auto") -> str:
    """The kernel ``attention`` runs for these inputs: ``"sdpa"``, ``"block"`` or ``"csr"``.

    Rules, in order (``impl="auto"``):

    1. ``"sdpa"`` when there is no ``edge_bias`` and the edges are exactly the
       complete graph, or exactly the causal DAG with finite keys and values
       (SDPA multiplies masked weights, which are 0, by every value: a NaN or
       inf in a value no query may read would still poison the output).
    2. ``"block"`` when the edges have no duplicates, fill at least
       ``MIN_FILL`` of the padded ``BLOCK x BLOCK`` tiles, the features are
       finite (same reason) and ``edge_bias`` has no ``-inf``.
    3. ``"csr"`` otherwise (exact for every input).

    A forced ``impl`` skips the cost rules but not the exactness ones: forced
    ``"block"`` still runs ``"csr"`` for non-finite inputs.
    """
    if impl in ("auto", "sdpa") and edge_bias is None:
        kind = graph.edge_set()
        if kind == "full" or (kind == "causal" and _finite(key, value)):
            return "sdpa"
    if impl == "sdpa":
        raise NotImplementedError(
            "Expected the complete graph or the causal DAG without 'edge_bias' for impl='sdpa' "
            "(got another edge set); use impl='auto'"
        )
    if impl == "csr":
        return "csr"
    tiles = graph.tiles() if impl == "auto" else graph.tiles(min_fill=0.0)
    if tiles is None:
        if impl == "block":
            raise NotImplementedError(
                "Expected edges without duplicates and a tile table of at most max(4 E, 2^20) tiles "
                "for impl='block'; use impl='csr'"
            )
        return "csr"
    exact = _finite(query, key, value) and (edge_bias is None or not bool(torch.isneginf(edge_bias).any()))
    return "block" if exact else "csr"


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    edge_index,
    *,
    scale: float | None = None,
    edge_bias: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = True,
    need_weights: bool = True,
    impl: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Multi-head attention restricted to the edges of a graph (no parameters).

    .. math::
        \\alpha_{ij}^h = \\mathrm{softmax}_{j \\in \\mathcal{N}(i)}
        \\big(\\mathrm{scale}\\; q_i^h \\cdot k_j^h + b_{ij}^h\\big),
        \\qquad y_i^h = \\sum_{j \\in \\mathcal{N}(i)} \\alpha_{ij}^h v_j^h

    where :math:`\\mathcal{N}(i)` are the sources of the edges into target i.

    Parameters
    ----------
    query : Tensor, shape (L, H, D)
        One row per query (target) node i.
    key : Tensor, shape (S, H, D)
        One row per key (source) node j.
    value : Tensor, shape (S, H, D_v)
    edge_index : Tensor, shape (2, E), or graphattn.patterns.Pattern
        Row 0 = source j (key), row 1 = target i (query). Any order; duplicate
        edges count as separate edges (each gets its own weight, so a pair
        listed twice gets twice the share). A ``Pattern`` stands for
        ``pattern.edge_index(L, S)``; for kind ``"full"``/``"causal"`` the
        edges are never built.
    scale : float, optional
        Default ``1 / sqrt(D)``.
    edge_bias : Tensor, shape (E,) or (E, H), optional
        Added to the scaled scores before the softmax (relative positions,
        ALiBi, graph distances); ``-inf`` removes an edge.
    dropout : float
        Dropout probability on the attention weights, in [0, 1).
    training : bool
        Apply dropout only when True (pass ``module.training``).
    need_weights : bool
        Return ``alpha``. False lets the complete and causal graphs run SDPA's
        fused kernel, which never forms the weights; the other kernels form
        them anyway.
    impl : {"auto", "sdpa", "block", "csr"}
        Kernel; ``"auto"`` picks the fastest exact one (:func:`choose_impl`).

    Returns
    -------
    output : Tensor, shape (L, H, D_v)
        A query with no incoming edge gets an exact zero row.
    alpha : Tensor, shape (E, H), or None
        Attention weight of each edge, in the order of ``edge_index``; for each
        query i they sum to 1 over its edges (after dropout if applied, as
        ``nn.MultiheadAttention`` returns them). None if ``need_weights`` is False.

    Raises
    ------
    TypeError
        Non-float features, mixed dtypes, or a non-integer ``edge_index``.
    ValueError
        Shapes that do not agree, ``edge_bias`` of the wrong shape or holding
        NaN/+inf, ``dropout`` outside [0, 1), an unknown ``impl``.
    IndexError
        An ``edge_index`` entry outside ``[0, S)`` (sources) or ``[0, L)`` (targets).
    NotImplementedError
        A forced ``impl`` that cannot run this graph (``"sdpa"`` on another
        edge set, ``"block"`` with duplicate edges).

    Notes
    -----
    No kernel copies features onto edges; extra memory is O(E H) + O(N H D).
    NaN or inf in the features of a node that query i does not read never
    reaches query i's output (kernels that would multiply it by a zero weight
    are not chosen for such inputs). Dropout draws its mask differently on
    each kernel (the same distribution, not the same bits).

    Examples
    --------
    >>> import torch
    >>> q = k = v = torch.eye(2).reshape(2, 1, 2)          # L = S = 2, H = 1, D = 2
    >>> edge_index = torch.tensor([[0, 0, 1], [0, 1, 1]])  # 0 -> 0, 0 -> 1, 1 -> 1
    >>> out, alpha = attention(q, k, v, edge_index)
    >>> alpha.squeeze(-1)
    tensor([1.0000, 0.3302, 0.6698])
    """
    check_qkv(query, key, value)
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"Expected 'dropout' to be in [0, 1) (got {dropout})")
    if impl not in IMPLS:
        raise ValueError(f"Expected 'impl' to be one of {IMPLS} (got {impl!r})")
    L, H, D = query.shape
    S = key.size(0)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    p = dropout if training else 0.0
    if not isinstance(edge_index, Tensor):
        if not _is_pattern(edge_index):
            raise TypeError(
                f"Expected 'edge_index' to be a LongTensor (2, E) or a graphattn.patterns.Pattern "
                f"(got {type(edge_index).__name__})"
            )
        kind = edge_index.kind
        if (edge_bias is None and impl in ("auto", "sdpa") and L > 0 and S > 0
                and (kind == "full" or (kind == "causal" and _finite(key, value)))):
            return _sdpa(query, key, value, kind, scale, p, need_weights)
        edge_index = edge_index.edge_index(L, S).to(query.device)  # (2, E)
    check_edge_index(edge_index, S, L)
    edge_bias = check_edge_bias(edge_bias, edge_index.size(1), H)
    graph = _Graph(edge_index, L, S)
    chosen = choose_impl(graph, query, key, value, edge_bias, impl)
    if chosen == "sdpa":
        out, alpha = _sdpa(query, key, value, graph.edge_set(), scale, p, need_weights)
        return out, None if alpha is None else graph.unsort(alpha)
    bias = None if edge_bias is None else graph.sort(edge_bias)  # (E, H) or (E, 1)
    if chosen == "block":
        out, alpha = _BlockAttention.apply(query, key, value, bias, graph, graph.tiles(min_fill=0.0)
                                           if impl == "block" else graph.tiles(), scale, p)
    else:
        out, alpha = _CSRAttention.apply(query, key, value, bias, graph, scale, p)
    return out, graph.unsort(alpha.t()) if need_weights else None  # (L, H, D_v), (E, H)
