"""Attention within each graph of a PyG batch (ragged groups), never building the sum(n_b^2) edges.

A PyG ``batch`` vector assigns node n to graph ``batch[n]`` (sorted, as
``Batch.from_data_list`` makes it). ``patterns.full()`` given such a batch
means "every node attends to every node of its own graph";
``patterns.causal()`` "node t of a graph attends to nodes 0..t of it".

Kernel: the graphs are bucketed by size. The rows ``(node, head)`` of q, k
and v are gathered (one ``index_select`` each) into a head-major layout in
which the G graphs of size n form one ``(G * H, n, D)`` block
(:func:`bucket_layout`); each block is one ``bmm``, softmax, ``bmm``
(:class:`_Core`; its hand-written backward recomputes the weights), and the
output is gathered back. No padding row or padding key exists, and since the
gathers are permutations their backward is a gather too (no scatter-add).
Measured on 1000 graphs of 20-40 nodes, H = 4, D = 16, forward + backward,
1 thread: about 50 ms against about 100 ms for the one padded
:func:`torch.nn.functional.scaled_dot_product_attention` call under a key
padding mask that this kernel replaced (SDPA's flash kernel is slow on
blocks this small, and the padding added 1.7x the work). The number of
calls grows with the number of distinct graph sizes (at most about
``sqrt(2 N)``). The weights (``need_weights``) use one padded call
(:func:`padded_attention`) while its padding costs at most ``MAX_PADDING``
times the work. Other patterns are honoured by building their edges per
graph (:func:`graphattn.graphs.batch_sequences`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn.graphs import batch_sequences
from graphattn.validate import check_tensor, message

__all__ = [
    "ragged_forward",
    "ragged_backward",
    "bucket_layout",
    "core_reference",
    "group_sizes",
    "per_graph_edges",
    "padded_attention",
]

RAGGED_KINDS = ("full", "causal")
MAX_PADDING = 4.0  # the weights: one padded call while B * T^2 <= this many times sum(n_b^2); else their edges


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
            message(
                "batch",
                f"an int64 or int32 Tensor of shape (N,) = ({num_nodes},)",
                f"{batch.dtype}, shape {tuple(batch.shape)}",
            )
        )
    if num_nodes and bool((batch[1:] < batch[:-1]).any() | (batch[0] < 0)):
        raise ValueError(
            message(
                "batch",
                "sorted and non-negative (nodes of one graph together, as PyG batches)",
                "an unsorted or negative vector",
            )
        )
    return torch.bincount(batch.long())  # (B,)


def per_graph_edges(counts: Tensor, pattern) -> Tensor:
    """``(2, E)`` edges of ``pattern`` inside each graph of sizes ``counts`` (:func:`graphs.batch_sequences`).

    Raises
    ------
    NotImplementedError
        A pattern that cannot be applied to every graph size (e.g. ``topk`` of a fixed score matrix).
    """
    try:
        edge_index, _ = batch_sequences(counts, pattern)  # (2, E)
    except (ValueError, IndexError, TypeError) as error:
        raise NotImplementedError(
            message(
                "pattern", "a pattern that applies to every graph size", getattr(pattern, "name", pattern), str(error)
            )
        ) from error
    return edge_index


def _padded_layout(batch: Tensor, counts: Tensor) -> tuple[Tensor, Tensor, int]:
    """``(flat (N,), valid (B, T), T)``: row ``batch[n] * T + position`` of node n in the padded ``(B * T)`` layout."""
    starts = counts.cumsum(0) - counts  # (B,) first node of each graph
    T = int(counts.max()) if counts.numel() else 0
    position = torch.arange(batch.numel(), device=batch.device) - starts[batch]  # (N,) index inside its graph
    valid = torch.arange(T, device=batch.device) < counts[:, None]  # (B, T)
    return batch * T + position, valid, T


def _pad(x: Tensor, flat: Tensor, B: int, T: int) -> Tensor:
    """``(N, H, D) -> (B, H, T, D)``, zeros at padding."""
    padded = x.new_zeros(B * T, *x.shape[1:]).index_copy(0, flat, x)  # (B*T, H, D)
    return padded.view(B, T, *x.shape[1:]).transpose(1, 2)  # (B, H, T, D)


def bucket_layout(batch: Tensor, counts: Tensor, heads: int) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
    """``(source (M,), back (N * H,), buckets)``: the size-bucketed, head-major layout of M = N * H rows.

    The graphs are taken in order of size (stable); the G graphs of size n
    form one bucket, a ``(G * H, n, d)`` block: graph g, head h, position i.
    Row r of the layout holds row ``source[r] = m * H + h`` (node m, head h)
    of an ``(N * H, d)`` view; row ``back[m * H + h]`` holds it (``back``
    undoes the gather).
    ``buckets`` lists ``(n, G)`` in layout order, empty graphs left out.
    """
    N = batch.numel()
    order = torch.argsort(counts, stable=True)  # (B,) graphs by size
    sorted_counts = counts[order]  # (B,)
    first = torch.empty_like(counts)
    first[order] = sorted_counts.cumsum(0) - sorted_counts  # (B,) first node of each graph in size order
    position = torch.arange(N, device=batch.device) - (counts.cumsum(0) - counts)[batch]  # (N,) index in its graph
    # The bucket of size n starting at node o (size order) fills rows H*o .. H*(o + G*n); graph g of it starts
    # at row H*o + g*H*n = H*first[b] (first[b] = o + g*n), its head h at + h*n, its node i at + i.
    hs = torch.arange(heads, device=batch.device)  # (H,)
    back = ((heads * first[batch] + position)[:, None] + hs * counts[batch][:, None]).reshape(-1)  # (N * H,)
    source = torch.empty_like(back)
    source[back] = torch.arange(back.numel(), device=batch.device)  # (M,) m * H + h held by each row
    sizes, graphs = torch.unique_consecutive(sorted_counts, return_counts=True)
    buckets = [(n, G) for n, G in zip(sizes.tolist(), graphs.tolist()) if n > 0]
    return source, back, buckets


class _Rows(torch.autograd.Function):
    """``x (..., d)`` viewed as rows ``(R, d)``, the rows ``rows`` gathered; ``inverse`` undoes it.

    The gather is a permutation, so its backward is the gather by
    ``inverse`` (no scatter-add), itself differentiable the same way.
    """

    @staticmethod
    def forward(ctx, x, rows, inverse):
        ctx.rows, ctx.inverse, ctx.shape = rows, inverse, x.shape
        return x.reshape(-1, x.size(-1)).index_select(0, rows)  # (R, d)

    @staticmethod
    def backward(ctx, grad):
        return _Rows.apply(grad, ctx.inverse, ctx.rows).view(ctx.shape), None, None


def _blocks(rows: Tensor, buckets: list[tuple[int, int]], heads: int) -> list[Tensor]:
    """``(M, d) -> [(G * H, n, d)]``: the buckets of a layout-ordered tensor, as views."""
    split = rows.split([G * heads * n for n, G in buckets])
    return [part.view(G * heads, n, rows.size(-1)) for part, (n, G) in zip(split, buckets)]


def _weights(score: Tensor, causal: bool) -> Tensor:
    """``(G * H, n, n)`` scaled scores -> softmax weights (causal: key j <= query i only); the scores are reused."""
    if causal:
        n = score.size(-1)
        score.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=score.device).triu(1), float("-inf"))
    return score.softmax(-1)  # (G * H, n, n)


def _keep_scaled(w: Tensor, p: float, seed: int) -> Tensor:
    """Dropout's ``keep / (1 - p)`` for the weights ``w`` of one bucket, drawn from ``seed``."""
    return _keep(w.shape, p, seed, w.device).to(w.dtype) / (1.0 - p)  # (G * H, n, n)


def core_reference(q_rows, k_rows, v_rows, buckets, heads: int, causal: bool, scale: float, p: float, seed):
    """The readable bucketed attention on layout rows, differentiable by autograd to any order: ``(M, D_v)``.

    Per bucket ``softmax(q k^T * scale) v``, the keep mask of bucket b drawn
    from ``seed + b``. :class:`_Core` (the fast path) equals it.
    """
    q, k, v = (_blocks(t, buckets, heads) for t in (q_rows, k_rows, v_rows))  # [(G*H, n, d)] each
    outs = []
    for b, (q_b, k_b, v_b) in enumerate(zip(q, k, v)):
        w = _weights(q_b @ k_b.mT * scale, causal)  # (G*H, n, D) · (G*H, n, D) -> (G*H, n, n)
        if p > 0.0:
            w = w * _keep_scaled(w, p, seed + b)
        outs.append((w @ v_b).reshape(-1, v_b.size(-1)))  # (G*H, n, n) @ (G*H, n, D_v) -> (G*H*n, D_v)
    return torch.cat(outs)  # (M, D_v)


def _core_forward(q_rows, k_rows, v_rows, buckets, heads, causal, scale, p, seed):
    """``out_rows (M, D_v)``: per bucket ``softmax(q k^T * scale) v``, one ``bmm`` pair."""
    q_scaled = q_rows * scale  # (M, D): the scale folded into the queries
    out_rows = v_rows.new_empty(v_rows.shape)  # (M, D_v)
    parts = zip(*(_blocks(t, buckets, heads) for t in (q_scaled, k_rows, v_rows, out_rows)))
    for b, (q_b, k_b, v_b, out_b) in enumerate(parts):
        w = _weights(torch.bmm(q_b, k_b.mT), causal)  # (G*H, n, D) · (G*H, n, D) -> (G*H, n, n)
        torch.bmm(w if p == 0.0 else w * _keep_scaled(w, p, seed + b), v_b, out=out_b)  # -> (G*H, n, D_v)
    return out_rows


def _core_backward(g_rows, q_rows, k_rows, v_rows, buckets, heads, causal, scale, p, seed):
    """``dq, dk, dv`` rows of :func:`_core_forward`, the weights ``w`` recomputed bucket by bucket.

    With ``A = w * keep`` (the dropped weights) and ``dW = dA * keep``:
    ``dv = A^T g``, ``dA = g v^T``, the softmax backward
    ``ds = w * (dW - sum_j w_ij dW_ij)``, ``dq = ds k * scale``, ``dk = ds^T q * scale``.
    """
    q_scaled = q_rows * scale  # (M, D), as forward
    grads = [torch.empty_like(q_rows), torch.empty_like(k_rows), torch.empty_like(v_rows)]  # dq, dk, dv rows
    blocks = (_blocks(t, buckets, heads) for t in (g_rows, q_scaled, k_rows, v_rows, *grads))
    for b, (g_b, q_b, k_b, v_b, dq_b, dk_b, dv_b) in enumerate(zip(*blocks)):
        w = _weights(torch.bmm(q_b, k_b.mT), causal)  # (G*H, n, n): forward's weights again
        d_a = torch.bmm(g_b, v_b.mT)  # (G*H, n, D_v) · (G*H, n, D_v) -> (G*H, n, n): dL/dA
        a = w
        if p > 0.0:
            keep = _keep_scaled(w, p, seed + b)  # (G*H, n, n)
            a, d_a = w * keep, d_a.mul_(keep)
        torch.bmm(a.mT, g_b, out=dv_b)  # (G*H, n, n) @ (G*H, n, D_v) -> (G*H, n, D_v)
        ds = d_a.sub_((w * d_a).sum(-1, keepdim=True)).mul_(w)  # (G*H, n, n): softmax backward
        torch.bmm(ds, k_b, out=dq_b)  # (G*H, n, n) @ (G*H, n, D) -> (G*H, n, D)
        torch.bmm(ds.mT, q_b, out=dk_b)  # (G*H, n, n) @ (G*H, n, D) -> (G*H, n, D), q scaled
    grads[0].mul_(scale)
    return tuple(grads)


class _Core(torch.autograd.Function):
    """The fast bucketed attention on layout rows (:func:`_core_forward`); backward recomputes the weights.

    Only q, k, v rows are saved: keeping the weights (``H * sum(n_b^2)``
    values) saved one ``bmm`` and softmax per bucket in backward (about 20 %
    of the kernel) but made a GraphGPS step (``benchmarks/gps.py``) hold more
    for backward than PyG's own (224 against 221 MiB; 195 now).

    Backward is :func:`_core_backward`; with ``create_graph=True`` it
    differentiates :func:`core_reference` (the same math and dropout draws)
    instead, so second derivatives are exact.
    """

    @staticmethod
    def forward(ctx, q_rows, k_rows, v_rows, buckets, heads, causal, scale, p, seed):
        out_rows = _core_forward(q_rows, k_rows, v_rows, buckets, heads, causal, scale, p, seed)
        ctx.save_for_backward(q_rows, k_rows, v_rows)
        ctx.args = (buckets, heads, causal, scale, p, seed)
        return out_rows

    @staticmethod
    def backward(ctx, g_rows):
        q_rows, k_rows, v_rows = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the readable path, differentiable again
            out = core_reference(q_rows, k_rows, v_rows, *ctx.args)
            grads = torch.autograd.grad(out, (q_rows, k_rows, v_rows), g_rows, create_graph=True, allow_unused=True)
        else:
            grads = _core_backward(g_rows, q_rows, k_rows, v_rows, *ctx.args)
        return (*grads, None, None, None, None, None, None)


def ragged_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    batch: Tensor,
    causal: bool,
    scale: float,
    p: float,
    seed: int | None = None,
) -> Tensor:
    """The ragged kernel: full (or causal) attention within each graph of ``batch``, ``out (N, H, D_v)``.

    The rows gathered into the size-bucketed layout (:func:`bucket_layout`),
    one ``bmm`` pair per graph size (:class:`_Core`), gathered back;
    differentiable. Validates ``batch`` (:func:`group_sizes`). Dropout's keep
    masks are drawn from ``seed`` (from torch's generator when None), so that
    :func:`ragged_backward` can redraw them.
    """
    N, H, _ = query.shape
    counts = group_sizes(batch, N)  # (B,)
    if N == 0:  # still connected to the inputs: an empty batch's loss backpropagates (zero gradients)
        return value.new_zeros(0, H, value.size(-1)) + (query.sum() + key.sum() + value.sum()) * 0
    if p > 0.0 and seed is None:
        seed = int(torch.randint(0, 2**62, ()))
    source, back, buckets = bucket_layout(batch.long(), counts, H)
    rows = (_Rows.apply(t, source, back) for t in (query, key, value))  # (M, d) each
    out_rows = _Core.apply(*rows, buckets, H, causal, scale, p, seed)  # (M, D_v)
    return _Rows.apply(out_rows, back, source).view(N, H, -1)  # (N, H, D_v)


def ragged_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    batch: Tensor,
    causal: bool,
    scale: float,
    p: float,
    seed: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """``dq, dk, dv`` of :func:`ragged_forward` with the same ``seed``: the weights recomputed."""
    N, H, _ = query.shape
    counts = group_sizes(batch, N)  # (B,)
    if N == 0:
        return torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    source, back, buckets = bucket_layout(batch.long(), counts, H)
    rows = [t.reshape(-1, t.size(-1)).index_select(0, source) for t in (grad_out, query, key, value)]  # (M, d)
    grads = _core_backward(*rows, buckets, H, causal, scale, p, seed)  # (M, d) each
    return tuple(g.index_select(0, back).view(N, H, -1) for g in grads)  # type: ignore[return-value]


def fits_one_padded_call(counts: Tensor) -> bool:
    """True when one padded call (the weights' path) costs at most ``MAX_PADDING`` times the work."""
    return counts.numel() * int(counts.max()) ** 2 <= MAX_PADDING * int((counts * counts).sum())


def _visible(valid: Tensor, causal: bool) -> Tensor:
    """``(B, 1 or T, T)``: the keys each query of a graph reads (a padding query reads them too; dropped)."""
    visible = valid[:, None, :]  # (B, 1, T)
    if causal:
        T = valid.size(1)
        visible = visible & torch.ones(T, T, dtype=torch.bool, device=valid.device).tril()  # (B, T, T)
    return visible


def _keep(shape, p: float, seed: int, device) -> Tensor:
    """Dropout's keep mask drawn from its own generator seeded with ``seed`` (the same in forward and backward)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.empty(shape, device=device).bernoulli_(1.0 - p, generator=generator).bool()


def _unpad(x: Tensor, flat: Tensor) -> Tensor:
    """``(B, H, T, d) -> (N, H, d)``: the rows of the real nodes (inverse of :func:`_pad`)."""
    B, H, T, d = x.shape
    return x.transpose(1, 2).reshape(B * T, H, d).index_select(0, flat)  # (N, H, d)


def padded_attention(query, key, value, batch, counts, causal: bool, scale: float, p: float):
    """``out (N, H, D_v), alpha (E, H)``: the weights' path, the math on the padded ``(B, H, T, D)`` layout."""
    B = counts.numel()
    flat, valid, T = _padded_layout(batch, counts)  # (N,), (B, T)
    visible = _visible(valid, causal)  # (B, 1 or T, T)
    q, k, v = (_pad(t, flat, B, T) for t in (query, key, value))  # (B, H, T, D)
    score = torch.einsum("bhtd,bhsd->bhts", q, k) * scale  # (B, H, T, D) · (B, H, T, D) -> (B, H, T, T)
    w = score.masked_fill(~visible[:, None], float("-inf")).softmax(dim=-1)  # (B, H, T, T)
    w = F.dropout(w.nan_to_num(0.0), p=p, training=p > 0)  # rows of empty graphs: 0
    out = w @ v  # (B, H, T, T) @ (B, H, T, D_v) -> (B, H, T, D_v)
    edges = valid[:, :, None] & visible  # (B, T, T): (target t, source s) edges of each graph
    alpha = w.permute(0, 2, 3, 1)[edges]  # (E, H), graph, target, source order = batch_sequences'
    return _unpad(out, flat), alpha  # (N, H, D_v), (E, H)
