"""Planned traffic from a pattern's rule, at sizes whose edge list would not fit: :func:`pattern_rows`.

For each process the distinct keys its block of queries reads are derived
from the pattern's parameters in O(L) per process (a window's halo is an
interval, a strided pattern's columns a set of residues, BigBird's keys the
blocks of its block table), never from the L x L grid nor the edge list. The
result equals ``build_plan(pattern, sizes, r).rows`` (tested at small L); a
pattern this module does not know is planned from its edge list, in O(E).
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.distributed.plan import block_bounds, build_plan, owners
from graphattn.patterns import is_pattern

# the pattern classes are private to graphattn.patterns; their parameters are read here, never changed
from graphattn.patterns.base import _Bound, _Composite
from graphattn.patterns.local import _Causal, _Full, _Window
from graphattn.patterns.mixtures import _BigBird, _Global, _Random
from graphattn.patterns.sparse_transformer import _Strided
from graphattn.validate import message

__all__ = ["pattern_rows", "ring_rows"]


def _window(p: _Window, a: int, b: int, L: int) -> Tensor | None:
    if p.dilation != 1:
        return None  # residues of a dilated window: planned from the edge list
    # query i reads [i - left, i + right] ∩ [0, L): the union over [a, b) is one interval
    lo = 0 if p.left is None else max(0, a - p.left)
    hi = L if p.right is None else min(L, b + p.right)
    return torch.arange(lo, hi)


def _strided(p: _Strided, a: int, b: int, L: int) -> Tensor:
    # query i reads j <= i with i - j < stride (near) or i - j = 0 mod stride (far); near keys of [a, b) are
    # [a - stride + 1, b); far keys below a are the j whose residue mod stride is one of the block's residues
    stride, before = p.stride, torch.arange(0, a)  # (a,)
    residues = torch.arange(a, b) % stride if b - a < stride else torch.arange(stride)  # (<= stride,)
    keep = torch.isin(before % stride, residues) | (before >= a - stride + 1)  # (a,)
    return torch.cat([before[keep], torch.arange(a, b)])


def _bigbird(table: Tensor, block: int, a: int, b: int, L: int) -> Tensor:
    # query block qa..qb reads the key blocks of its table rows, each block c covers [c b, min((c + 1) b, L))
    rows = table[a // block : (b - 1) // block + 1].any(0).nonzero().squeeze(1)  # (n_blocks,) key blocks
    starts = (rows * block).repeat_interleave(block)  # (n_blocks * block,)
    j = starts + torch.arange(block).repeat(rows.numel())  # (n_blocks * block,)
    return j[j < L]


def _sources(p, a: int, b: int, L: int, memo: dict) -> Tensor | None:
    """Distinct keys read by queries [a, b), ascending or not; None if this pattern is not known here."""
    if a == b:
        return torch.empty(0, dtype=torch.long)
    if isinstance(p, _Bound):
        p = p.parent
    if isinstance(p, _Full):
        return torch.arange(L)
    if isinstance(p, _Causal):
        return torch.arange(b)  # queries i < b read j <= i
    if isinstance(p, _Window):
        return _window(p, a, b, L)
    if isinstance(p, _Strided):
        return _strided(p, a, b, L)
    if isinstance(p, _Global):
        g = p.indices[p.indices < L]  # (G,)
        return torch.arange(L) if bool(((g >= a) & (g < b)).any()) else g  # a global query reads all
    if isinstance(p, _Random):
        if id(p) not in memo:
            memo[id(p)] = p._keys(L, L)  # (L, k) the pattern's own draw, O(L k)
        return memo[id(p)][a:b].reshape(-1)
    if isinstance(p, _BigBird):
        if id(p) not in memo:
            memo[id(p)] = p._table(L, L)  # the pattern's own block table, O((L / block)^2)
        return _bigbird(*memo[id(p)], a, b, L)
    if isinstance(p, _Composite) and p.op == "|":
        parts = [_sources(q, a, b, L, memo) for q in p.parts]
        return None if any(s is None for s in parts) else torch.cat(parts)
    return None


def pattern_rows(pattern, sizes) -> Tensor:
    """The traffic matrix of a pattern split into blocks, without building its edges where possible.

    Parameters
    ----------
    pattern : graphattn.patterns.Pattern
        On L = S = sum(sizes) positions.
    sizes : sequence of int
        Positions per process, in rank order.

    Returns
    -------
    Tensor, shape (P, P), int64
        ``rows[r, s]`` = distinct key/value rows process r receives from
        process s; equal to :attr:`ExchangePlan.rows`.

    Raises
    ------
    TypeError, ValueError
        ``pattern`` not a pattern; ``sizes`` not non-negative ints.

    Notes
    -----
    Known from the parameters: full, causal, window (dilation 1), strided,
    global tokens, random (the pattern's own draw, O(L k)), BigBird (its own
    block table, O((L / block)^2)) and unions of these; anything else
    (dilated windows, fixed, intersections, top-k) is planned from its edge
    list by :func:`build_plan`. O(P L) time and O(L) memory per process.

    Examples
    --------
    >>> from graphattn.patterns import window
    >>> pattern_rows(window(2, 2), [4, 4, 4]).tolist()
    [[0, 2, 0], [2, 0, 2], [0, 2, 0]]
    """
    if not is_pattern(pattern):
        raise TypeError(message("pattern", "a graphattn.patterns.Pattern", type(pattern).__name__))
    bounds = block_bounds(sizes)  # (P + 1,)
    P, L = bounds.numel() - 1, int(bounds[-1])
    rows, memo = torch.zeros(P, P, dtype=torch.long), {}
    for r in range(P):
        a, b = int(bounds[r]), int(bounds[r + 1])
        found = _sources(pattern, a, b, L, memo)
        if found is None:
            return build_plan(pattern, sizes, 0).rows
        j = torch.unique(found)  # (n_keys,)
        j = j[(j < a) | (j >= b)]  # other blocks' rows only
        rows[r] = torch.bincount(owners(bounds, j), minlength=P)  # (P,)
    return rows


def ring_rows(sizes) -> Tensor:
    """Rows each process receives in ring attention: every other block, whatever the pattern.

    Ring attention (and PyTorch's ``context_parallel``) passes every key/value
    block around the ring, so process r receives ``L - n_r`` rows.

    Returns
    -------
    Tensor, shape (P,), int64
    """
    bounds = block_bounds(sizes)  # (P + 1,)
    return bounds[-1] - (bounds[1:] - bounds[:-1])  # (P,)
