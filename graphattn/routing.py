"""Which path a PyG layer's forward takes, and the graph it attends over.

Shared by :class:`graphattn.AttentionConv` and :class:`graphattn.TransformerConv`:

- :func:`use_propagate`: PyG machinery that must see every edge (``explain``
  mode and its edge masks, message-passing hooks: :func:`needs_propagate`)
  sends the layer down its ``propagate`` path; otherwise the fast kernels run,
  eager or under ``torch.compile``/``torch.export`` alike (they are
  ``torch.library`` operators, :mod:`graphattn.ops.operators`).
- :func:`resolve`: every adjacency form (edge list, ``EdgeIndex``, sparse
  adjacency via :func:`graphattn.graphs.to_edge_index`, a pattern, a pattern
  with a PyG ``batch``) as what the kernels take, building a pattern's edges only
  when the caller needs them (attention weights, ``propagate``).
- :func:`attend`: the fast kernels for what :func:`resolve` returned.
- :func:`project`: the layer's projections of one input, each output contiguous.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.parameter import UninitializedParameter

from graphattn import _compat, ops
from graphattn.graphs import to_edge_index
from graphattn.ops.ragged import group_sizes, per_graph_edges
from graphattn.patterns import is_pattern
from graphattn.validate import message

__all__ = [
    "needs_propagate",
    "use_propagate",
    "propagate_index",
    "resolve",
    "attend",
    "project_rows",
    "plain_linear",
    "same_layout",
    "copy_weights",
]


def needs_propagate(module) -> bool:
    """True when PyG machinery must see every edge: explain mode or a registered message-passing hook.

    Explainers act through ``propagate``: ``GNNExplainer`` and friends set
    ``module.explain = True`` and an edge mask that ``explain_message`` applies
    to every message; ``AttentionExplainer`` registers a message forward hook
    and reads ``alpha``.
    Inside a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``) too: the fast operators'
    registered autograd does not compose with them in torch 2.13 (pytorch/pytorch#168393), PyG's
    per-edge path does.
    """
    return _compat.pyg_needs_propagate(module) or _compat.functorch_active()


def use_propagate(module, edge_index, batch: Tensor | None) -> bool:
    """The layer's path: ``propagate`` for ``impl="message_passing"`` and when :func:`needs_propagate`;
    the fast operators otherwise, compiled or not (compiling no longer implies ``propagate``).
    """
    return module.impl == "message_passing" or needs_propagate(module)


def propagate_index(edge_index):
    """``edge_index`` for PyG's ``propagate``: an int32 edge list as int64, anything else as it is.

    PyG's sum aggregation scatters through an expanded (stride-0) index; with an int32 index torch 2.13's
    CPU ``gather`` (the scatter's backward) reads wrong rows, so the gradients were silently wrong
    (PyG's own layers too). The fast kernels take int32 as it is.
    """
    if isinstance(edge_index, Tensor) and edge_index.layout == torch.strided and edge_index.dtype == torch.int32:
        return edge_index.long()
    return edge_index


def resolve(edge_index, size, batch: Tensor | None, S: int, L: int, need_edges: bool, device):
    """``(returned, graph, values)`` for a layer's ``edge_index`` argument.

    Parameters
    ----------
    edge_index : Tensor (2, E), EdgeIndex, sparse ``adj_t (L, S)``, SparseTensor, or Pattern
    size : tuple (S, L), optional
    batch : Tensor, shape (N,), optional
        With a pattern: the pattern applies within each graph of the batch.
    S, L : int
        Sources and targets, from the features.
    need_edges : bool
        Build a pattern's edges (for the weights or ``propagate``).
    device : torch.device
        Where built edges go.

    Returns
    -------
    returned
        What ``return_attention_weights`` hands back next to alpha: the object
        passed in, or the edges built for a pattern.
    graph : Tensor (2, E) or Pattern
        What the kernels take (a pattern only if ``need_edges`` is False).
    values : Tensor or None
        A sparse adjacency's values.

    Raises
    ------
    ValueError
        ``size`` not matching the features; ``batch`` with ``S != L``.
    NotImplementedError
        A pattern that cannot be applied per graph of ``batch``.
    """
    if not is_pattern(edge_index):
        plain, known, values = to_edge_index(edge_index, size)
        if known is not None and tuple(known) != (S, L):  # the size given, else the sparse adjacency's own
            what = f"(S, L) = {(S, L)} from the features"
            if size is None:
                raise ValueError(message("edge_index", "a sparse adjacency of size " + what, tuple(known)))
            raise ValueError(message("size", what, tuple(known)))
        return edge_index, plain, values
    if batch is not None and S != L:
        raise ValueError(message("x", "one node set (S == L) with 'batch'", f"S = {S}, L = {L}"))
    if not need_edges:
        return edge_index, edge_index, None
    if batch is None:
        edges = edge_index.edge_index(L, S)  # (2, E)
    else:
        edges = per_graph_edges(group_sizes(compact_batch(batch), L), edge_index)  # (2, E): the pattern per graph
    edges = edges.to(device)
    return edges, edges, None


def attend(query: Tensor, key: Tensor, value: Tensor, graph, batch: Tensor | None = None, **kwargs):
    """The fast kernels: :func:`graphattn.ops.batched_attention` for a pattern with a batch, else
    :func:`graphattn.attention`; ``kwargs`` (``edge_bias``, ``dropout``, ``training``, ``need_weights``) pass on.
    """
    if is_pattern(graph) and batch is not None:
        if kwargs.get("edge_bias") is not None:
            raise ValueError(message("edge_bias", "None with a pattern and 'batch'", "a Tensor"))
        kwargs.pop("edge_bias", None)
        return ops.batched_attention(query, key, value, graph, compact_batch(batch), **kwargs)
    return ops.attention(query, key, value, graph, **kwargs)


def compact_batch(batch: Tensor) -> Tensor:
    """A sorted ``batch`` with gaps in its graph ids (``[0, 0, 10**6]``) renumbered ``range(G)`` over the graphs
    that have nodes, so that the kernels' cost follows the nodes and real graphs, never the largest id.

    Empty graphs have no nodes, so nothing changes but the numbering. Anything else (no gaps, unsorted,
    negative, not a 1-D integer tensor; under ``torch.compile``) is returned as it is, for
    :func:`graphattn.ops.batched_attention` to use or refuse by name.
    """
    if (
        torch.compiler.is_compiling()
        or not isinstance(batch, Tensor)
        or batch.dim() != 1
        or batch.numel() == 0
        or batch.dtype not in (torch.int64, torch.int32)
    ):
        return batch
    steps = batch[1:] - batch[:-1]  # (N - 1,) 0 inside a graph, 1 to the next id, > 1 over empty graphs
    if not bool(((steps > 1).any() | (batch[0] > 0)) & (steps >= 0).all()):  # one host sync
        return batch
    return torch.cat([batch.new_zeros(1), (steps > 0).cumsum(0).to(batch.dtype)])  # (N,)


def project_rows(xs: tuple, lins: tuple, heads: int, channels: int, fast: bool) -> tuple[Tensor, ...]:
    """``lins[i](xs[i])`` as ``(n, H, D)`` rows: ``(query (L, H, D), key (S, H, D), value (S, H, D))`` for
    ``lins = (lin_query, lin_key, lin_value)`` (called in that order, PyG's), ``(value (S, H, D),)`` for GAT's
    ``(lin_src,)``.

    With ``fast`` (the layer's fused kernels will take the rows): a lazy projection still uninitialised is
    first called on no rows (its hook sets its size, once), then :func:`heads_last_ok` decides whether the rows
    are projected heads innermost (:func:`project_heads_last`), and :func:`same_layout` lets a checkpoint
    recomputation in the other layout raise. Without, each module is called.

    One matmul per projection, each output contiguous. Not fused into one matmul against the concatenated
    weights on purpose: the split outputs are strided views that the kernels copy before reading (one copy
    per projection forward, a ``cat`` of the gradients backward). Measured on ``benchmarks/train.py``'s
    sparse graph (10k nodes, 10 in-edges, 8 heads, forward + backward, 1 thread, 2026-12-02):
    ``ga.TransformerConv`` took 1.02-1.10x longer fused than with separate projections at D = 64, eager and
    compiled.
    """
    if fast:
        for x, lin in zip(xs, lins):
            if isinstance(_own_weight(lin), UninitializedParameter):
                with torch.no_grad():
                    lin(x[:0])  # the lazy hook materialises the weight now, not between forward and recomputation
        if heads_last_ok(xs[0], heads, channels, lins) and all(x.dtype == xs[0].dtype for x in xs):
            return same_layout(*(project_heads_last(x, lin, heads, channels) for x, lin in zip(xs, lins)))
    rows = tuple(lin(x).view(x.size(0), heads, channels) for x, lin in zip(xs, lins))  # (n, H, D)
    return same_layout(*rows) if fast else rows


def heads_last_ok(x: Tensor, heads: int, channels: int, lins) -> bool:
    """Whether a layer projects to heads-innermost rows: the fused kernels of that layout will run them.

    Not with a lazy ``Linear`` still uninitialised, nor when a hook would see the projections' calls
    (:func:`project_heads_last` bypasses the modules); else :func:`graphattn.ops.fused.heads_last_usable`.
    """
    if not _heads_last_here(x.device.type, x.dtype, heads, channels):
        return False
    return all(plain_linear(lin) for lin in lins)


def plain_linear(lin) -> bool:
    """A stock ``Linear`` (PyG's or torch's: ``x W^T + b`` and nothing else), initialised, seen by no hook,
    its weight a parameter (not parametrized: that is computed at each access, so the module is called once).
    """
    from torch_geometric.nn.dense.linear import Linear

    stock = (Linear.forward, torch.nn.Linear.forward)
    if type(lin).forward not in stock or "forward" in vars(lin) or _compat.has_hooks(lin):
        return False  # a subclass or a patched forward may compute more than the weights say
    weight = _own_weight(lin)
    return weight is not None and not isinstance(weight, UninitializedParameter)


def _own_weight(lin):
    """``lin``'s ``weight`` parameter as registered, or None (parametrized: reading ``lin.weight`` computes it)."""
    return getattr(lin, "_parameters", {}).get("weight")


@torch.compiler.assume_constant_result
def _heads_last_here(device: str, dtype: torch.dtype, heads: int, channels: int) -> bool:
    """:func:`graphattn.ops.fused.heads_last_usable`, a constant to ``torch.compile`` (it reads the thread count).

    Dynamo guards on the thread count (part of its global state): a compiled model run at another count
    recompiles, and the new graph takes that count's layout. The operator checks the layout of the rows it
    is given in any case and takes the ``(n, H, D)`` kernels for rows that are not heads innermost.
    """
    from graphattn.ops import fused

    return fused.heads_last_usable(torch.empty(0, device=device, dtype=dtype), heads, channels)


def project_heads_last(x: Tensor, lin, heads: int, channels: int) -> Tensor:
    """``lin(x).view(n, H, D)``, computed with the weight's rows permuted so that memory is ``(n, D, H)``.

    The same values (each output is the same dot product); the ``(n, H, D)`` view has strides
    ``(H D, 1, H)``, the layout of :mod:`graphattn.ops.heads_last`. The module is not called.
    """
    weight = lin.weight.view(heads, channels, -1).transpose(0, 1).reshape(heads * channels, -1)  # rows (d, h)
    bias = None if lin.bias is None else lin.bias.view(heads, channels).t().reshape(-1)
    return torch.nn.functional.linear(x, weight, bias).view(-1, channels, heads).transpose(1, 2)  # (n, H, D)


def same_layout(*rows: Tensor) -> tuple[Tensor, ...]:
    """``rows`` (``(query (L, H, D), key (S, H, D), value (S, H, D_v))``, or GAT's ``(value,)``; i = query =
    target, j = key = source) as they are (views), whose backward refuses a recomputation in the other layout.

    Which layout a layer projects to (heads innermost or not: :func:`heads_last_ok`) depends on the
    thread count and the projections' hooks. ``torch.utils.checkpoint`` (non-reentrant) recomputes the
    forward during the backward and hands the recomputed tensors to the first forward's graph by
    order; had the thread count or a hook changed in between, the two layouts' tensors have the same
    shapes and the gradients were silently wrong. The layout is saved here (one element) and compared in
    the backward, before the layer's own backward runs. Not under ``torch.compile`` (the check reads a value;
    a compiled layer inside a checkpoint whose recomputation runs at another thread count recompiles, and
    checkpoint's own metadata check raises ``CheckpointError``) nor without autograd.

    Raises
    ------
    RuntimeError
        In the backward, when the recomputed forward projected to the other layout.
    """
    if torch.compiler.is_compiling() or not torch.is_grad_enabled() or not any(r.requires_grad for r in rows):
        return rows
    last = not rows[0].is_contiguous()  # heads innermost: (n, H, D) views of (n, D, H) memory
    return _SameLayout.apply(torch.tensor(last), last, *rows)


class _SameLayout(torch.autograd.Function):
    """Identity on the rows; the backward compares the (possibly recomputed) saved layout with the forward's."""

    @staticmethod
    def forward(ctx, flag: Tensor, last: bool, *rows: Tensor):
        ctx.last = last
        ctx.save_for_backward(flag)  # under checkpoint: the recomputation's flag comes back here
        return tuple(row.view_as(row) for row in rows)

    @staticmethod
    def backward(ctx, *grads):
        (flag,) = ctx.saved_tensors
        if bool(flag) != ctx.last:
            layouts = ("(n, H, D)", "heads innermost (n, D, H)")
            raise RuntimeError(
                "graphattn: the forward projected the attention's rows (query/key/value) to "
                f"{layouts[ctx.last]} rows and its recomputation (torch.utils.checkpoint, use_reentrant=False) "
                f"to {layouts[not ctx.last]}: the thread count or a hook on a projection changed between the "
                "forward and the backward. Keep them fixed until the backward, use use_reentrant=True, or "
                "impl='message_passing'"
            )
        return (None, None, *grads)


def copy_weights(src: torch.nn.Module, dst: torch.nn.Module) -> torch.nn.Module:
    """``dst`` with ``src``'s parameters (by name), dtype, device and train/eval mode."""
    weight = next((p for p in src.parameters() if not isinstance(p, UninitializedParameter)), None)
    if weight is not None:
        dst = dst.to(device=weight.device, dtype=weight.dtype)
    dst.load_state_dict(src.state_dict())
    return dst.train(src.training)
