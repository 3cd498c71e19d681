"""Attention within each graph of a PyG batch (ragged groups), never building the sum(n_b^2) edges.

A PyG ``batch`` vector assigns node n to graph ``batch[n]`` (sorted, as
``Batch.from_data_list`` makes it). ``patterns.full()`` given such a batch
means "every node attends to every node of its own graph";
``patterns.causal()`` "node t of a graph attends to nodes 0..t of it".

Kernel: per-size bucketing. The graphs of one size n are gathered into one
dense ``(B_n, H, n, D)`` block and run through
:func:`torch.nn.functional.scaled_dot_product_attention` (no mask for the
complete graph, ``is_causal`` for the DAG), so no query reads a padding key and
no FLOP goes to padding; one call per distinct size. Other patterns are
honoured by building their edges per graph (:func:`graphattn.graphs.batch_sequences`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn.graphs import batch_sequences
from graphattn.validate import check_tensor, message

__all__ = ["batched_attention", "group_sizes"]

RAGGED_KINDS = ("full", "causal")


def group_sizes(batch: Tensor, num_nodes: int) -> Tensor:
    """``counts (B,)`` of a sorted PyG ``batch`` vector of ``num_nodes`` entries.

    Raises
    ------
    TypeError
        A non-integer ``batch``.
    ValueError
        A ``batch`` of the wrong length, with negative entries, or not sorted
        (PyG batches are; sort the nodes, e.g. with ``batch.argsort(stable=True)``).
    """
    check_tensor("batch", batch, dim=1, shape_text="(N,)")
    if batch.dtype not in (torch.int64, torch.int32) or batch.size(0) != num_nodes:
        raise (TypeError if batch.dtype not in (torch.int64, torch.int32) else ValueError)(
            message("batch", f"an integer Tensor of shape (N,) = ({num_nodes},)",
                    f"{batch.dtype}, shape {tuple(batch.shape)}"))
    if num_nodes and bool((batch[1:] < batch[:-1]).any() | (batch[0] < 0)):
        raise ValueError(message("batch", "sorted and non-negative (nodes of one graph together, as PyG batches)",
                                 "an unsorted or negative vector"))
    return torch.bincount(batch.long())  # (B,)


def _buckets(counts: Tensor):
    """``(n, nodes (B_n, n))`` for each distinct graph size n > 0: node ids of the graphs of that size."""
    starts = counts.cumsum(0) - counts  # (B,) first node of each graph
    for n in torch.unique(counts).tolist():
        if n == 0:
            continue
        graphs = (counts == n).nonzero().squeeze(1)  # (B_n,)
        yield n, graphs, starts[graphs, None] + torch.arange(n, device=counts.device)  # (B_n, n)


def _dense_weights(q: Tensor, k: Tensor, causal: bool, scale: float) -> Tensor:
    """Softmax weights ``(B_n, H, n, n)`` of one bucket (rows = queries)."""
    score = torch.einsum("bhtd,bhsd->bhts", q, k) * scale  # (B_n, H, n, D) · (B_n, H, n, D) -> (B_n, H, n, n)
    if causal:
        n = q.size(2)
        score = score.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return score.softmax(dim=-1)


def _edge_positions(counts: Tensor, graphs: Tensor, n: int, causal: bool) -> Tensor:
    """``(B_n, E_n)`` positions of a bucket's edges in ``batch_sequences(counts, pattern)`` order."""
    per_graph = counts * (counts + 1) // 2 if causal else counts * counts  # (B,) edges of each graph
    offsets = per_graph.cumsum(0) - per_graph  # (B,) first edge of each graph
    local = n * (n + 1) // 2 if causal else n * n  # edges of one graph of size n, target-major
    return offsets[graphs, None] + torch.arange(local, device=counts.device)  # (B_n, E_n)


def batched_attention(query: Tensor, key: Tensor, value: Tensor, pattern, batch: Tensor, *,
                      scale: float | None = None, dropout: float = 0.0, training: bool = True,
                      need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """``pattern`` within each graph of a PyG batch: node i reads only nodes of its own graph.

    Parameters
    ----------
    query, key, value : Tensor, shape (N, H, D), (N, H, D), (N, H, D_v)
        One row per node (self-attention inside each graph: L = S = N).
    pattern : graphattn.patterns.Pattern
        Connectivity inside each graph; ``full()`` and ``causal()`` run the
        ragged kernel, other patterns their per-graph edges.
    batch : Tensor, shape (N,)
        PyG's ``batch`` vector (sorted graph index of each node).
    scale : float, optional
        Default ``1 / sqrt(D)``.
    dropout : float, default 0.0
    training : bool, default True
    need_weights : bool, default False
        Also return ``alpha (E, H)`` over the edges of
        ``graphs.batch_sequences(counts, pattern)`` (target-major inside each graph).

    Returns
    -------
    output : Tensor, shape (N, H, D_v)
    alpha : Tensor, shape (E, H), or None

    Raises
    ------
    ValueError
        A ``batch`` that is not a sorted ``(N,)`` vector, or ``L != S``.
    NotImplementedError
        A pattern that has no per-graph edges (e.g. one fixed to a length).
    """
    from graphattn import ops

    ops.check_qkv(query, key, value)
    N, H, D = query.shape
    if key.size(0) != N:
        raise ValueError(message("key", f"one row per node, N = {N} (attention within each graph)",
                                 f"shape {tuple(key.shape)}"))
    counts = group_sizes(batch, N)  # (B,)
    kind = getattr(pattern, "kind", None)
    if kind not in RAGGED_KINDS:
        try:
            edge_index, _ = batch_sequences(counts, pattern)  # (2, E): the pattern inside each graph
        except (ValueError, IndexError, TypeError) as error:
            raise NotImplementedError(message("pattern", "a pattern that applies to every graph size",
                                              getattr(pattern, "name", pattern), str(error))) from error
        return ops.attention(query, key, value, edge_index.to(query.device), scale=scale, dropout=dropout,
                             training=training, need_weights=need_weights)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    p = dropout if training else 0.0
    causal = kind == "causal"
    pieces, order, weights, positions = [], [], [], []
    for n, graphs, nodes in _buckets(counts):
        q, k, v = (t[nodes].transpose(1, 2) for t in (query, key, value))  # (B_n, H, n, D)
        if need_weights:
            w = _dense_weights(q, k, causal, scale)  # (B_n, H, n, n)
            w = F.dropout(w, p=p, training=p > 0)
            o = w @ v  # (B_n, H, n, n) @ (B_n, H, n, D_v) -> (B_n, H, n, D_v)
            w = w.permute(0, 2, 3, 1)  # (B_n, n, n, H): target-major, as batch_sequences orders edges
            if causal:
                w = w[:, torch.ones(n, n, dtype=torch.bool, device=w.device).tril()]  # (B_n, n(n+1)/2, H)
            weights.append(w.reshape(-1, H))  # (B_n * E_n, H)
            positions.append(_edge_positions(counts, graphs, n, causal).reshape(-1))  # (B_n * E_n,)
        else:
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, scale=scale)  # (B_n, H, n, D_v)
        pieces.append(o.transpose(1, 2).reshape(-1, H, value.size(-1)))  # (B_n * n, H, D_v)
        order.append(nodes.reshape(-1))  # (B_n * n,)
    if not pieces:
        return value.new_zeros(N, H, value.size(-1)), (value.new_zeros(0, H) if need_weights else None)
    out = torch.cat(pieces)[torch.cat(order).argsort()]  # (N, H, D_v): rows back in node order
    if not need_weights:
        return out, None
    alpha = torch.cat(weights)[torch.cat(positions).argsort()]  # (E, H) in batch_sequences order
    return out, alpha
