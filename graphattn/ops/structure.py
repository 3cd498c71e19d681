"""The sorted structure of a graph: CSR by target, its transpose, the tile layout, and their cache.

Built once per graph (:func:`prepare`) and kept in the one content-verified
cache of :mod:`graphattn.cache`; safe under concurrent use (the cache's lock
around lookup, insert and eviction, and ``_LOCK`` around the lazily built
parts of a graph).
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn import _compat
from graphattn.cache import ContentCache
from graphattn.graphs import check_edge_index
from graphattn.patterns import is_pattern
from graphattn.validate import check_int, message

BLOCK = 64  # tile size of the "block" kernel (queries and keys)
MIN_FILL = 0.25  # "block" when edges fill at least this fraction of the padded tiles
TILE_FLOATS = 1 << 19  # scores per head and chunk in the block kernel (2 MiB in float32: about the L2 cache)
HEAD_BLOCK_ENTRIES = 1 << 24  # graphs with H E up to this keep their block-diagonal CSR indices (64 MiB in int32)
CACHE_SIZE = 8  # default number of graphs the structure cache keeps (see set_cache_size)

_LOCK = threading.RLock()  # guards every graph's lazily built parts


class _Graph:
    """Edges sorted by (target, source) as CSR; the transpose and the tile layout on demand.

    ``kept``: the caller's edges the graph holds (``(E,)`` positions in ``edge_index``, ascending), or
    None for all of them. The others (GAT's own loops, see :func:`prepare`) are not in the structure:
    per-edge rows in the caller's order get weight 0 there (:meth:`unsort`, :meth:`pad`).
    """

    def __init__(self, edge_index: Tensor, num_targets: int, num_sources: int, kept: Tensor | None = None):
        L, S = num_targets, num_sources
        src, dst = edge_index.long().clone()  # (E_in,), (E_in,) own copies: later edits of the caller's tensor
        self.E_in = src.numel()  # the caller's edges, those left out included (cannot reach the cached structure)
        if kept is not None:
            src, dst = src[kept], dst[kept]  # (E,), (E,)
        self.L, self.S, self.E = L, S, src.numel()
        key = dst * S + src  # (E,) row-major position in the (L, S) grid
        self.perm = kept  # sorted = caller[perm]; None when the caller's order is already sorted and complete
        if self.E > 1 and not bool((key[1:] >= key[:-1]).all()):
            key, order = torch.sort(key, stable=True)  # (E,), (E,)
            src, dst = src[order], dst[order]  # (E,), (E,)
            self.perm = order if kept is None else kept[order]  # (E,) places in the caller's edge list
        self.src, self.dst = src, dst
        self.has_duplicates = self.E > 1 and bool((key[1:] == key[:-1]).any())
        self.deg = torch.bincount(dst, minlength=L)  # (L,) in-degree of each query
        self.crow = F.pad(self.deg.cumsum(0), (1, 0))  # (L + 1,)
        k = self.E // L if L else 0
        self.uniform_degree = k if L and k * L == self.E and bool((self.deg == k).all()) else None
        self._edge_set = self._find_edge_set()
        self._transposed = self._distinct = self._inverse = None
        self._tiles, self._head_blocks = {}, {}

    def unsort(self, x: Tensor) -> Tensor:
        """Per-edge rows from sorted order back to the caller's order (a gather by the inverse permutation).

        ``(E, ...) -> (E_in, ...)``: the edges left out of the structure get zero rows.
        """
        if self.perm is None:
            return x
        with _LOCK:
            if self._inverse is None:
                perm = self.perm
                inverse = torch.zeros(self.E_in, dtype=perm.dtype, device=perm.device)  # a left-out edge reads row 0
                inverse.index_copy_(0, perm, torch.arange(self.E, device=perm.device))  # (E_in,) caller e -> sorted
                left_out = None
                if self.E_in > self.E:  # then zeroed: cheaper than gathering from a zero-padded copy of x
                    mask = torch.ones(self.E_in, dtype=torch.bool, device=perm.device)
                    left_out = mask.index_fill_(0, perm, False).nonzero().squeeze(1)  # (E_in - E,)
                self._inverse = (inverse, left_out)
        inverse, left_out = self._inverse
        out = x.index_select(0, inverse)  # (E_in, ...); index_select: 2-4x faster than x[idx] on the CPU
        return out if left_out is None else out.index_fill_(0, left_out, 0)

    def sort(self, x: Tensor) -> Tensor:
        """Per-edge rows from the caller's order to sorted order: ``(E_in, ...) -> (E, ...)``."""
        return x if self.perm is None else x.index_select(0, self.perm)  # (E, ...)

    def pad(self, x: Tensor) -> Tensor:
        """Sorted rows ``(E, ...)`` followed by zero rows for the edges left out: ``(E_in, ...)``."""
        rows = self.E_in - self.E
        return torch.cat([x, x.new_zeros((rows,) + tuple(x.shape[1:]))]) if rows else x

    def edge_set(self) -> str | None:
        """``"full"`` or ``"causal"`` if the edges are exactly that set (each once), else None."""
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
        with _LOCK:
            if self._transposed is None:
                _, perm_t = torch.sort(self.src, stable=True)  # (E,) by source, then target
                crow_t = F.pad(torch.bincount(self.src, minlength=self.S).cumsum(0), (1, 0))  # (S + 1,)
                self._transposed = (perm_t, crow_t, self.dst[perm_t])
            return self._transposed

    def distinct(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """The distinct (i, j) pairs as CSR for the kernels: ``(crow (L + 1,), col (U,), inverse (E,) or None)``.

        ``inverse[e]`` is edge e's pair; None (and the edges themselves) without
        duplicates. Indices in :func:`index_dtype` (int32 where they fit: PyTorch's
        CPU sparse kernels convert int64 indices on every call).
        """
        with _LOCK:
            if self._distinct is None:
                crow, col, inverse = self.crow, self.src, None
                if self.has_duplicates:
                    key, inverse = torch.unique_consecutive(
                        self.dst * self.S + self.src, return_inverse=True
                    )  # (U,), (E,) sorted keys
                    crow = F.pad(torch.bincount(key // self.S, minlength=self.L).cumsum(0), (1, 0))  # (L + 1,)
                    col = key % self.S  # (U,)
                dtype = index_dtype(self.E, self.L, self.S)
                self._distinct = (crow.to(dtype), col.to(dtype), inverse)
            return self._distinct

    def head_blocks(self, heads: int, transposed: bool = False) -> tuple[Tensor, Tensor]:
        """The H per-head CSR matrices as one block-diagonal CSR: ``(crow (H R + 1,), col (H E,))``.

        Block h holds the graph's (``transposed``: the transpose's) CSR in rows
        ``h R ... (h + 1) R - 1`` and columns ``h C ...``, R x C = L x S (S x L
        transposed); indices in :func:`index_dtype`. Kept for the last ``heads``
        asked while ``heads * E`` is at most ``HEAD_BLOCK_ENTRIES`` (else built per call).
        """
        key = (heads, transposed)
        with _LOCK:
            if key in self._head_blocks:
                return self._head_blocks[key]
        crow, col = self.transposed()[1:] if transposed else (self.crow, self.src)
        n = self.L if transposed else self.S
        dtype = index_dtype(heads * self.E, heads * self.L, heads * self.S)
        offsets = torch.arange(heads, device=col.device).unsqueeze(1)  # (H, 1)
        crow_h = torch.cat([(crow[:-1] + offsets * self.E).reshape(-1), crow[-1:] + (heads - 1) * self.E])  # (H R + 1,)
        col_h = (col + offsets * n).reshape(-1)  # (H E,) column j of block h is h n + j
        blocks = (crow_h.to(dtype), col_h.to(dtype))
        if heads * self.E <= HEAD_BLOCK_ENTRIES:
            with _LOCK:
                self._head_blocks = {k: v for k, v in self._head_blocks.items() if k[0] == heads}
                self._head_blocks[key] = blocks
        return blocks

    def tiles(self, block: int = BLOCK, min_fill: float = MIN_FILL):
        """Tile layout for the block kernel, or None when it does not pay (see :class:`_Tiles`)."""
        with _LOCK:
            if (block, min_fill) not in self._tiles:
                self._tiles[(block, min_fill)] = _Tiles.build(self, block, min_fill)
            return self._tiles[(block, min_fill)]


def index_dtype(*counts: int) -> torch.dtype:
    """int32 when every count (entries, rows, columns) fits in it, else int64: the kernels' sparse index type."""
    return torch.int32 if max(counts, default=0) < 2**31 - 1 else torch.int64


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
        self.chunks = [
            (b0, min(nqb, b0 + step), crow[min(b0 * B, L)], crow[min(b0 * B + step * B, L)])
            for b0 in range(0, nqb, step)
        ]
        return self

    def pad_keys(self, x: Tensor) -> Tensor:
        """(S, H, d) -> (H, key_blocks * B, d), zero padded, in the row order this layout indexes."""
        out = x.new_empty(x.size(1), self.key_blocks * self.B, x.size(2))  # (H, rows, d)
        front = self.pad_front * self.B
        out[:, :front].zero_()
        out[:, front : front + x.size(0)] = x.transpose(0, 1)
        out[:, front + x.size(0) :].zero_()
        return out

    def unpad_keys(self, x: Tensor, S: int) -> Tensor:
        """Inverse of :meth:`pad_keys`: (H, rows, d) -> (S, H, d)."""
        front = self.pad_front * self.B
        return x[:, front : front + S].transpose(0, 1)

    def keys(self, xh: Tensor, b0: int, b1: int) -> Tensor:
        """Key tile rows of query blocks ``[b0, b1)`` from one head's padded ``(rows, d)``: ``(c, nt*B, d)``."""
        B, ntb, d = self.B, self.nt * self.B, xh.size(1)
        if self.band:  # overlapping windows, a view
            return xh[(b0 + self.shift) * B :].as_strided((b1 - b0, ntb, d), (B * d, d, 1))
        return xh.index_select(0, self.rows[b0:b1].reshape(-1)).view(b1 - b0, ntb, d)

    def add_keys(self, dxh: Tensor, grad: Tensor, b0: int, b1: int) -> None:
        """Accumulate ``grad (c, nt*B, d)`` of :meth:`keys` into one head's ``dxh (rows, d)``."""
        B, nt, d = self.B, self.nt, dxh.size(1)
        if self.band:
            grad = grad.view(b1 - b0, nt, B, d)  # (c, nt, B, d)
            blocks = dxh.view(-1, B, d)  # (key_blocks, B, d)
            for t in range(nt):  # slot t of query block b is key block b + shift + t (padded numbering)
                blocks[b0 + self.shift + t : b1 + self.shift + t] += grad[:, t]
        else:
            dxh.index_add_(0, self.rows[b0:b1].reshape(-1), grad.view(-1, d))


# ------------------------------------------------------------------------------------------------
# the cache: one graphattn.cache.ContentCache, verified by content (a .data write is never served stale)

_CACHE = ContentCache("graphattn.ops structure cache", CACHE_SIZE, "graphattn.ops.set_cache_size(n)")
_PATTERN_EDGES = ContentCache("graphattn.ops pattern-edge cache", CACHE_SIZE, "graphattn.ops.set_cache_size(n)")


def set_cache_size(n: int) -> None:
    """Keep at most ``n`` graph structures (default ``CACHE_SIZE`` = 8); the least recently used go first.

    Raise it when a model attends over more distinct graphs per step than that
    (heterogeneous models: one graph per edge type); the cache warns once when
    it keeps rebuilding graphs it has just evicted. ``n = 0`` disables caching.

    Raises
    ------
    TypeError, ValueError
        ``n`` not a non-negative int.
    """
    n = check_int("n", n, low=0)
    _CACHE.resize(n)
    _PATTERN_EDGES.resize(n)


def cache_size() -> int:
    """The number of graph structures the cache keeps (see :func:`set_cache_size`)."""
    return _CACHE.size


@_compat.compiler_disable(  # a host-side step: under torch.compile a graph break
    "a pattern's edges are built and cached on the host; for fullgraph=True pass pattern.edge_index(L) "
    "(an edge list tensor) instead of the pattern"
)
def pattern_edges(pattern, num_targets: int, num_sources: int, device=None) -> Tensor:
    """``pattern.edge_index(L, S)`` on ``device``, built once per pattern object and sizes (patterns are immutable)."""
    L, S = num_targets, num_sources
    return _PATTERN_EDGES.get(
        ("pattern", L, S, str(device)), (), lambda: pattern.edge_index(L, S).to(device), owners=(pattern,)
    )


def prepare(edge_index, num_targets: int, num_sources: int | None = None, device=None, loops: int = 0) -> _Graph:
    """Sort and index the edges once (CSR by target, tile layout) for :func:`attention`.

    :func:`attention` calls this itself and keeps the result in one
    least-recently-used cache of :func:`cache_size` graphs, verified by
    content: several layers on one graph pay for it once, and a tensor edited
    in any way (in place, through ``.data`` or a NumPy view) is never served
    the old structure. Call it directly to time it. Safe to call from
    several threads at once.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E), or Pattern
    num_targets : int
        L, the number of queries.
    num_sources : int, optional
        S, the number of keys (default L).
    device : torch.device, optional
        Where a pattern's edges are built (default CPU).
    loops : int, default 0
        PyG's ``add_self_loops`` after ``remove_self_loops`` (GAT's self-loops),
        with the edge count known before the values: the graph's own loops
        ``(i, i)`` are left out of the structure and ``loops`` edges ``(i, i)``,
        ``i < loops``, follow ``edge_index``'s. Cached under ``edge_index``
        itself, so a model that appends them every step builds the structure
        once and never compares the indices again.

    Returns
    -------
    graph
        An opaque structure; ``graph.E`` edges, ``graph.edge_set()`` in
        {"full", "causal", None}.

    Raises
    ------
    TypeError
        ``edge_index`` neither a LongTensor nor a pattern.
    """
    L = num_targets
    S = L if num_sources is None else num_sources
    if isinstance(edge_index, Tensor):

        def build():
            check_edge_index(edge_index, S, L)
            if not loops:
                return _Graph(edge_index, L, S)
            if loops > min(L, S):
                raise ValueError(message("loops", f"at most min(S, L) = {min(L, S)}", loops))
            E, device = edge_index.size(1), edge_index.device
            loop = torch.arange(loops, device=device, dtype=edge_index.dtype)  # (N,)
            whole = torch.cat([edge_index, loop.expand(2, -1)], dim=1)  # (2, E + N)
            own = edge_index[0] == edge_index[1]  # (E,) the graph's own loops: left out
            if not bool(own.any()):
                return _Graph(whole, L, S)
            kept = torch.cat([(~own).nonzero().squeeze(1), torch.arange(E, E + loops, device=device)])  # (E' + N,)
            return _Graph(whole, L, S, kept)

        return _CACHE.get(("edges", L, S, loops), (edge_index,), build)
    if not is_pattern(edge_index):
        raise TypeError(
            message("edge_index", "a LongTensor (2, E) or a graphattn.patterns.Pattern", type(edge_index).__name__)
        )
    pattern = edge_index
    return prepare(pattern_edges(pattern, L, S, device), L, S)
