"""The non-finite guard of the dense kernels ("sdpa" on the causal DAG, "block"), and the checks of edge scores.

The dense kernels multiply zero weights (non-edges) by every key and value of
a tile, so a NaN or inf there would reach queries that never read it. With
non-finite features they run on finite copies (NaN/inf -> 0), and the queries
that hold or read a non-finite row are recomputed from the original features
on the CSR kernel, over their own edges. Every other query's output is bitwise
what it would be with any finite values in place of the bad ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.ops.csr import csr_forward
from graphattn.ops.structure import _Graph
from graphattn.validate import message


def finite(*tensors: Tensor) -> bool:
    """True when every entry is finite (``aminmax`` propagates NaN; one host sync for all tensors)."""
    ok = [torch.isfinite(torch.stack(torch.aminmax(t.detach()))).all() for t in tensors if t.numel()]  # () each
    return not ok or bool(torch.stack(ok).all())


def maybe_nan_or_posinf(values: Tensor) -> bool:
    """False when no entry of ``values`` is NaN or ``+inf``, from one sum (one pass, no mask): the sum is NaN
    or ``+inf`` only if an entry is, or if finite entries overflow (then True, and the caller checks each).
    """
    total = values.sum()
    return bool(total.isnan() | total.isposinf())


def check_bias_values(edge_bias: Tensor | None) -> None:
    """Refuse a NaN or ``+inf`` in ``edge_bias`` (ValueError); ``-inf`` removes an edge's weight."""
    if edge_bias is None or not edge_bias.numel() or not maybe_nan_or_posinf(edge_bias):
        return
    if bool((torch.isnan(edge_bias) | torch.isposinf(edge_bias)).any()):
        raise ValueError(
            message(
                "edge_bias",
                "free of NaN and +inf",
                "a NaN or +inf entry",
                "-inf is allowed and gives the edge weight 0",
            )
        )


def _bad_rows(x: Tensor) -> Tensor:
    """(n, H, d) -> (n,) True where a row holds NaN or inf."""
    return ~torch.isfinite(x).flatten(1).all(1)


def guarded(kernel, fix, query, key, value, readers, sub_edges):
    """``kernel(q, k, v) -> (out (L, H, D_v), alpha (H, E) or (H, 0), keep (H, E) or None)``, exact for
    non-finite features.

    ``readers(bad_kv (S,)) -> (L,)`` marks the queries that read a non-finite
    key or value row; ``sub_edges(affected (L,)) -> (edge_index (2, E'),
    positions (E',))`` lists their edges, positions in sorted edge order;
    ``fix(sub_index, positions)`` runs the exact CSR kernel on those edges with
    the original features and returns the same triple over the E' edges.
    """
    if finite(query, key, value):
        return kernel(query, key, value)
    affected = _bad_rows(query) | readers(_bad_rows(key) | _bad_rows(value))  # (L,)
    clean = [torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0) for t in (query, key, value)]
    out, alpha, keep = kernel(*clean)  # (L, H, D_v), (H, E), (H, E) or None
    sub_index, positions = sub_edges(affected)  # (2, E'), (E',)
    fix_out, fix_alpha, fix_keep = fix(sub_index, positions)  # (L, H, D_v), (H, E'), (H, E') or None
    out = torch.where(affected[:, None, None], fix_out.to(out.dtype), out)  # (L, H, D_v)
    if alpha.size(1):
        alpha = alpha.index_copy(1, positions, fix_alpha.to(alpha.dtype))  # (H, E)
    if keep is not None:
        keep = keep.index_copy(1, positions, fix_keep)  # (H, E)
    return out, alpha, keep


def csr_fix(query, key, value, bias, scale: float, p: float):
    """The ``fix`` of :func:`guarded` inside the operators: :func:`csr_forward` on the sub-graph."""

    def fix(sub_index, positions):
        sub = _Graph(sub_index, query.size(0), key.size(0))
        sub_bias = None if bias is None else bias[positions]  # (E', H or 1)
        return csr_forward(sub, query, key, value, sub_bias, scale, p)

    return fix


def graph_guards(graph: _Graph):
    """``readers`` and ``sub_edges`` of :func:`guarded` for an edge list."""

    def readers(bad_kv):
        return torch.zeros(graph.L, dtype=torch.bool, device=bad_kv.device).index_fill_(
            0, graph.dst[bad_kv[graph.src]], True
        )  # (L,)

    def sub_edges(affected):
        positions = affected[graph.dst].nonzero().squeeze(1)  # (E',)
        return torch.stack([graph.src[positions], graph.dst[positions]]), positions  # (2, E'), (E',)

    return readers, sub_edges


def causal_guards(L: int, S: int, device):
    """``readers`` and ``sub_edges`` of :func:`guarded` for the causal DAG (j <= i), edges never built."""
    counts = (torch.arange(L, device=device) + 1).clamp(max=S)  # (L,) keys of query i
    starts = counts.cumsum(0) - counts  # (L,) first edge of query i in sorted order

    def readers(bad_kv):  # query i reads keys 0..i: every query from the first bad key on
        first = bad_kv.nonzero()
        return torch.arange(L, device=device) >= (first[0, 0] if first.numel() else L)  # (L,)

    def sub_edges(affected):
        rows = affected.nonzero().squeeze(1)  # (R,)
        dst = torch.repeat_interleave(rows, counts[rows])  # (E',)
        row_start = (counts[rows].cumsum(0) - counts[rows]).repeat_interleave(counts[rows])  # (E',)
        offset = torch.arange(dst.numel(), device=device) - row_start  # (E',) key j = position within the row
        return torch.stack([offset, dst]), starts[dst] + offset  # (2, E'), (E',)

    return readers, sub_edges
