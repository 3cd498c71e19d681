"""Transformers attention masks as one disjoint graph per batch (used by :mod:`graphattn.interop.hf`).

A padded batch of B sequences, L queries and S keys each, becomes one graph:
query i of sequence b is node ``b * L + i``, key j is node ``b * S + j``, and
an edge ``(j, i)`` exists where the mask allows it. A token that no query may
read (padding) is an absent node: its own query row loses its edges too, so its
output is exactly 0. Sparsity (a Pattern in each sequence's token positions,
or a bool mask, possibly per head) can only remove edges. Per-head edge sets
share one graph, the union, with ``edge_bias = -inf`` on the heads that lack
an edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["BatchGraph", "graph_from_mask", "base_graph", "sparse_graph", "is_pattern"]


@dataclass(eq=False)
class BatchGraph:
    """One layer's attention graph over a padded batch, flattened to nodes.

    Query i of sequence b is node ``b * L + i``; key j is node ``b * S + j``.
    ``edge_index`` (2, E) is sorted by sequence, query, key. ``allowed``
    (B, Hm, L, S) is the same edge set as a mask (Hm = 1 or H), ``bias`` the
    additive per-edge mask values or None, ``edge_bias`` (E, Hm) what
    ``ops.attention`` gets (-inf where a head lacks an edge of the union).
    """

    edge_index: Tensor
    edge_bias: Tensor | None
    allowed: Tensor
    bias: Tensor | None
    shape: tuple[int, int, int]  # (B, L, S)
    derived: dict = field(default_factory=dict)  # per-graph cache, e.g. pattern masks

    def positions(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(b, i, j)`` of every edge: sequence, query position, key position, each (E,)."""
        _, num_q, num_k = self.shape
        src, dst = self.edge_index
        return dst // num_q, dst % num_q, src % num_k

    def dense(self, alpha: Tensor) -> Tensor:
        """Scatter ``alpha (E, H)`` to dense weights ``(B, H, L, S)``, zero off the edges."""
        b, i, j = self.positions()
        dense = alpha.new_zeros(*self.shape, alpha.size(1))  # (B, L, S, H)
        dense[b, i, j] = alpha
        return dense.permute(0, 3, 1, 2)  # (B, H, L, S)


def graph_from_mask(allowed: Tensor, bias: Tensor | None, drop_absent: bool) -> BatchGraph:
    """Edges of ``allowed (B, Hm, L, S)``; with ``drop_absent``, a key no query reads loses its query row too."""
    num_b, num_m, num_q, num_k = allowed.shape
    union = allowed.any(dim=1)  # (B, L, S)
    if drop_absent and num_q == num_k:
        present = union.any(dim=1)  # (B, S): some query reads token j
        union = union & present.unsqueeze(-1)  # (B, L, S): absent tokens ask nothing either
        allowed = allowed & union.unsqueeze(1)  # (B, Hm, L, S)
    b, i, j = union.nonzero(as_tuple=True)  # (E,) each, sorted by (b, i, j)
    edge_index = torch.stack([b * num_k + j, b * num_q + i])  # (2, E)
    edge_bias = None
    if bias is not None or num_m > 1:
        edge_bias = bias[b, :, i, j] if bias is not None else torch.zeros(b.numel(), 1, device=b.device)  # (E, 1|Hm)
        if num_m > 1:  # (E, Hm): -inf removes the edge from the heads that lack it
            edge_bias = edge_bias.expand(-1, num_m).masked_fill(~allowed[b, :, i, j], float("-inf"))
    return BatchGraph(edge_index, edge_bias, allowed, bias, (num_b, num_q, num_k))


_CACHE: dict = {}  # key -> (mask, graph); the mask is held so that its id stays unique
_CACHE_SIZE = 4  # self- and cross-attention masks of one forward pass fit


def base_graph(attention_mask: Tensor | None, num_b: int, num_q: int, num_k: int, causal: bool,
               device, self_attention: bool = True) -> BatchGraph:
    """The graph of a transformers mask, cached on the mask object (shared by all layers of a forward).

    With ``self_attention`` (queries and keys are the same tokens), a token that
    no query may read is padding: its query row loses its edges too.
    """
    key = (num_b, num_q, num_k, causal, str(device), self_attention,
           None if attention_mask is None else id(attention_mask))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is attention_mask:
        return hit[1]
    drop = self_attention
    if attention_mask is None:  # SDPA semantics: causal (upper-left, j <= i) or complete
        q = torch.arange(num_q, device=device).unsqueeze(1)  # (L, 1)
        kv = torch.arange(num_k, device=device).unsqueeze(0)  # (1, S)
        allowed = (kv <= q) if causal else torch.ones(num_q, num_k, dtype=torch.bool, device=device)  # (L, S)
        graph = graph_from_mask(allowed.expand(num_b, 1, num_q, num_k), None, drop_absent=False)
    elif attention_mask.dim() != 4 or attention_mask.size(-2) != num_q or attention_mask.size(-1) != num_k:
        raise ValueError(f"Expected 'attention_mask' to have shape (B, 1 or H, {num_q}, {num_k}) "
                         f"(got {tuple(attention_mask.shape)})")
    elif attention_mask.dtype == torch.bool:  # True = may attend
        graph = graph_from_mask(attention_mask.expand(num_b, -1, -1, -1), None, drop_absent=drop)
    else:  # additive: finfo.min or -inf blocks, other values are a bias on the edge
        mask = attention_mask.expand(num_b, -1, -1, -1)  # (B, Hm, L, S)
        allowed = mask > torch.finfo(mask.dtype).min / 2  # (B, Hm, L, S)
        bias = mask if bool((mask.masked_fill(~allowed, 0) != 0).any()) else None
        graph = graph_from_mask(allowed, bias, drop_absent=drop)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))  # the oldest entry
    _CACHE[key] = (attention_mask, graph)
    return graph


def is_pattern(obj) -> bool:
    return hasattr(obj, "edge_index") and hasattr(obj, "mask") and not isinstance(obj, Tensor)


def pattern_mask(pattern, graph: BatchGraph) -> Tensor:
    """``pattern`` in each sequence's own token positions (padding skipped), as a (B, 1, L, S) mask."""
    if pattern in graph.derived:
        return graph.derived[pattern]
    num_b, num_q, num_k = graph.shape
    if num_q != num_k:
        raise NotImplementedError(f"A Pattern needs self-attention, L == S (got L={num_q}, S={num_k})")
    present = graph.allowed.any(dim=1).any(dim=1)  # (B, S): tokens that exist
    out = torch.zeros(num_b, 1, num_q, num_k, dtype=torch.bool, device=present.device)  # (B, 1, L, S)
    cache: dict[int, Tensor] = {}
    for b in range(num_b):
        idx = present[b].nonzero().squeeze(1)  # (n,) padded positions of the n tokens
        n = idx.numel()
        if n not in cache:
            cache[n] = pattern.mask(n).to(present.device)  # (n, n)
        out[b, 0, idx.unsqueeze(1), idx.unsqueeze(0)] = cache[n]
    graph.derived[pattern] = out
    return out


def sparse_graph(graph: BatchGraph, spec, layer: int, query: Tensor, key: Tensor) -> BatchGraph:
    """Intersect ``graph`` with what the sparsity ``spec`` allows in ``layer``."""
    num_b, num_q, num_k = graph.shape
    heads = query.size(1)
    result = spec if is_pattern(spec) else spec(layer, query, key, graph.allowed.any(dim=1))
    if result is None:
        return graph
    if is_pattern(result):
        keep = pattern_mask(result, graph)  # (B, 1, L, S)
    elif isinstance(result, Tensor) and result.dtype == torch.bool and result.dim() in (2, 4):
        keep = result if result.dim() == 4 else result[None, None]  # (B or 1, H or 1, L, S)
        if keep.shape[-2:] != (num_q, num_k) or keep.size(0) not in (1, num_b) or keep.size(1) not in (1, heads):
            raise ValueError(f"Expected the sparsity mask to have shape (L, S) or (B or 1, H or 1, L, S) with "
                             f"B={num_b}, H={heads}, L={num_q}, S={num_k} (got {tuple(result.shape)})")
    else:
        got = f"Tensor of {result.dtype}, shape {tuple(result.shape)}" if isinstance(result, Tensor) else \
            type(result).__name__
        raise TypeError("Expected the sparsity function to return None, a Pattern or a bool mask (L, S) or "
                        f"(B, H, L, S), True = may attend (got {got})")
    allowed = graph.allowed & keep.to(graph.allowed.device)  # (B, Hm, L, S)
    return graph_from_mask(allowed, graph.bias, drop_absent=False)
