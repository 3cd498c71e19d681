"""Checkers for notebooks 1 (the six steps) and 2 (attention as message passing)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from graphattn.exercises.base import as_edges, as_tensor, close, unanswered, verdict

__all__ = [
    "check_equal_scores",
    "check_book_softmax",
    "check_masked_softmax",
    "check_bipartite_edges",
    "check_no_incoming",
    "check_message_passing",
]


def _fmt(t: Tensor) -> str:
    return " / ".join(f"{x:.3f}" for x in t.reshape(-1).tolist())


def check_equal_scores(answer):
    """Notebook 1: the weights of one query with raw scores 3, 3, 3 and ``d_k = 9``."""
    if (v := unanswered(answer)) is not None:
        return v
    a = as_tensor(answer).reshape(-1)
    right = torch.softmax(torch.full((3,), 3.0, dtype=torch.float64) / math.sqrt(9), 0)  # (3,)
    if close(a, right, 1e-3):  # 0.333 typed by hand is right
        return verdict(True, f"equal scores give equal weights {_fmt(right)}, whatever the scale.")
    if close(a, torch.ones(3, dtype=torch.float64)):
        return verdict(False, "those are the scaled scores 3 / sqrt(9); the weights are their softmax.")
    if a.numel() == 1 and close(a, right[:1], 1e-3):
        return verdict(False, f"{a.item():.3f} is each key's weight; give all three, one per key.")
    return verdict(
        False,
        f"one query's weights sum to 1 and equal scores give equal weights (yours: {_fmt(a)}, "
        f"sum {a.sum().item():.3f}).",
    )


def check_book_softmax(answer):
    """Notebook 1: softmax(2.1 / sqrt(4), 0.4 / sqrt(4), -0.3 / sqrt(4)), the book's worked example, by hand."""
    if (v := unanswered(answer)) is not None:
        return v
    a = as_tensor(answer).reshape(-1)
    s = torch.tensor([2.1, 0.4, -0.3], dtype=torch.float64)  # (3,)
    e = (s / 2).exp()  # (3,)
    right = e / e.sum()
    if close(a, right, 1e-3):
        return verdict(
            True,
            f"exp = {_fmt(e)}, Z = {e.sum().item():.3f}, weights {_fmt(right)}: the token keeps "
            f"{right[0].item():.0%} of itself, not the book's two thirds.",
        )
    wrong = {
        "the book's printed 0.67 / 0.21 / 0.12, which no correct softmax of 1.05 / 0.2 / -0.15 gives": torch.tensor(
            [0.67, 0.21, 0.12], dtype=torch.float64
        ),
        "the softmax of the raw scores: divide by sqrt(4) = 2 first": torch.softmax(s, 0),
        "divided by d_k = 4; scale by 1 / sqrt(d_k)": torch.softmax(s / 4, 0),
        "divided by sqrt(2); the book's d_k is 4": torch.softmax(s / math.sqrt(2), 0),
    }
    for why, w in wrong.items():
        if close(a, w, 6e-3):
            return verdict(False, f"that is {why}.")
    return verdict(
        False, f"exponentiate the scaled scores 1.05 / 0.2 / -0.15, then divide each by their sum (yours: {_fmt(a)})."
    )


def check_masked_softmax(fn):
    """Notebook 1: ``fn(scores (L, S), keep (L, S) bool) -> weights (L, S)``, 0 on masked keys, a zero row
    for a query that may read nothing (the graph convention), rows that keep a key summing to 1.
    """
    if (v := unanswered(fn)) is not None:
        return v
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 5, generator=gen, dtype=torch.float64) * 3  # (L, S)
    keep = torch.rand(4, 5, generator=gen) < 0.6  # (L, S) True = may attend
    keep[0] = False  # a padding query: every key masked
    keep[1:, 0] = True  # every other query keeps a key
    got = fn(scores.clone(), keep.clone())
    if (v := unanswered(got)) is not None:
        return v
    got = as_tensor(got, "fn(scores, keep)")
    right = torch.where(keep, scores, float("-inf")).softmax(-1).nan_to_num(0.0)  # (L, S)
    if close(got, right, 1e-6):  # float32 noise is right too
        return verdict(True, "masked keys get 0, each row that keeps a key sums to 1, the padding row is zero.")
    if got.shape != right.shape:
        return verdict(
            False, f"return one weight per (query, key): shape {tuple(right.shape)} (got {tuple(got.shape)})."
        )
    if torch.isnan(got[0]).any():
        return verdict(False, "the fully masked row 0 is NaN: -inf everywhere gives 0 / 0; give it zeros.")
    if close(got[0], torch.full((5,), 0.2, dtype=torch.float64)):
        return verdict(
            False,
            "the fully masked row 0 is uniform (0.2 each): a very negative fill such as -1e9 "
            "does that; it must read nothing, a zero row.",
        )
    inverted = torch.where(~keep, scores, float("-inf")).softmax(-1).nan_to_num(0.0)  # True read as "masked"
    if close(got, inverted, 1e-6):
        return verdict(
            False,
            "the mask is read the other way round: keep[i, j] True means query i MAY attend to "
            "key j (SDPA's polarity; nn.MultiheadAttention's masks use the opposite one).",
        )
    if (got[~keep].abs() > 1e-12).any():
        return verdict(False, "masked keys have weight: mask (-inf) before the softmax.")
    sums = got[1:].sum(-1)  # (L - 1,)
    if ((sums - 1).abs() > 1e-6).any():
        return verdict(
            False,
            f"rows that keep a key must sum to 1 (yours: {_fmt(sums)}): zeroing after the "
            "softmax without renormalising leaves them short.",
        )
    return verdict(False, "the weights differ from a softmax over each row's kept keys.")


def check_bipartite_edges(edge_index, num_queries: int = 7, num_keys: int = 3):
    """Notebook 2: the ``(2, E)`` edge list of cross-attention from ``num_queries`` queries to ``num_keys`` keys."""
    if (v := unanswered(edge_index)) is not None:
        return v
    ei = as_edges(edge_index)
    want = {(j, i) for i in range(num_queries) for j in range(num_keys)}  # (source j, target i)
    if ei.dim() != 2 or ei.size(0) != 2:
        return verdict(False, f"edge_index has shape (2, E) (got {tuple(ei.shape)}).")
    got = [tuple(e) for e in ei.T.tolist()]
    if len(got) != len(set(got)):
        return verdict(False, "some edges appear twice; each (key, query) pair is one edge.")
    if set(got) == want:
        return verdict(True, f"{len(want)} = {num_queries} x {num_keys} edges, {num_keys} into each query.")
    if {(i, j) for j, i in got} == want:
        return verdict(
            False,
            f"the rows are swapped: row 0 is the source = key j (< {num_keys}), row 1 the "
            f"target = query i (< {num_queries}).",
        )
    return verdict(
        False,
        f"the complete bipartite graph has every (key j, query i) pair: {len(want)} edges "
        f"(got {len(got)}, {len(set(got) & want)} of them right).",
    )


def check_no_incoming(answer):
    """Notebook 2: node 0's output row once its only incoming edge (the self-loop) is removed."""
    if (v := unanswered(answer)) is not None:
        return v
    a = as_tensor(answer)
    if a.numel() == 0:
        return verdict(False, "that is empty; give node 0's output row (one number per channel).")
    if bool((a == 0).all()):
        return verdict(True, "a node with no incoming edge aggregates nothing: its row is exactly zero.")
    return verdict(
        False,
        "node 0 has no incoming edge left, so no message reaches it and its row is zero; "
        "the layer never adds the self-loop back (got a nonzero row).",
    )


def _reference(q: Tensor, k: Tensor, v: Tensor, edge_index: Tensor) -> Tensor:
    """Dense masked attention (torch only): (L, H, D)."""
    allowed = torch.zeros(q.size(0), k.size(0), dtype=torch.bool)  # (L, S)
    allowed[edge_index[1], edge_index[0]] = True
    s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(q.size(-1))  # (H, L, S)
    a = s.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)  # (H, L, S)
    return torch.einsum("hij,jhd->ihd", a, v)  # (L, H, D)


def check_message_passing(fn):
    """Notebook 2: ``fn(q (L, H, D), k (S, H, D), v (S, H, D), edge_index (2, E)) -> (L, H, D)``, attention
    along the edges written with gather, a per-target softmax and a scatter-sum.
    """
    if (v := unanswered(fn)) is not None:
        return v
    gen = torch.Generator().manual_seed(0)
    q, k, val = (torch.randn(n, 2, 4, generator=gen, dtype=torch.float64) for n in (5, 6, 6))
    ei = torch.tensor([[0, 1, 2, 5, 3, 4, 0, 1], [0, 0, 1, 1, 2, 2, 3, 3]])  # node 4 has no incoming edge
    got = fn(q.clone(), k.clone(), val.clone(), ei.clone())  # an in-place edit must not change the reference
    if (v := unanswered(got)) is not None:
        return v
    got = as_tensor(got, "fn(q, k, v, edge_index)")
    right = _reference(q, k, val, ei)
    if close(got, right, 1e-6):  # float32 noise is right too
        return verdict(True, "scores on the edges, a softmax per target, messages summed into their targets.")
    if got.shape != right.shape:
        return verdict(False, f"one output row per query: shape {tuple(right.shape)} (got {tuple(got.shape)}).")
    if torch.isnan(got).any():
        return verdict(False, "NaN: query 4 has no incoming edge; its row must be zero, not 0 / 0.")
    s = (q[ei[1]] * k[ei[0]]).sum(-1) / 2  # (E, H): the right scores
    glob = torch.zeros_like(right).index_add_(0, ei[1], s.softmax(0)[..., None] * val[ei[0]])  # one softmax
    if close(got, glob, 1e-9):
        return verdict(
            False,
            "the softmax ran over all edges at once; normalise over the edges into each "
            "target (torch_geometric.utils.softmax(score, index=edge_index[1])).",
        )
    if close(got, _reference(q * 2, k, val, ei), 1e-9):
        return verdict(False, "the scores are not scaled: divide q . k by sqrt(D).")
    flipped = _reference(q, k, val, ei.flip(0)) if q.size(0) == k.size(0) else None
    if flipped is not None and close(got[:5], flipped[:5], 1e-9):
        return verdict(False, "the edges point the wrong way: row 0 is the source j (key), row 1 the target i.")
    return verdict(False, "the output differs from attention along the edges.")
