"""Attention kernels over an edge list: scores, per-target softmax, aggregation, dispatch.

For every edge ``(j, i)`` of ``edge_index`` (row 0 = source = key j, row 1 =
target = query i) and every head h:

1) score      ``s_ijh = (q_ih · k_jh) * scale (+ edge_bias_ijh)``
2) softmax    ``alpha_ijh = exp(s_ijh) / sum_{j' -> i} exp(s_ij'h)`` over the incoming edges of i
3) aggregate  ``y_ih = sum_{j -> i} alpha_ijh v_jh``

A query with no incoming edge gets an exact zero row (DESIGN.md).

Three exact kernels, none of which copies features onto edges (no ``(E, H, D)``
tensor; extra memory is O(E H) + O(N H D)):

- ``"sdpa"``: :func:`torch.nn.functional.scaled_dot_product_attention` (its
  fused flash kernel when the weights are not requested) when the edge set is
  the complete graph or the causal DAG: a ``Pattern`` of kind
  ``"full"``/``"causal"`` (no edge is ever built), or an edge list that is
  exactly that set (detected in O(E) once per graph).
- ``"block"``: graphs whose edges fill at least ``MIN_FILL`` of the 64 x 64
  tiles they touch (windows, block-sparse patterns, causal with a bias). Per
  block of 64 queries, a row of ``nt`` key tiles is multiplied densely (GEMM),
  masked to the edges and normalised by one fused softmax, one head and one
  cache-sized chunk of query blocks at a time. Band structures (windows) read
  their key tiles as a strided view, others gather them.
- ``"csr"``: any graph (random, top-k, duplicate edges): edges sorted by
  target; scores by sampled dense-dense matmul (``torch.sparse.sampled_addmm``,
  one per head on strided views), the softmax over CSR segments, the
  aggregation as a CSR x dense matmul; backward with the transposed CSR.

``"block"`` and ``"csr"`` are :class:`torch.autograd.Function` objects with a
hand-written backward built from the same kernels; gradients equal the dense
oracle's (float64 gradcheck in ``tests/test_ops.py``). The sorted structure
(CSR, its transpose, the tile layout) is built once per graph and kept while
the ``edge_index`` tensor or pattern object lives (:func:`prepare`).
"""

from __future__ import annotations

import math
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from graphattn.graphs import check_edge_index

__all__ = ["attention", "prepare", "segment_softmax", "check_qkv", "check_edge_bias", "choose_impl", "IMPLS"]

IMPLS = ("auto", "sdpa", "block", "csr")
BLOCK = 64  # tile size of the "block" kernel (queries and keys)
MIN_FILL = 0.25  # "block" when edges fill at least this fraction of the padded tiles
TILE_FLOATS = 1 << 19  # scores per head and chunk in the block kernel (2 MiB in float32: about the L2 cache)


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
    if query.size(-1) == 0 or value.size(-1) == 0:
        raise ValueError(f"Expected at least one channel per head (got D = {query.size(-1)}, D_v = {value.size(-1)})")
    if query.shape[1:] != key.shape[1:]:
        raise ValueError(
            f"Expected 'query' (L, H, D) and 'key' (S, H, D) to agree on H and D "
            f"(got {tuple(query.shape)} and {tuple(key.shape)})"
        )


def check_edge_bias(edge_bias: Tensor | None, num_edges: int, heads: int, dtype=None) -> Tensor | None:
    """Validate ``edge_bias`` of shape ``(E,)`` or ``(E, H)``; return it as ``(E, H)`` or ``(E, 1)``."""
    if edge_bias is None:
        return None
    if not isinstance(edge_bias, Tensor) or not edge_bias.is_floating_point():
        got = edge_bias.dtype if isinstance(edge_bias, Tensor) else type(edge_bias).__name__
        raise TypeError(f"Expected 'edge_bias' to be a floating-point Tensor (got {got})")
    if dtype is not None and edge_bias.dtype != dtype:
        raise TypeError(f"Expected 'edge_bias' to have the features' dtype {dtype} (got {edge_bias.dtype})")
    if edge_bias.dim() == 1:
        edge_bias = edge_bias.unsqueeze(-1)  # (E, 1)
    if edge_bias.dim() != 2 or edge_bias.size(0) != num_edges or edge_bias.size(1) not in (1, heads):
        raise ValueError(
            f"Expected 'edge_bias' to have shape (E,) or (E, H) = ({num_edges},) or ({num_edges}, {heads}) "
            f"(got {tuple(edge_bias.shape)})"
        )
    if torch.isnan(edge_bias).any() or torch.isposinf(edge_bias).any():
        raise ValueError("Expected 'edge_bias' to hold no NaN or +inf (-inf is allowed and gives the edge weight 0)")
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
        src, dst = edge_index.long().clone()  # (E,), (E,) own copies: later edits of the caller's tensor
        self.L, self.S, self.E = L, S, src.numel()  # cannot reach the cached structure
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
        self._zeros = {}

    def zeros(self, dtype) -> Tensor:
        """(E,) zeros of ``dtype`` (the values of the sampling pattern), kept."""
        if dtype not in self._zeros:
            self._zeros[dtype] = torch.zeros(self.E, dtype=dtype, device=self.src.device)
        return self._zeros[dtype]

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
        if not hasattr(self, "_edge_set"):
            self._edge_set = self._find_edge_set()
        return self._edge_set

    def _find_edge_set(self) -> str | None:
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
    """For each block of ``B`` queries, ``nt`` key blocks (a "tile row" of ``nt * B`` keys).

    Two layouts. *Band*: query block b reads key blocks ``b + lo ... b + lo + nt - 1``
    (windows, causal), so its keys are one strided view of the padded keys, no
    copy. *Gather*: the key blocks its edges touch, listed in ``rows (nqb, nt * B)``
    (padded with a zero dummy block). ``blocked (nqb * B, nt * B)`` is True off
    the edges; ``flat (E,)`` is each sorted edge's place in the score plane
    ``(nqb * B, nt * B)`` of one head; ``chunks`` are ``(b0, b1, e0, e1)``: ranges
    of query blocks whose scores fit in cache, and their (contiguous) edges.
    """

    @staticmethod
    def build(graph: _Graph, B: int, min_fill: float):
        L, S, E = graph.L, graph.S, graph.E
        nqb, nkb = -(-L // B), -(-S // B)
        if E == 0 or graph.has_duplicates or nqb * nkb > max(4 * E, 1 << 20):
            return None
        src, dst = graph.src, graph.dst
        qb, kb = dst // B, src // B  # (E,), (E,)
        present = torch.zeros(nqb, nkb, dtype=torch.bool, device=src.device)
        present[qb, kb] = True  # (nqb, nkb) tiles that hold an edge
        nt_gather = int(present.sum(1).max())
        lo, hi = int((kb - qb).min()), int((kb - qb).max())
        self = _Tiles()
        self.band = hi - lo + 1 <= max(nt_gather + 1, int(1.1 * nt_gather))  # nearly as tight: no gather
        self.B, self.nqb, self.nkb = B, nqb, nkb
        self.nt = hi - lo + 1 if self.band else nt_gather
        self.fill = E / (nqb * B * self.nt * B)
        if self.fill < min_fill:
            return None
        self.pad_front = self.shift = 0
        if self.band:  # keys padded with -lo blocks in front: query block b starts at key block b + shift
            self.pad_front = max(0, -lo)
            self.shift = lo + self.pad_front
            self.key_blocks = max(self.pad_front + nkb, nqb + self.shift + self.nt - 1)
            slot = kb - qb - lo  # (E,)
        else:
            rank = present.cumsum(1) - 1  # (nqb, nkb) slot of a present tile in its row
            qbs, kbs = present.nonzero(as_tuple=True)  # (T,), (T,)
            kb_list = torch.full((nqb, self.nt), nkb, dtype=torch.long, device=src.device)  # nkb = dummy
            kb_list[qbs, rank[qbs, kbs]] = kbs
            self.rows = (kb_list.unsqueeze(-1) * B + torch.arange(B, device=src.device)).view(nqb, -1)
            self.key_blocks = nkb + 1
            slot = rank[qb, kb]  # (E,)
        ntb = self.nt * B
        self.flat = dst * ntb + slot * B + src % B  # (E,)
        self.blocked = torch.ones(nqb * B, ntb, dtype=torch.bool, device=src.device)
        self.blocked.view(-1)[self.flat] = False  # (nqb*B, nt*B)
        self.empty_rows = F.pad(graph.deg == 0, (0, nqb * B - L), value=True)  # (nqb*B,)
        self.has_empty = bool(self.empty_rows.any())
        step = max(1, min(nqb, TILE_FLOATS // (B * ntb)))  # query blocks per chunk: scores stay in cache
        crow = graph.crow.tolist()
        self.chunks = [(b0, min(nqb, b0 + step), crow[min(b0 * B, L)], crow[min(b0 * B + step * B, L)])
                       for b0 in range(0, nqb, step)]
        return self

    def pad_keys(self, x: Tensor) -> Tensor:
        """(S, H, d) -> (H, key_blocks * B, d), zero padded, in the row order this layout indexes."""
        out = x.new_empty(x.size(1), self.key_blocks * self.B, x.size(2))  # (H, rows, d)
        front = self.pad_front * self.B
        out[:, :front].zero_()
        out[:, front:front + x.size(0)] = x.transpose(0, 1)
        out[:, front + x.size(0):].zero_()
        return out

    def unpad_keys(self, x: Tensor, S: int) -> Tensor:
        """Inverse of :meth:`pad_keys`: (H, rows, d) -> (S, H, d)."""
        front = self.pad_front * self.B
        return x[:, front:front + S].transpose(0, 1)

    def keys(self, xh: Tensor, b0: int, b1: int) -> Tensor:
        """Key tile rows of query blocks ``[b0, b1)`` from one head's padded ``(rows, d)``: ``(c, nt*B, d)``."""
        B, ntb, d = self.B, self.nt * self.B, xh.size(1)
        if self.band:  # overlapping windows, a view
            return xh[(b0 + self.shift) * B:].as_strided((b1 - b0, ntb, d), (B * d, d, 1))
        return xh.index_select(0, self.rows[b0:b1].reshape(-1)).view(b1 - b0, ntb, d)

    def add_keys(self, dxh: Tensor, grad: Tensor, b0: int, b1: int) -> None:
        """Accumulate ``grad (c, nt*B, d)`` of :meth:`keys` into one head's ``dxh (rows, d)``."""
        B, nt, d = self.B, self.nt, dxh.size(1)
        if self.band:
            grad = grad.view(b1 - b0, nt, B, d)  # (c, nt, B, d)
            blocks = dxh.view(-1, B, d)  # (key_blocks, B, d)
            for t in range(nt):  # slot t of query block b is key block b + shift + t (padded numbering)
                blocks[b0 + self.shift + t:b1 + self.shift + t] += grad[:, t]
        else:
            dxh.index_add_(0, self.rows[b0:b1].reshape(-1), grad.view(-1, d))


_CACHE: dict[int, tuple] = {}  # id(edge_index or pattern) -> (weakref, key, graph)
CACHE_SIZE = 8


def _cached_graph(obj, key: tuple, build) -> _Graph:
    """The structure of ``obj`` (an edge_index tensor or a pattern), built once while ``obj`` lives.

    ``key`` holds what the structure depends on besides identity (sizes, device,
    and the tensor's version counter, which in-place edits bump).
    """
    entry = _CACHE.get(id(obj))
    if entry is not None and entry[0]() is obj and entry[1] == key:
        return entry[2]
    graph = build()
    oid = id(obj)

    def forget(ref, oid=oid):
        if _CACHE.get(oid, (None,))[0] is ref:
            del _CACHE[oid]

    _CACHE[oid] = (weakref.ref(obj, forget), key, graph)
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    return graph


def prepare(edge_index, num_targets: int, num_sources: int | None = None, device=None) -> _Graph:
    """Sort and index the edges once (CSR by target, tile layout) for :func:`attention`.

    :func:`attention` calls this itself and keeps the result while
    ``edge_index`` (tensor or pattern) lives and is not modified in place, so
    several layers on one graph pay for it once. Call it directly to time it.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E), or Pattern
    num_targets : int
        L, the number of queries.
    num_sources : int, optional
        S, the number of keys (default L).
    device : torch.device, optional
        Where a pattern's edges are built (default CPU).

    Returns
    -------
    graph
        An opaque structure; ``graph.E`` edges, ``graph.edge_set()`` in
        {"full", "causal", None}.
    """
    L = num_targets
    S = L if num_sources is None else num_sources
    if isinstance(edge_index, Tensor):
        def build():
            check_edge_index(edge_index, S, L)
            return _Graph(edge_index, L, S)

        if edge_index.is_inference():  # no version counter to notice in-place edits: build every time
            return build()
        key = (L, S, edge_index.device, tuple(edge_index.shape), edge_index.data_ptr(), edge_index._version)
        return _cached_graph(edge_index, key, build)
    if not _is_pattern(edge_index):
        raise TypeError(
            f"Expected 'edge_index' to be a LongTensor (2, E) or a graphattn.patterns.Pattern "
            f"(got {type(edge_index).__name__})"
        )
    pattern = edge_index
    return _cached_graph(pattern, (L, S, str(device), getattr(pattern, "name", None)),
                         lambda: _Graph(pattern.edge_index(L, S).to(device), L, S))


def _csr(crow: Tensor, col: Tensor, values: Tensor, size: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(crow, col, values, size, check_invariants=False)


def _sddmm(graph: _Graph, a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """``out[h, e] = alpha * a[i_e, h] · b[j_e, h]`` on the sorted edges; a (L, H, D), b (S, H, D) -> (H, E).

    One sampled dense-dense matmul per head on strided views (no copies).
    """
    H, E = a.size(1), graph.E
    out = a.new_empty(H, E)  # (H, E)
    if E == 0:
        return out
    if graph.has_duplicates:  # sampled_addmm wants each (i, j) once: bounded chunks of gathered rows instead
        step = max(1, TILE_FLOATS // max(1, H * a.size(2)))
        for e0 in range(0, E, step):
            dst, src = graph.dst[e0:e0 + step], graph.src[e0:e0 + step]
            prod = torch.einsum("ehd,ehd->he", a.index_select(0, dst), b.index_select(0, src))  # (H, chunk)
            out[:, e0:e0 + step] = prod.mul_(alpha)
        return out
    size = (graph.L, graph.S)
    pattern = _csr(graph.crow, graph.src, graph.zeros(a.dtype), size)  # zeros: beta * garbage could be NaN
    for h in range(H):  # written in place into out[h]
        torch.sparse.sampled_addmm(pattern, a[:, h], b[:, h].mT, beta=0.0, alpha=alpha,
                                   out=_csr(graph.crow, graph.src, out[h], size))  # (E,) per head
    return out


def _spmm(crow, col, values: Tensor, dense: Tensor, num_rows: int) -> Tensor:
    """``out[:, h] = A_h @ dense[:, h]``, ``A_h`` the CSR (num_rows, n) holding ``values[h]``; dense (n, H, d)."""
    n, H, d = dense.shape
    out = dense.new_empty(num_rows, H, d)  # (rows, H, d)
    if values.size(1) == 0:
        return out.zero_()
    for h in range(H):  # strided views in and out: no copies
        torch.mm(_csr(crow, col, values[h], (num_rows, n)), dense[:, h], out=out[:, h])  # (rows, d)
    return out


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


def _csr_backward(graph, q, k, v, alpha, keep, p, grad_out, grad_alpha, scale, q_scaled=False):
    """Gradients of the CSR kernel: ``dq, dk, dv`` (n, H, d) and ``d score`` (H, E).

    ``q, k, v`` are (n, H, d) (``q`` already multiplied by ``scale`` if ``q_scaled``);
    ``alpha`` (H, E) the weights before dropout, ``keep`` (H, E) the dropout mask or None.
    """
    if grad_out is None:
        grad_out = v.new_zeros(graph.L, v.size(1), v.size(2))
    grad_out = grad_out.contiguous()  # (L, H, D_v); sum().backward() hands in a stride-0 expansion
    g = _sddmm(graph, grad_out, v)  # (H, E) dL/d alpha_dropped
    if grad_alpha is not None:
        g = g + grad_alpha
    a_d = alpha
    if keep is not None:
        g = g * keep / (1.0 - p)  # (H, E) dL/d alpha
        a_d = alpha * keep / (1.0 - p)
    ds = _csr_softmax_backward(graph, g, alpha)  # (H, E) dL/d score
    dq = _spmm(graph.crow, graph.src, ds, k, graph.L).mul_(scale)  # (L, H, D)
    perm_t, crow_t, col_t = graph.transposed()
    dk = _spmm(crow_t, col_t, ds[:, perm_t], q, graph.S)  # (S, H, D)
    if not q_scaled:
        dk.mul_(scale)
    dv = _spmm(crow_t, col_t, a_d[:, perm_t], grad_out, graph.S)  # (S, H, D_v)
    return dq, dk, dv, ds


class _CSRAttention(torch.autograd.Function):
    """Attention on the CSR kernel; returns ``out (L, H, D_v)`` and ``alpha (H, E)`` in sorted edge order."""

    @staticmethod
    def forward(ctx, query, key, value, bias, graph, scale, p):
        ctx.set_materialize_grads(False)
        score = _sddmm(graph, query, key, alpha=scale)  # (H, E)
        if bias is not None:
            score += bias.t()  # (H, E) + (H or 1, E)
        alpha = _csr_softmax(graph, score)  # (H, E)
        keep, alpha_d = None, alpha
        if p > 0.0:
            keep = torch.empty_like(alpha, dtype=torch.bool).bernoulli_(1.0 - p)  # (H, E)
            alpha_d = alpha * keep / (1.0 - p)
        out = _spmm(graph.crow, graph.src, alpha_d, value, graph.L)  # (L, H, D_v)
        ctx.save_for_backward(query, key, value, alpha, keep)
        ctx.graph, ctx.scale, ctx.p, ctx.bias_heads = graph, scale, p, None if bias is None else bias.size(1)
        return out, alpha_d  # (L, H, D_v), (H, E)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_alpha):
        q, k, v, alpha, keep = ctx.saved_tensors
        dq, dk, dv, ds = _csr_backward(ctx.graph, q, k, v, alpha, keep, ctx.p, grad_out, grad_alpha, ctx.scale)
        dbias = None
        if ctx.bias_heads is not None and ctx.needs_input_grad[3]:
            dbias = ds.t() if ctx.bias_heads > 1 else ds.sum(0).unsqueeze(-1)  # (E, H) or (E, 1)
        return dq, dk, dv, dbias, None, None, None


# ------------------------------------------------------------------------------------------------
# the block kernel: dense tiles (GEMM) masked to the edges, one fused softmax per block row


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    """(n, H, d) -> (rows, H, d) with zero rows after n; ``x`` itself when n == rows (no copy)."""
    return x if x.size(0) == rows else F.pad(x, (0, 0, 0, 0, 0, rows - x.size(0)))


def _head_rows(x: Tensor, h: int, r0: int, r1: int, B: int) -> Tensor:
    """Rows ``[r0, r1)`` of head h of a node-major ``(rows, H, d)`` tensor as ``(c, B, d)``, a strided view."""
    return x[r0:r1, h].unflatten(0, (-1, B))  # (c, B, d), row stride H * d


class _BlockAttention(torch.autograd.Function):
    """Attention on the block kernel; same contract as :class:`_CSRAttention`.

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
        flats = [tiles.flat[e0:e1] - b0 * B * ntb if need_weights or bias is not None else None
                 for b0, b1, e0, e1 in tiles.chunks]  # (E_c,) each, in a chunk's (c*B, nt*B) plane
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
                if probs is None:
                    prob = torch.softmax(s_c.view(r1 - r0, ntb), -1)  # (c*B, nt*B), fused; 0 off the edges
                else:
                    prob = torch._softmax(s_c.view(r1 - r0, ntb), -1, False, out=probs[h, r0:r1])
                if tiles.has_empty:  # a row without edges is all -inf: NaN -> exact 0
                    prob.masked_fill_(tiles.empty_rows[r0:r1].unsqueeze(-1), 0.0)
                if keeps is not None:
                    keep = keeps[h, r0:r1].bernoulli_(1.0 - p)  # (c*B, nt*B)
                    prob = prob * keep / (1.0 - p)
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
        if not _finite(grad_out):  # 0 * inf off the edges would poison: go exact
            return _BlockAttention._backward_csr(ctx, grad_out, grad_alpha)
        gp = _pad_rows(grad_out.contiguous(), tiles.nqb * B)  # (nqb*B, H, D_v)
        dq, dk, dv = torch.empty_like(qp), torch.zeros_like(kh), torch.zeros_like(vh)
        ds_edges = qp.new_empty(H, graph.E) if ctx.bias_heads is not None else None  # (H, E)
        flats = [tiles.flat[e0:e1] - b0 * B * ntb if grad_alpha is not None or ds_edges is not None else None
                 for b0, b1, e0, e1 in tiles.chunks]  # (E_c,) each
        for h in range(H):
            for (b0, b1, e0, e1), flat in zip(tiles.chunks, flats):
                r0, r1 = b0 * B, b1 * B
                q_c, g_c = _head_rows(qp, h, r0, r1, B), _head_rows(gp, h, r0, r1, B)  # (c, B, d)
                k_c, v_c = tiles.keys(kh[h], b0, b1), tiles.keys(vh[h], b0, b1)  # (c, nt*B, d)
                prob = probs[h, r0:r1].view(-1, B, ntb)  # (c, B, nt*B)
                d_prob = torch.bmm(g_c, v_c.mT)  # (c, B, D_v) @ (c, D_v, nt*B): dL/d prob_dropped
                if grad_alpha is not None:
                    d_prob.view(-1).index_add_(0, flat, grad_alpha[h, e0:e1])
                prob_d = prob
                if keeps is not None:
                    keep = keeps[h, r0:r1].view(-1, B, ntb)
                    d_prob = d_prob * keep / (1.0 - p)
                    prob_d = prob * keep / (1.0 - p)
                ds = torch._softmax_backward_data(d_prob, prob, -1, prob.dtype)  # (c, B, nt*B): dL/d score
                _head_rows(dq, h, r0, r1, B).baddbmm_(ds, k_c, beta=0.0, alpha=scale)  # (c, B, D)
                tiles.add_keys(dk[h], torch.bmm(ds.mT, q_c).mul_(scale), b0, b1)  # (c, nt*B, D)
                tiles.add_keys(dv[h], torch.bmm(prob_d.mT, g_c), b0, b1)  # (c, nt*B, D_v)
                if ds_edges is not None:
                    ds_edges[h, e0:e1] = ds.view(-1).index_select(0, flat)  # (E_c,)
        dbias = None
        if ds_edges is not None and ctx.needs_input_grad[3]:
            dbias = ds_edges.t() if ctx.bias_heads > 1 else ds_edges.sum(0).unsqueeze(-1)
        return dq[:L], tiles.unpad_keys(dk, S), tiles.unpad_keys(dv, S), dbias, None, None, None, None, None

    @staticmethod
    def _backward_csr(ctx, grad_out, grad_alpha):
        """Exact backward on the CSR kernel (used when ``grad_out`` is not finite)."""
        qp, kh, vh, probs, keeps = ctx.saved_tensors
        graph, tiles, L, S, p = ctx.graph, ctx.tiles, ctx.graph.L, ctx.graph.S, ctx.p
        H = qp.size(1)
        alpha = probs.view(H, -1).index_select(1, tiles.flat)  # (H, E)
        keep = None if keeps is None else keeps.view(H, -1).index_select(1, tiles.flat)  # (H, E)
        dq, dk, dv, ds = _csr_backward(graph, qp[:L], tiles.unpad_keys(kh, S), tiles.unpad_keys(vh, S),
                                       alpha, keep, p, grad_out, grad_alpha, ctx.scale)
        dbias = None
        if ctx.bias_heads is not None and ctx.needs_input_grad[3]:
            dbias = ds.t() if ctx.bias_heads > 1 else ds.sum(0).unsqueeze(-1)
        return dq, dk, dv, dbias, None, None, None, None, None


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
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))  # (1, H, n, d): 4-D takes flash
    causal = kind == "causal"
    if not need_weights:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, scale=scale)  # (1, H, L, D_v)
        return out[0].transpose(0, 1), None  # (L, H, D_v), a view: no copy of the output
    scores = (q * scale) @ k.mT  # (1, H, L, D) @ (1, H, D, S) -> (1, H, L, S)
    mask = None
    if causal:
        mask = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()  # (L, S), top-left aligned
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)[0]  # (H, L, S)
    if p > 0.0:
        weights = F.dropout(weights, p=p)
    out = weights @ v[0]  # (H, L, S) @ (H, S, D_v) -> (H, L, D_v)
    alpha = weights.permute(1, 2, 0)  # (L, S, H)
    alpha = alpha.reshape(L * S, -1) if mask is None else alpha[mask]  # (E, H), row-major = sorted
    return out.transpose(0, 1).contiguous(), alpha


def _run_sdpa(query, key, value, kind, scale, p, need_weights, guards):
    """:func:`_sdpa` with alpha as (H, E) (or None), guarded against non-finite features for "causal"."""
    def kernel(q, k, v, bias):
        out, alpha = _sdpa(q, k, v, kind, scale, p, need_weights)
        return out, (q.new_empty(q.size(1), 0) if alpha is None else alpha.t())  # (L, H, D_v), (H, E)

    if guards is None:  # the complete graph: every query reads every node, nothing can leak
        out, alpha = kernel(query, key, value, None)
    else:
        out, alpha = _guarded(kernel, query, key, value, *guards, None, scale, p)
    return out, alpha if need_weights else None


# ------------------------------------------------------------------------------------------------
# dispatch


def _is_pattern(obj) -> bool:
    return hasattr(obj, "edge_index") and hasattr(obj, "kind") and callable(obj.edge_index)


def choose_impl(graph: _Graph, query: Tensor, key: Tensor, value: Tensor, edge_bias: Tensor | None = None,
                impl: str = "auto") -> str:
    """The kernel ``attention`` runs for these inputs: ``"sdpa"``, ``"block"`` or ``"csr"``.

    Rules, in order (``impl="auto"``):

    1. ``"sdpa"`` when there is no ``edge_bias`` and the edges are exactly the
       complete graph or exactly the causal DAG (top-left aligned).
    2. ``"block"`` when the edges have no duplicates, fill at least
       ``MIN_FILL`` of the padded ``BLOCK x BLOCK`` tiles, and ``edge_bias``
       has no ``-inf`` (a query whose edges are all removed would be 0 / 0).
    3. ``"csr"`` otherwise (exact for every input).

    A forced ``impl`` skips the cost rule of "block" but not its exactness rules.
    Non-finite features do not change the choice: "sdpa" and "block" then run
    on finite copies and the queries that read a non-finite node are redone
    exactly on "csr" (see :func:`attention`, Notes).
    """
    if impl in ("auto", "sdpa") and edge_bias is None and graph.edge_set() is not None:
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
    return "csr" if edge_bias is not None and bool(torch.isneginf(edge_bias).any()) else "block"


def _bad_rows(x: Tensor) -> Tensor:
    """(n, H, d) -> (n,) True where a row holds NaN or inf."""
    return ~torch.isfinite(x).flatten(1).all(1)


def _guarded(kernel, query, key, value, readers, sub_edges, bias, scale, p):
    """``kernel(q, k, v, bias) -> (out (L, H, D_v), alpha (H, E) sorted)``, exact for non-finite features.

    The dense kernels multiply zero weights (non-edges) by every key and value
    of a tile, so a NaN or inf there would reach queries that never read it.
    With non-finite features they run on finite copies (NaN/inf -> 0), and the
    queries that hold or read a non-finite row (``readers(bad_kv (S,)) -> (L,)``)
    are recomputed from the original features on the CSR kernel, over their
    own edges (``sub_edges(affected) -> (edge_index (2, E'), positions (E',))``,
    positions in sorted edge order). Every other query's output is bitwise
    what it would be with any finite values in place of the bad ones.
    """
    if _finite(query, key, value):
        return kernel(query, key, value, bias)
    affected = _bad_rows(query) | readers(_bad_rows(key) | _bad_rows(value))  # (L,)
    finite = [torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0) for t in (query, key, value)]
    out, alpha = kernel(*finite, bias)  # (L, H, D_v), (H, E)
    sub_index, positions = sub_edges(affected)  # (2, E'), (E',)
    sub = _Graph(sub_index, query.size(0), key.size(0))
    fix_out, fix_alpha = _CSRAttention.apply(query, key, value, None if bias is None else bias[positions],
                                             sub, scale, p)  # (L, H, D_v), (H, E')
    out = torch.where(affected[:, None, None], fix_out, out)  # (L, H, D_v)
    if alpha.size(1):
        alpha = alpha.index_copy(1, positions, fix_alpha)  # (H, E)
    return out, alpha


def _graph_guards(graph: _Graph):
    """``readers`` and ``sub_edges`` of :func:`_guarded` for an edge list."""
    def readers(bad_kv):
        return torch.zeros(graph.L, dtype=torch.bool, device=bad_kv.device).index_fill_(
            0, graph.dst[bad_kv[graph.src]], True)  # (L,)

    def sub_edges(affected):
        positions = affected[graph.dst].nonzero().squeeze(1)  # (E',)
        return torch.stack([graph.src[positions], graph.dst[positions]]), positions

    return readers, sub_edges


def _causal_guards(L: int, S: int, device):
    """``readers`` and ``sub_edges`` of :func:`_guarded` for the causal DAG (j <= i), edges never built."""
    counts = (torch.arange(L, device=device) + 1).clamp(max=S)  # (L,) keys of query i
    starts = counts.cumsum(0) - counts  # (L,) first edge of query i in sorted order

    def readers(bad_kv):
        first = bad_kv.nonzero()
        return torch.arange(L, device=device) >= (first[0, 0] if first.numel() else L)  # (L,)

    def sub_edges(affected):
        rows = affected.nonzero().squeeze(1)  # (R,)
        dst = torch.repeat_interleave(rows, counts[rows])  # (E',)
        offset = torch.arange(dst.numel(), device=device) - (counts[rows].cumsum(0) - counts[rows]).repeat_interleave(
            counts[rows])  # (E',) key j = position within the row
        return torch.stack([offset, dst]), starts[dst] + offset

    return readers, sub_edges


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
    The kernel is chosen by :func:`choose_impl`; the edges' structure is built
    once per ``edge_index`` object (:func:`prepare`).

    NaN or inf in the features of a node that query i does not read never
    reaches query i's output: the dense kernels ("sdpa" for the causal DAG,
    "block") multiply zero weights by every key and value of a tile, so with
    non-finite features they run on finite copies and the queries that read
    a non-finite node are recomputed exactly on "csr"; every other output row
    is bitwise what it is with finite values there. (SDPA's own backward may
    still spread a NaN in ``dL/d output`` of a causal query to later keys.)

    Dropout draws its mask differently on each kernel (same distribution, not
    the same bits); with ``need_weights=False`` on "sdpa" the mask is SDPA's.

    A ``-inf`` in ``edge_bias`` gives the edge weight exactly 0 but keeps it in
    the graph, so a NaN/inf in that key's value still reaches the output
    (0 * NaN), as with SDPA's additive float masks; to remove an edge, leave it
    out of ``edge_index``. The "block" and "csr" kernels are differentiable
    once (no double backward, e.g. gradient penalties: use
    ``AttentionConv(impl="message_passing")``). float16/bfloat16 run in
    float32 on "csr" (PyTorch's CPU sparse kernels lack half types).
    The structure cache notices in-place edits of ``edge_index`` through its
    version counter; edits that bypass it (``.data``, a shared NumPy array)
    are not seen: pass a new tensor. Patterns are treated as immutable.
    With ``need_weights=False`` the "sdpa" output may be a non-contiguous view.

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
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"Expected 'dropout' to be a number in [0, 1) (got {dropout!r})")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"Expected 'scale' to be a finite number (got {scale!r})")
    if impl not in IMPLS:
        raise ValueError(f"Expected 'impl' to be one of {IMPLS} (got {impl!r})")
    L, H, D = query.shape
    S = key.size(0)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    p = dropout if training else 0.0
    if not isinstance(edge_index, Tensor) and _is_pattern(edge_index):
        kind = edge_index.kind
        if edge_bias is None and impl in ("auto", "sdpa") and L > 0 and S > 0 and kind in ("full", "causal"):
            out, alpha = _run_sdpa(query, key, value, kind, scale, p, need_weights,
                                   _causal_guards(L, S, query.device) if kind == "causal" else None)
            return out, None if alpha is None else alpha.t()
    graph = prepare(edge_index, L, S, device=query.device)
    edge_bias = check_edge_bias(edge_bias, graph.E, H, dtype=query.dtype)
    chosen = choose_impl(graph, query, key, value, edge_bias, impl)
    if chosen == "sdpa":
        kind = graph.edge_set()
        out, alpha = _run_sdpa(query, key, value, kind, scale, p, need_weights,
                               _graph_guards(graph) if kind == "causal" else None)
        return out, None if alpha is None else graph.unsort(alpha.t())
    bias = None if edge_bias is None else graph.sort(edge_bias)  # (E, H) or (E, 1)
    if chosen == "block":
        tiles = graph.tiles(min_fill=0.0) if impl == "block" else graph.tiles()

        def kernel(q, k, v, b):
            return _BlockAttention.apply(q, k, v, b, graph, tiles, scale, p, need_weights)

        out, alpha = _guarded(kernel, query, key, value, *_graph_guards(graph), bias, scale, p)
    elif query.dtype in (torch.float16, torch.bfloat16):  # CPU sparse kernels lack half types: float32 inside
        f32 = [None if t is None else t.float() for t in (query, key, value, bias)]
        out, alpha = (t.to(query.dtype) for t in _CSRAttention.apply(*f32, graph, scale, p))
    else:
        out, alpha = _CSRAttention.apply(query, key, value, bias, graph, scale, p)
    return out, graph.unsort(alpha.t()) if need_weights else None  # (L, H, D_v), (E, H)
