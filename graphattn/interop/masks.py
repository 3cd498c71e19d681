"""Transformers attention masks as one disjoint graph per batch (used by :mod:`graphattn.interop.hf`).

A padded batch of B sequences, L queries and S keys each, becomes one graph:
query i of sequence b is node ``b * L + i``, key j is node ``b * S + j``, and
an edge ``(j, i)`` exists where the mask allows it. Every conversion goes
through :mod:`graphattn.graphs` on the stacked layout, the B sequences one
under the other as a ``(B * L, S)`` mask (row ``b * L + i``, column j).

Padding comes from the model, never from the shape of a mask: the graph mask
builder (:func:`graphattn.interop.hf.graph_mask`) builds the 4-D mask from the
model's 2-D ``attention_mask`` and notes which tokens are real
(:func:`note_padding`). In self-attention a padding token is then an absent
node: no edge in either direction, so its output row is exactly 0. A 4-D mask
the caller built is taken as it is: a key that no query reads is a node
without out-edges, and its own query row keeps its edges. (A model that
slices the mask before its attention layers hands over a new tensor, whose
padding is then unknown: padding queries keep their edges, as in eager, which
changes nothing a real token sees.)

Sparsity (a Pattern in each sequence's own token positions, or a bool mask,
possibly per head) can only remove edges. Per-head edge sets share one graph,
the union, with ``edge_bias = -inf`` on the heads that lack an edge.

The graph of a mask is cached (all layers of a forward pass get the same
mask) in a :class:`graphattn.cache.ContentCache` looked up by the mask's
content, so a mask edited in place between two forward passes is never
served a stale graph. The cache and the padding notes are guarded by locks:
models may run in several threads.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor

from graphattn.cache import ContentCache
from graphattn.graphs import dense_to_edge_weights, edge_index_to_mask, edge_weights_to_dense, mask_to_edge_index
from graphattn.patterns import is_pattern
from graphattn.validate import check_int, message, shape_message

__all__ = [
    "BatchGraph",
    "graph_from_mask",
    "base_graph",
    "sparse_graph",
    "place",
    "note_padding",
    "clear_cache",
    "keep_graphs",
]


def _stacked(t: Tensor) -> Tensor:
    """``(B, Hm, L, S)`` -> ``(Hm, B * L, S)``: the sequences stacked along the queries."""
    num_b, num_m, num_q, num_k = t.shape
    return t.transpose(0, 1).reshape(num_m, num_b * num_q, num_k)  # (Hm, B*L, S)


def _rows(edge_index: Tensor, num_k: int) -> Tensor:
    """Batch edges ``(b*S + j, b*L + i)`` -> stacked-layout edges ``(j, b*L + i)``."""
    return torch.stack([edge_index[0] % num_k, edge_index[1]])  # (2, E)


@dataclass(eq=False)
class BatchGraph:
    """One layer's attention graph over a padded batch, flattened to nodes.

    Query i of sequence b is node ``b * L + i``; key j is node ``b * S + j``.
    ``edge_index`` (2, E) is sorted by sequence, query, key. ``allowed``
    (B, Hm, L, S) is the same edge set as a mask (Hm = 1 or H), ``bias`` the
    additive per-edge mask values or None, ``edge_bias`` (E, Hm) what
    ``ops.attention`` gets (-inf where a head lacks an edge of the union).
    ``valid`` (B, S) marks the real tokens when the model's padding is known
    (None: every position is a token).
    """

    edge_index: Tensor
    edge_bias: Tensor | None
    allowed: Tensor
    bias: Tensor | None
    shape: tuple[int, int, int]  # (B, L, S)
    valid: Tensor | None = None
    derived: dict = field(default_factory=dict)  # per-graph cache, e.g. pattern masks

    def positions(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(b, i, j)`` of every edge: sequence, query position, key position, each (E,)."""
        _, num_q, num_k = self.shape
        src, dst = self.edge_index
        return dst // num_q, dst % num_q, src % num_k

    def dense(self, alpha: Tensor) -> Tensor:
        """Scatter ``alpha (E, H)`` to dense weights ``(B, H, L, S)``, zero off the edges."""
        num_b, num_q, num_k = self.shape
        rows = _rows(self.edge_index, num_k)  # (2, E)
        dense = edge_weights_to_dense(rows, alpha, (num_k, num_b * num_q))  # (H, B*L, S)
        return dense.view(-1, num_b, num_q, num_k).transpose(0, 1)  # (B, H, L, S)


def graph_from_mask(allowed: Tensor, bias: Tensor | None, valid: Tensor | None = None) -> BatchGraph:
    """Edges of ``allowed (B, Hm, L, S)``; ``valid (B, S)`` (self-attention, L <= S: the queries are the last L
    keys, as with a KV cache) removes the padding nodes' edges.
    """
    num_b, num_m, num_q, num_k = allowed.shape
    if valid is not None:  # a padding token is an absent node: no edge in either direction
        queries = valid[:, num_k - num_q :]  # (B, L): query i is key position S - L + i
        allowed = allowed & (queries[:, None, :, None] & valid[:, None, None, :])  # (B, Hm, L, S)
    union = allowed.any(dim=1)  # (B, L, S)
    rows = mask_to_edge_index(union.reshape(num_b * num_q, num_k))  # (2, E): (j, b*L + i), sorted by (b, i, j)
    edge_index = torch.stack([rows[1] // num_q * num_k + rows[0], rows[1]])  # (2, E): (b*S + j, b*L + i)
    edge_bias = None
    if bias is not None or num_m > 1:
        edge_bias = (
            dense_to_edge_weights(_stacked(bias), rows)
            if bias is not None
            else torch.zeros(rows.size(1), 1, device=rows.device)
        )  # (E, 1 or Hm)
        if num_m > 1:  # (E, Hm): -inf removes the edge from the heads that lack it
            kept = dense_to_edge_weights(_stacked(allowed), rows)  # (E, Hm)
            edge_bias = edge_bias.expand(-1, num_m).masked_fill(~kept, float("-inf"))
    return BatchGraph(edge_index, edge_bias, allowed, bias, (num_b, num_q, num_k), valid)


# -- padding notes: which masks the graph mask builder made, and from which padding ---------------

_PADDING: dict[int, tuple[weakref.ref, Tensor]] = {}  # id(mask) -> (weak ref to the mask, valid (B, S))
_PADDING_LOCK = threading.RLock()  # re-entrant: a weakref callback may run while the lock is held


def note_padding(mask: Tensor, valid: Tensor) -> None:
    """Record that ``mask (B, 1, L, S)`` was built from the model's padding, ``valid (B, S)`` True = real token."""
    key = id(mask)

    def forget(ref: weakref.ref) -> None:
        with _PADDING_LOCK:
            if _PADDING.get(key, (None,))[0] is ref:
                del _PADDING[key]

    with _PADDING_LOCK:
        _PADDING[key] = (weakref.ref(mask, forget), valid)


def _padding_of(mask: Tensor) -> Tensor | None:
    with _PADDING_LOCK:
        entry = _PADDING.get(id(mask))
    return entry[1] if entry is not None and entry[0]() is mask else None


# -- the mask -> graph cache ------------------------------------------------------------------------

_CACHE = ContentCache(
    "graphattn.interop mask-graph cache", 4, "`with graphattn.interop.masks.keep_graphs(n):`", by_content=True
)  # 4: the self- and cross-attention masks of one forward pass fit


def clear_cache() -> None:
    """Forget every cached graph (they are rebuilt on the next forward pass)."""
    _CACHE.clear()


@contextlib.contextmanager
def keep_graphs(n: int):
    """Within the block, cache at least ``n`` mask graphs (then the size before).

    For a caller that cycles through ``n`` batches again and again (an
    experiment that runs the same texts once per pattern): each batch's graph is
    built once instead of once per pass, and the thrashing warning stays quiet.
    """
    check_int("n", n, low=0)
    before = _CACHE.size
    _CACHE.resize(max(before, n))
    try:
        yield
    finally:
        _CACHE.resize(before)


def base_graph(
    attention_mask: Tensor | None, num_b: int, num_q: int, num_k: int, causal: bool, device, self_attention: bool = True
) -> BatchGraph:
    """The graph of a transformers mask, cached on the mask's content (shared by all layers of a forward).

    With ``self_attention`` (queries and keys are the same tokens) and a mask
    built from the model's padding, padding tokens are absent nodes.
    """
    if attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[-2:] != (num_q, num_k)):
        raise ValueError(shape_message("attention_mask", f"(B, 1 or H, {num_q}, {num_k})", attention_mask.shape))
    cached = self_attention and num_q <= num_k  # L < S: the last L of S tokens (a KV cache)
    valid = _padding_of(attention_mask) if attention_mask is not None and cached else None
    key = (
        num_b,
        num_q,
        num_k,
        causal,
        str(device),
        self_attention,
        None if attention_mask is None else (tuple(attention_mask.shape), attention_mask.dtype),
    )
    tensors = tuple(t for t in (attention_mask, valid) if t is not None)
    key = key + (attention_mask is None, valid is None)  # which of the two the tensors are
    return _CACHE.get(key, tensors, lambda: _build(attention_mask, num_b, num_q, num_k, causal, device, valid))


def _build(
    attention_mask: Tensor | None, num_b: int, num_q: int, num_k: int, causal: bool, device, valid: Tensor | None
) -> BatchGraph:
    if attention_mask is None:  # SDPA semantics: causal (upper-left, j <= i) or complete
        q = torch.arange(num_q, device=device).unsqueeze(1)  # (L, 1)
        kv = torch.arange(num_k, device=device).unsqueeze(0)  # (1, S)
        allowed = (kv <= q) if causal else torch.ones(num_q, num_k, dtype=torch.bool, device=device)  # (L, S)
        return graph_from_mask(allowed.expand(num_b, 1, num_q, num_k), None)
    mask = attention_mask.expand(num_b, -1, -1, -1)  # (B, Hm, L, S)
    if mask.dtype == torch.bool:  # True = may attend
        return graph_from_mask(mask, None, valid)
    allowed = mask > torch.finfo(mask.dtype).min / 2  # additive: finfo.min or -inf blocks; (B, Hm, L, S)
    bias = mask if bool((mask.masked_fill(~allowed, 0) != 0).any()) else None  # other values bias the edge
    return graph_from_mask(allowed, bias, valid)


# -- sparsity ---------------------------------------------------------------------------------------


def pattern_mask(pattern, graph: BatchGraph) -> Tensor:
    """``pattern`` in each sequence's own token positions (padding skipped), as a (B, 1, L, S) mask.

    With L < S (a KV cache: ``generate(use_cache=True)``, a call on
    ``past_key_values``) the queries are the last L of the S tokens, so query i
    takes the pattern's row for key position S - L + i: the rows the same tokens
    get without the cache. The cache must hold every earlier token of the sequence.
    """
    if pattern in graph.derived:
        return graph.derived[pattern]
    num_b, num_q, num_k = graph.shape
    if num_q > num_k:
        raise NotImplementedError(
            message(
                "the attention",
                "self-attention whose L queries are the last L of its "
                "S keys (L <= S; with a KV cache L < S) for a Pattern",
                f"L={num_q}, S={num_k}",
            )
        )
    device = graph.allowed.device
    valid = graph.valid if graph.valid is not None else torch.ones(num_b, num_k, dtype=torch.bool, device=device)
    if num_q < num_k:
        if _depends_on_length(pattern):  # a cached key was computed under the draw for a shorter sequence
            raise NotImplementedError(
                message(
                    "spec",
                    "a pattern whose rows do not depend on the sequence length, with a KV cache",
                    f"{pattern.name}: its draws depend on (L, S), so the cached keys saw other edges than the same "
                    "tokens without the cache",
                    "generate with use_cache=False",
                )
            )
        out = _cached_rows(pattern, valid, num_q)  # (B, 1, L, S)
        graph.derived[pattern] = out
        return out
    out = place(valid, lambda n: edge_index_to_mask(pattern.edge_index(n), (n, n)), (1,))  # (B, 1, L, S)
    graph.derived[pattern] = out
    return out


def place(tokens: Tensor, mask_of, shape: tuple[int, ...] = ()) -> Tensor:
    """Masks over each sequence's own tokens, put at their padded positions: the one placement.

    Sequence b's tokens are the positions where ``tokens[b]`` is True, in
    order; ``mask_of(n)`` gives the mask over n tokens, shape ``(*shape, n, n)``
    (True = may attend), computed once per distinct n. Padding positions get
    no edge, so left and right padding place the same pattern.

    Parameters
    ----------
    tokens : Tensor, shape (B, S), dtype bool
        True = a real token of the sequence.
    mask_of : callable
        ``n -> Tensor (*shape, n, n)`` bool, on any device.
    shape : tuple of int, default ()
        The leading shape of each mask (``(H,)`` for one mask per head).

    Returns
    -------
    Tensor, dtype bool
        Shape ``(B, *shape, S, S)``, on ``tokens``' device.
    """
    num_b, num_k = tokens.shape
    out = torch.zeros(num_b, *shape, num_k, num_k, dtype=torch.bool, device=tokens.device)  # (B, *shape, S, S)
    built: dict[int, Tensor] = {}
    for b in range(num_b):
        where = tokens[b].nonzero().squeeze(1)  # (n,) padded position of each of the sequence's n tokens
        n = where.numel()
        if n == 0:
            continue
        if n not in built:
            built[n] = mask_of(n).to(tokens.device)  # (*shape, n, n)
        out[b][..., where.unsqueeze(1), where] = built[n]  # (*shape, n, n) into the padded positions
    return out


def _depends_on_length(pattern) -> bool:
    """Whether the pattern's edges depend on (L, S) (random draws): a ``_Sized`` pattern or a mix holding one."""
    from graphattn.patterns.base import _Bound, _Composite, _Sized  # the one place that knows (checked here)

    if isinstance(pattern, _Composite):
        return any(_depends_on_length(p) for p in pattern.parts)
    return isinstance(pattern, (_Sized, _Bound))


def _cached_rows(pattern, valid: Tensor, num_q: int) -> Tensor:
    """The pattern rows of the last ``num_q`` key positions of each sequence, from its rule (O(L S), never the
    n x n edges): ``valid (B, S)`` -> (B, 1, L, S).
    """
    num_b, num_k = valid.shape
    out = torch.zeros(num_b, 1, num_q, num_k, dtype=torch.bool, device=valid.device)  # (B, 1, L, S)
    for b in range(num_b):
        tokens = valid[b].nonzero().squeeze(1)  # (n,) padded position of each of the sequence's n tokens
        n = tokens.numel()
        if n == 0:
            continue
        q_tok = valid[b].cumsum(0)[num_k - num_q :] - 1  # (L,) token id of query i (key position S - L + i)
        q_real = valid[b, num_k - num_q :]  # (L,) padding queries are absent nodes
        kv_tok = torch.arange(n, device=valid.device)  # (n,)
        rows = pattern.bind(n, n).mask_mod(None, None, q_tok.clamp(min=0)[:, None], kv_tok[None, :])  # (L, n)
        out[b, 0][:, tokens] = rows.expand(num_q, n) & q_real[:, None]  # (L, n) into the padded key positions
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
            raise ValueError(
                shape_message(
                    "spec(...)",
                    f"(L, S) or (B or 1, H or 1, L, S) with B={num_b}, H={heads}, L={num_q}, S={num_k}",
                    result.shape,
                    "the mask the sparsity function returned",
                )
            )
    else:
        got = (
            f"Tensor of {result.dtype}, shape {tuple(result.shape)}"
            if isinstance(result, Tensor)
            else type(result).__name__
        )
        raise TypeError(
            message("spec(...)", "None, a Pattern or a bool mask (L, S) or (B, H, L, S), True = may attend", got)
        )
    allowed = graph.allowed & keep.to(graph.allowed.device)  # (B, Hm, L, S)
    return graph_from_mask(allowed, graph.bias, graph.valid)
