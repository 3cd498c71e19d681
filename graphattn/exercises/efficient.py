"""Checkers for notebooks 4 (dense against sparse) and 7 (efficient attention as graphs)."""

from __future__ import annotations

import torch

from graphattn.exercises.base import as_edges, as_tensor, close, unanswered, verdict

__all__ = [
    "check_window_edges",
    "check_causal_density",
    "check_sliding_window",
    "check_online_merge",
    "check_kv_cache_bytes",
]


def check_window_edges(answer, length: int = 10):
    """Notebook 4: the number of edges of ``window(1, 1)`` (each token reads itself and both neighbours)."""
    if (v := unanswered(answer)) is not None:
        return v
    right = sum(1 for i in range(length) for j in range(length) if abs(i - j) <= 1)  # count the pairs
    if answer == right:
        return verdict(True, f"{right} = 3 L - 2: the first and last token have one neighbour only.")
    if answer == 3 * length:
        return verdict(False, f"3 L = {3 * length} counts two neighbours for the first and last token, which have one.")
    return verdict(False, f"count the pairs (j, i) with |i - j| <= 1 on L = {length} (got {answer}).")


def check_causal_density(answer, length: int = 16):
    """Notebook 4: the density (edges / L^2, a fraction in [0, 1]) of the causal pattern."""
    if (v := unanswered(answer)) is not None:
        return v
    edges = sum(1 for i in range(length) for j in range(i + 1))  # j <= i
    right = edges / length**2
    if abs(float(answer) - right) < 1e-9:
        return verdict(True, f"{edges} edges of {length**2}: density {right:.4f}, just over one half.")
    if abs(float(answer) - (edges - length) / length**2) < 1e-9:
        return verdict(False, "the causal graph keeps the self-loops j = i: a token reads itself.")
    if float(answer) == edges:
        return verdict(False, f"that is the edge count; the density divides it by L^2 = {length**2}.")
    return verdict(False, f"density = (pairs with j <= i) / L^2 (got {answer}).")


def check_sliding_window(edge_index, length: int = 8, past: int = 2):
    """Notebook 4: the ``(2, E)`` edges of causal local attention: each token reads itself and ``past`` before it."""
    if (v := unanswered(edge_index)) is not None:
        return v
    ei = as_edges(edge_index)
    if ei.dim() != 2 or ei.size(0) != 2:
        return verdict(False, f"edge_index has shape (2, E) (got {tuple(ei.shape)}).")
    got = {tuple(e) for e in ei.T.tolist()}
    want = {(j, i) for i in range(length) for j in range(max(0, i - past), i + 1)}  # (source j, target i)
    if got == want and ei.size(1) == len(want):
        return verdict(True, f"{len(want)} edges: token i reads j = i - {past} .. i.")
    if {(i, j) for j, i in got} == want:
        return verdict(
            False,
            "the edges read the future: row 0 is the source = key j, row 1 the target = query i, "
            "and causal means j <= i.",
        )
    if got == want - {(i, i) for i in range(length)}:
        return verdict(False, "each token also reads itself (the self-loop j = i).")
    return verdict(
        False,
        f"expected {len(want)} edges (j, i) with i - {past} <= j <= i (got {ei.size(1)}, {len(got & want)} right).",
    )


def check_online_merge(fn):
    """Notebook 7: ``fn(m1, l1, o1, m2, l2, o2) -> (m, l, o)`` merges two blocks' running max ``m`` (L,),
    sum ``l = sum exp(s - m)`` (L,) and unnormalised output ``o = sum exp(s - m) v`` (L, D).
    """
    if (v := unanswered(fn)) is not None:
        return v
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(3, 8, generator=gen, dtype=torch.float64) * 4  # (L, S) scores
    s[0, 4:] += 30  # query 0's largest scores sit in the second block
    val = torch.randn(8, 2, generator=gen, dtype=torch.float64)  # (S, D)
    parts = []
    for cols in (slice(0, 4), slice(4, 8)):  # two source blocks
        m = s[:, cols].amax(1)  # (L,)
        p = (s[:, cols] - m[:, None]).exp()  # (L, S_b)
        parts += [m, p.sum(1), p @ val[cols]]  # (L,), (L,), (L, D)
    merged = fn(*(t.clone() for t in parts))
    if (v := unanswered(merged)) is not None:
        return v
    m, denom, o = (as_tensor(t, "fn(...)") for t in merged)  # the notebook's running max, sum l, output
    full = s.softmax(1) @ val  # (L, D) full attention
    if close(o / denom[:, None], full, 1e-9) and close(m, s.amax(1), 0):
        return verdict(True, "rescale each block's sum and output by exp(m_b - m), then add: full attention.")
    if close(o / denom[:, None], full, 1e-9):
        return verdict(False, "the output is right, but m should be the running max of both blocks.")
    naive = (parts[2] + parts[5]) / (parts[1] + parts[4])[:, None]
    if close(o / denom[:, None], naive, 1e-9):
        return verdict(
            False,
            "the blocks' sums were added without rescaling: multiply block b's l and o by "
            "exp(m_b - m), m = max(m1, m2).",
        )
    return verdict(False, "o / l differs from full attention over both blocks.")


def check_kv_cache_bytes(
    answer, layers: int, query_heads: int, kv_heads: int, head_dim: int, tokens: int, bytes_per_value: int = 2
):
    """Notebook 7: the bytes of a KV cache: keys and values, per layer, per key-value head, per token."""
    if (v := unanswered(answer)) is not None:
        return v
    right = 2 * layers * kv_heads * head_dim * tokens * bytes_per_value  # K and V
    if answer == right:
        return verdict(
            True,
            f"{right:,} bytes: {query_heads // kv_heads} query heads share each cached key-value "
            f"head, {query_heads // kv_heads}x less than one cache per query head.",
        )
    if answer == right * query_heads // kv_heads:
        return verdict(False, f"that caches one key-value head per query head; only {kv_heads} are stored.")
    if answer * 2 == right:
        return verdict(False, "the cache holds keys and values: a factor 2.")
    if answer * bytes_per_value == right:
        return verdict(False, f"that counts values, not bytes: {bytes_per_value} bytes each.")
    return verdict(False, f"2 (K, V) x layers x kv_heads x head_dim x tokens x bytes (got {answer:,}).")
