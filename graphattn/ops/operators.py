"""The kernels as ``torch.library`` operators (namespace ``graphattn``), with fake implementations and autograd.

``torch.compile`` and ``torch.export`` see one opaque operator per kernel call,
the way they see ``aten::_scaled_dot_product_flash_attention``: the fake
implementations give the output shapes from the input shapes alone, so
nothing data-dependent (sorting the edges, the kernel choice, the tile
layout, the non-finite guard, the structure cache) is traced, and the fast
path is what a compiled model runs.

- ``graphattn::attention(query, key, value, edge_index, edge_bias, scale,
  dropout, need_alpha, impl) -> (out (L, H, D_v), alpha (E, H), keep (E, H))``:
  the structure of ``edge_index`` (from the content-verified cache of
  :mod:`graphattn.ops.structure`), the kernel :func:`choose_impl` picks, the
  weights before dropout in the caller's edge order (``(0, H)`` unless
  ``need_alpha``) and dropout's keep mask (``(0, H)`` unless ``dropout > 0``
  and ``need_alpha``). Two trailing arguments: ``sorted_alpha`` (the weights
  in the structure's order) and ``loops`` (PyG's self-loops: the graph's own
  loops are left out of the structure, weight 0 and gradient 0, and the edges
  ``(i, i)``, ``i < loops``, follow ``edge_index``'s; the structure is cached
  under ``edge_index`` although the caller appends the loops on every call)
- ``graphattn::attention_backward(...) -> (dq, dk, dv, d_score (E, H))``: the
  hand-written backward of the same kernel, from the saved weights.
- ``graphattn::ragged_attention(query, key, value, batch, causal, scale,
  dropout, seed) -> out (N, H, D_v)`` and its backward: attention within each
  graph of a PyG batch (:mod:`graphattn.ops.ragged`); used under
  ``torch.compile`` (eager runs the same kernel under PyTorch's autograd). Its
  backward recomputes the probabilities (one more ``q k^T`` per call) and
  redraws dropout's mask from the forward's seed.
- ``graphattn::gatv2_score`` and its backward: GATv2's edge scores without an
  ``(E, H, C)`` tensor (registered by :mod:`graphattn.ops.additive`).

Second derivatives (``create_graph=True``: gradient penalties, MAML,
Hessian-vector products) are right: when the backward of
``graphattn::attention`` runs with grad mode on, it is computed with
differentiable PyTorch operations instead (the readable per-edge
formulation, the same segment softmax; O(E H D) memory), whose own backward
reaches ``alpha`` and through it this operator again, so every order is
exact. The ragged operator's backward refuses ``create_graph=True`` with an
error naming the way out.

Registering these operators at import is the one global effect of
``graphattn.ops``: it touches only the ``graphattn`` namespace (as
``torchvision`` registers ``torchvision::nms``) and is what lets
``torch.export`` programs name the operators.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.ops.block import block_backward, block_forward
from graphattn.ops.csr import csr_backward, csr_forward
from graphattn.ops.fused import fused_backward, fused_forward, usable
from graphattn.ops.guard import check_bias_values, csr_fix, finite, graph_guards, guarded
from graphattn.ops.ragged import ragged_backward, ragged_forward
from graphattn.ops.sdpa import dense_backward, dense_forward
from graphattn.ops.shared import apply_keep, as_layout, draw_keep
from graphattn.ops.softmax import segment_softmax
from graphattn.ops.structure import _Graph, prepare
from graphattn.validate import message

__all__ = ["choose_impl", "attention_op", "attention_backward_op", "ragged_attention_op", "OPERATORS"]

OPERATORS = (
    "graphattn::attention",
    "graphattn::attention_backward",
    "graphattn::ragged_attention",
    "graphattn::ragged_attention_backward",
    "graphattn::gatv2_score",  # graphattn.ops.additive
    "graphattn::gatv2_score_backward",
)


def choose_impl(
    graph: _Graph, query: Tensor, key: Tensor, value: Tensor, edge_bias: Tensor | None = None, impl: str = "auto"
) -> str:
    """The kernel ``attention`` runs for these inputs: ``"sdpa"``, ``"block"`` or ``"csr"``.

    Rules, in order (``impl="auto"``):

    1. ``"sdpa"`` when there is no ``edge_bias`` and the edges are exactly the
       complete graph or exactly the causal DAG (top-left aligned).
    2. ``"block"`` when the edges have no duplicates and fill at least
       ``MIN_FILL`` of the padded ``BLOCK x BLOCK`` tiles.
    3. ``"csr"`` otherwise (exact for every input): on the CPU in float32/float64
       the fused kernel of :mod:`graphattn.ops.fused` (dropout included), else the library calls
       of :mod:`graphattn.ops.csr`.

    A forced ``impl`` skips the cost rule of "block"; a forced kernel that
    cannot run the graph raises, it never runs another one.
    Non-finite features do not change the choice: "sdpa" and "block" then run
    on finite copies and the queries that read a non-finite node are redone
    exactly on "csr" (see :func:`graphattn.attention`, Notes).

    Raises
    ------
    NotImplementedError
        A forced ``impl`` that cannot run this graph.
    """
    if impl in ("auto", "sdpa") and edge_bias is None and graph.edge_set() is not None:
        return "sdpa"
    if query.size(-1) == 0 and impl == "auto":  # scored attention (no query/key channels): the scores are given
        return "csr"
    if impl == "sdpa":
        raise NotImplementedError(
            message(
                "edge_index",
                "the complete graph or the causal DAG (and no 'edge_bias') for impl='sdpa'",
                "another edge set",
                "use impl='auto'",
            )
        )
    if impl == "csr":
        return "csr"
    tiles = graph.tiles() if impl == "auto" else graph.tiles(min_fill=0.0)
    if tiles is None:
        if impl == "block":
            raise NotImplementedError(
                message(
                    "edge_index",
                    "free of duplicates, with a tile table of at most max(4 E, 2^20) tiles, for impl='block'",
                    "other edges",
                    "use impl='csr'",
                )
            )
        return "csr"
    return "block"


def _tiles(graph: _Graph, impl: str):
    return graph.tiles(min_fill=0.0) if impl == "block" else graph.tiles()


def _empty(like: Tensor, heads: int, dtype=None) -> Tensor:
    return torch.empty(0, heads, dtype=dtype or like.dtype, device=like.device)  # (0, H)


# ------------------------------------------------------------------------------------------------
# graphattn::attention


@torch.library.custom_op("graphattn::attention", mutates_args=())
def attention_op(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    edge_index: Tensor,
    edge_bias: Tensor | None,
    scale: float,
    dropout: float,
    need_alpha: bool,
    impl: str,
    sorted_alpha: bool = False,
    loops: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention along ``edge_index``: ``out (L, H, D_v)``, ``alpha (E, H)`` and ``keep (E, H)`` (see module).

    ``sorted_alpha``: ``alpha`` and ``keep`` in the structure's sorted edge order (what the backward
    reads; zero rows for the edges left out at the end), not the caller's: for training without the
    weights, two gathers fewer per call.
    ``loops``: the graph is ``edge_index`` without its own loops, followed by the edges ``(i, i)``,
    ``i < loops`` (PyG's self-loops; ``E`` counts all of them, the own loops' rows are 0), its
    structure cached under ``edge_index`` (:func:`prepare`).
    """
    L, H, _ = query.shape
    S = key.size(0)
    graph = prepare(edge_index, L, S, device=query.device, loops=loops)
    chosen = choose_impl(graph, query, key, value, edge_bias, impl)
    bias = None if edge_bias is None else graph.sort(edge_bias)  # (E, H or 1) sorted: the edges attended
    check_bias_values(bias)  # (the own loops that loops= leaves out are never read)
    p = dropout
    fix = csr_fix(query, key, value, bias, scale, p)
    if chosen == "sdpa":
        kind = graph.edge_set()

        def kernel(q, k, v):
            return dense_forward(kind, q, k, v, scale, p, need_alpha)

        out, alpha, keep = (
            kernel(query, key, value)
            if kind == "full"
            else guarded(kernel, fix, query, key, value, *graph_guards(graph))
        )
    elif chosen == "block":
        tiles = _tiles(graph, impl)

        def kernel(q, k, v):
            return block_forward(graph, tiles, q, k, v, bias, scale, p, need_alpha)

        out, alpha, keep = guarded(kernel, fix, query, key, value, *graph_guards(graph))
    elif usable(query, key, value, bias):  # CPU float32/64: one fused pass per target
        keep = draw_keep(query.new_empty(H, graph.E), p) if p > 0.0 else None  # (H, E): the library path's draw
        out, alpha = fused_forward(graph, query, key, value, bias, scale, keep, p)  # (L, H, D_v), (E, H) sorted
        alpha = alpha.t()  # (H, E) as the other kernels give it
    else:
        out, alpha, keep = csr_forward(graph, query, key, value, bias, scale, p)
    order = (lambda x: graph.pad(x).contiguous()) if sorted_alpha else (lambda x: graph.unsort(x).contiguous())
    alpha = order(alpha.t()) if need_alpha else _empty(query, H)  # (E, H) caller's (or sorted) order
    keep = order(keep.t()) if need_alpha and keep is not None else _empty(query, H, torch.bool)  # (E, H)
    return out.contiguous(), alpha, keep


@attention_op.register_fake
def _(query, key, value, edge_index, edge_bias, scale, dropout, need_alpha, impl, sorted_alpha=False, loops=0):
    L, H, _ = query.shape
    E = edge_index.size(1) + loops
    out = query.new_empty(L, H, value.size(2))
    alpha = query.new_empty(E if need_alpha else 0, H)
    keep = query.new_empty(E if need_alpha and dropout > 0.0 else 0, H, dtype=torch.bool)
    return out, alpha, keep


@torch.library.custom_op("graphattn::attention_backward", mutates_args=())
def attention_backward_op(
    grad_out: Tensor,
    grad_alpha: Tensor | None,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    edge_index: Tensor,
    edge_bias: Tensor | None,
    alpha: Tensor,
    keep: Tensor | None,
    scale: float,
    dropout: float,
    impl: str,
    need_ds: bool,
    sorted_alpha: bool = False,
    loops: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``dq (L, H, D)``, ``dk (S, H, D)``, ``dv (S, H, D_v)`` and ``d score (E, H)`` (``(0, H)`` unless ``need_ds``).

    ``alpha``, ``keep`` and ``grad_alpha`` in sorted order when ``sorted_alpha`` (``d score`` is in the caller's).
    """
    L, H, _ = query.shape
    S = key.size(0)
    graph = prepare(edge_index, L, S, device=query.device, loops=loops)
    chosen = choose_impl(graph, query, key, value, edge_bias, impl)  # the forward's choice (same inputs)
    to_sorted = (lambda x: x[: graph.E].t()) if sorted_alpha else (lambda x: graph.sort(x).t())  # (H, E) sorted
    args = (
        query,
        key,
        value,
        to_sorted(alpha),
        None if keep is None else to_sorted(keep),
        dropout,
        grad_out,
        None if grad_alpha is None else to_sorted(grad_alpha),
        scale,
    )
    if chosen != "csr" and not finite(query, key, value):  # the forward was guarded: exact along the edges
        chosen = "csr"
    if chosen == "sdpa":
        dq, dk, dv, ds = dense_backward(graph.edge_set(), *args, need_ds=need_ds)
    elif chosen == "block":
        dq, dk, dv, ds = block_backward(graph, _tiles(graph, impl), *args, need_ds=need_ds)
    elif usable(query, key, value, edge_bias):
        grad_alpha_sorted = None if args[7] is None else args[7].t()  # (E, H)
        dq, dk, dv, ds = fused_backward(
            graph, query, key, value, args[3].t(), grad_out, grad_alpha_sorted, scale, args[4], dropout
        )
        ds = ds.t()  # (H, E) as the other kernels give it
    else:
        dq, dk, dv, ds = csr_backward(graph, *args)
    ds = graph.unsort(ds.t()).contiguous() if need_ds else _empty(query, H)  # (E, H) caller's order
    return as_layout(dq, query), as_layout(dk, key), as_layout(dv, value), ds


@attention_backward_op.register_fake
def _(
    grad_out,
    grad_alpha,
    query,
    key,
    value,
    edge_index,
    edge_bias,
    alpha,
    keep,
    scale,
    dropout,
    impl,
    need_ds,
    sorted_alpha=False,
    loops=0,
):
    H = query.size(1)
    return (
        torch.empty_like(query),
        torch.empty_like(key),
        torch.empty_like(value),
        query.new_empty(edge_index.size(1) + loops if need_ds else 0, H),
    )


def _setup_attention(ctx, inputs, output):
    query, key, value, edge_index, edge_bias, scale, dropout, need_alpha, impl, sorted_alpha, loops = inputs
    _, alpha, keep = output
    if sorted_alpha:  # alpha kept for the backward only (the caller never sees it): no gradient reaches it
        ctx.mark_non_differentiable(alpha)
    ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not a zero (E, H) to read
    ctx.save_for_backward(query, key, value, edge_index, edge_bias, alpha, keep)
    ctx.scale, ctx.dropout, ctx.impl, ctx.sorted_alpha, ctx.loops = scale, dropout, impl, sorted_alpha, loops


def _attention_backward(ctx, grad_out, grad_alpha, _grad_keep):
    query, key, value, edge_index, edge_bias, alpha, keep = ctx.saved_tensors
    if grad_alpha is not None and grad_alpha.numel() == 0:
        grad_alpha = None
    keep = keep if keep.numel() else None
    if grad_out is None:
        grad_out = value.new_zeros(query.size(0), *value.shape[1:])
    needs = ctx.needs_input_grad
    if torch.is_grad_enabled():  # create_graph=True: a backward that is itself differentiable
        return _looped_differentiable_backward(
            ctx, query, key, value, edge_index, edge_bias, keep, grad_out, grad_alpha
        )
    need_ds = edge_bias is not None and needs[4]
    dq, dk, dv, ds = attention_backward_op(
        grad_out,
        grad_alpha,
        query,
        key,
        value,
        edge_index,
        edge_bias,
        alpha,
        keep,
        ctx.scale,
        ctx.dropout,
        ctx.impl,
        need_ds,
        ctx.sorted_alpha,
        ctx.loops,
    )
    d_bias = None
    if need_ds:
        d_bias = ds if edge_bias.size(1) > 1 else ds.sum(1, keepdim=True)  # (E, H) or (E, 1)
    return dq, dk, dv, None, d_bias, None, None, None, None, None, None


def _looped_differentiable_backward(ctx, query, key, value, edge_index, edge_bias, keep, grad_out, grad_alpha):
    """:func:`_differentiable_backward` on the graph the forward attended: own loops left out, ``loops`` appended."""
    graph = prepare(edge_index, query.size(0), key.size(0), device=query.device, loops=ctx.loops)
    if ctx.sorted_alpha and keep is not None:  # the reference reads the mask in the caller's order
        keep = graph.unsort(keep[: graph.E])  # (E_in, H)
    kept = None
    if ctx.loops:  # the reference reads the whole edge list: the loops appended, the own loops left out
        loop = torch.arange(ctx.loops, device=edge_index.device, dtype=edge_index.dtype)  # (N,)
        if graph.E_in > graph.E:
            kept = torch.cat([edge_index[0] != edge_index[1], loop >= 0]).nonzero().squeeze(1)  # (E' + N,)
        edge_index = torch.cat([edge_index, loop.expand(2, -1)], dim=1)  # (2, E + N)
    rows = (lambda t: t) if kept is None else (lambda t: None if t is None else t.index_select(0, kept))
    grads = _differentiable_backward(
        query,
        key,
        value,
        edge_index if kept is None else edge_index[:, kept],  # (2, E' + N)
        rows(edge_bias),  # (E' + N, H or 1)
        rows(keep),
        ctx.scale,
        ctx.dropout,
        grad_out,
        rows(grad_alpha),
        ctx.needs_input_grad,
    )
    if kept is None or grads[4] is None:
        return grads
    d_bias = grads[4].new_zeros(graph.E_in, grads[4].size(1)).index_copy(0, kept, grads[4])  # (E + N, H or 1)
    return (*grads[:4], d_bias, *grads[5:])  # the own loops' scores: gradient 0, as an edge PyG removed


def reference_attention(query, key, value, edge_index, edge_bias, keep, scale: float, p: float):
    """The readable per-edge formulation, differentiable to any order: ``out (L, H, D_v)``, ``alpha (E, H)``.

    ``alpha`` is before dropout; ``keep (E, H)`` (or None) the mask applied to
    the weights that reach the output. Memory O(E H D).
    """
    src, dst = edge_index[0], edge_index[1]  # (E,), (E,)
    score = (query.index_select(0, dst) * key.index_select(0, src)).sum(-1) * scale  # (E, H, D) · (E, H, D) -> (E, H)
    if edge_bias is not None:
        score = score + edge_bias  # (E, H)
    alpha = segment_softmax(score, dst, query.size(0))  # (E, H)
    weight = apply_keep(alpha, keep, p)  # (E, H)
    messages = weight.unsqueeze(-1) * value.index_select(0, src)  # (E, H, 1) * (E, H, D_v) -> (E, H, D_v)
    out = messages.new_zeros(query.size(0), *value.shape[1:]).index_add(0, dst, messages)  # (L, H, D_v)
    return out, alpha


def _alias(t: Tensor) -> Tensor:
    return t.view_as(t) if t.requires_grad else t.detach().requires_grad_()


def _differentiable_backward(query, key, value, edge_index, edge_bias, keep, scale, p, grad_out, grad_alpha, needs):
    inputs = [
        t
        for t, need in zip((query, key, value, edge_bias), (needs[0], needs[1], needs[2], needs[4]))
        if need and t is not None
    ]
    if not inputs:
        return (None,) * 11
    with torch.enable_grad():
        # a view of each input (not the input itself): query, key and value may be one tensor, and the
        # gradient of each use is wanted apart; a view stays connected to what the input depends on
        detached = [_alias(t) for t in (query, key, value)]
        bias = None if edge_bias is None else _alias(edge_bias)
        out, alpha = reference_attention(*detached, edge_index, bias, keep, scale, p)
        outputs, grads = [out], [grad_out]
        if grad_alpha is not None:
            outputs.append(alpha)
            grads.append(grad_alpha)
        wrt = [*detached, bias] if bias is not None else detached
        result = torch.autograd.grad(outputs, wrt, grads, create_graph=True, allow_unused=True)
    result = list(result) + [None] * (4 - len(result))
    dq, dk, dv, d_bias = (r if need else None for r, need in zip(result, (needs[0], needs[1], needs[2], needs[4])))
    return dq, dk, dv, None, d_bias, None, None, None, None, None, None


attention_op.register_autograd(_attention_backward, setup_context=_setup_attention)


# ------------------------------------------------------------------------------------------------
# graphattn::ragged_attention


@torch.library.custom_op("graphattn::ragged_attention", mutates_args=())
def ragged_attention_op(
    query: Tensor, key: Tensor, value: Tensor, batch: Tensor, causal: bool, scale: float, dropout: float, seed: Tensor
) -> Tensor:
    """Full or causal attention within each graph of a PyG ``batch``: ``out (N, H, D_v)``."""
    return ragged_forward(query, key, value, batch, causal, scale, dropout, int(seed)).contiguous()


@ragged_attention_op.register_fake
def _(query, key, value, batch, causal, scale, dropout, seed):
    return query.new_empty(query.size(0), query.size(1), value.size(2))


@torch.library.custom_op("graphattn::ragged_attention_backward", mutates_args=())
def ragged_attention_backward_op(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    batch: Tensor,
    causal: bool,
    scale: float,
    dropout: float,
    seed: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """``dq, dk, dv`` of :func:`ragged_attention_op`: the probabilities recomputed, dropout redrawn from ``seed``."""
    grads = ragged_backward(grad_out, query, key, value, batch, causal, scale, dropout, int(seed))
    return tuple(g.contiguous() for g in grads)


@ragged_attention_backward_op.register_fake
def _(grad_out, query, key, value, batch, causal, scale, dropout, seed):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup_ragged(ctx, inputs, output):
    query, key, value, batch, causal, scale, dropout, seed = inputs
    ctx.save_for_backward(query, key, value, batch, seed)
    ctx.causal, ctx.scale, ctx.dropout = causal, scale, dropout


def _ragged_backward(ctx, grad_out):
    if torch.is_grad_enabled():
        raise NotImplementedError(
            message(
                "create_graph",
                "False for the ragged kernel (pattern + batch) under torch.compile",
                True,
                "run that model eagerly, or pass the per-graph edges (graphattn.graphs.batch_sequences) as edge_index",
            )
        )
    query, key, value, batch, seed = ctx.saved_tensors
    dq, dk, dv = ragged_attention_backward_op(
        grad_out.contiguous(), query, key, value, batch, ctx.causal, ctx.scale, ctx.dropout, seed
    )
    return dq, dk, dv, None, None, None, None, None


ragged_attention_op.register_autograd(_ragged_backward, setup_context=_setup_ragged)
