"""The two factorised patterns of the Sparse Transformer: strided and fixed."""

from __future__ import annotations

import torch

from graphattn.patterns.base import Pattern, _ragged
from graphattn.patterns.spec import spec_family
from graphattn.validate import check_int

__all__ = ["strided", "fixed"]


class _Strided(Pattern):
    def __init__(self, stride):
        self.stride = stride
        super().__init__(f"strided_{stride}", f"strided(stride={stride})")

    def _edges(self, L, S):
        stride, i = self.stride, torch.arange(L)  # (L,)
        n_far = torch.div(i, stride, rounding_mode="floor")  # (L,) keys i - stride, i - 2 stride, ... >= 0
        rows, off = _ragged(n_far + (i + 1).clamp(max=stride))  # (E,), (E,)
        far = rows % stride + off * stride  # (E,) every stride-th key, ascending
        near = (rows - stride + 1).clamp(min=0) + off - n_far[rows]  # (E,) the last stride keys
        j = torch.where(off < n_far[rows], far, near)  # (E,)
        keep = j < S  # (E,)
        return torch.stack([j[keep], rows[keep]])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        diff = q_idx - kv_idx
        return (diff >= 0) & ((diff < self.stride) | (diff % self.stride == 0))


@spec_family("strided")
def strided(stride: int) -> Pattern:
    """Strided attention of the Sparse Transformer [1]_ (Section 4.2), both heads united.

    Rule: j <= i and (i - j < l or (i - j) mod l == 0), the union of
    A(1) = {max(0, i - l), ..., i} and A(2) = {j : (i - j) mod l = 0}, l = ``stride``.
    Query i has min(i + 1, l) + floor(i / l) keys; E = sum over i < L (j < S).
    Every pair j <= i is connected within 2 hops.

    References
    ----------
    .. [1] Child et al., "Generating Long Sequences with Sparse Transformers", 2019.

    Examples
    --------
    >>> strided(2).mask(5)[4].int().tolist()
    [1, 0, 1, 1, 1]
    """
    return _Strided(check_int("stride", stride, 1))


class _Fixed(Pattern):
    def __init__(self, block, summary):
        self.block, self.summary = block, summary
        super().__init__(f"fixed_{block}_{summary}", f"fixed(block={block}, summary={summary})")

    def _edges(self, L, S):
        block, c, i = self.block, self.summary, torch.arange(L)  # (L,)
        start = torch.div(i, block, rounding_mode="floor") * block  # (L,) first key of i's block
        n_sum = start // block * c  # (L,) summary keys of earlier blocks
        rows, off = _ragged(n_sum + i - start + 1)  # (E,), (E,)
        c1 = max(c, 1)  # c == 0 has no summary keys; avoid dividing by 0
        summ = torch.div(off, c1, rounding_mode="floor") * block + block - c + off % c1  # (E,)
        own = start[rows] + off - n_sum[rows]  # (E,) keys of i's own block up to i
        j = torch.where(off < n_sum[rows], summ, own)  # (E,)
        keep = j < S  # (E,)
        return torch.stack([j[keep], rows[keep]])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        block, c = self.block, self.summary
        block_q, block_kv = (torch.div(x, block, rounding_mode="floor") for x in (q_idx, kv_idx))
        return (kv_idx <= q_idx) & ((block_kv == block_q) | (kv_idx % block >= block - c))


@spec_family("fixed")
def fixed(block: int, summary: int) -> Pattern:
    """Fixed attention of the Sparse Transformer [1]_ (Section 4.2), both heads united.

    Rule: j <= i and (floor(j / l) == floor(i / l) or j mod l in {l - c, ..., l - 1}),
    A(1) = i's own block, A(2) = the last c ("summary") keys of every block,
    l = ``block``, c = ``summary``. Query i has (i mod l) + 1 + c floor(i / l) keys.

    References
    ----------
    .. [1] Child et al., "Generating Long Sequences with Sparse Transformers", 2019.

    Examples
    --------
    >>> fixed(3, 1).mask(6)[5].int().tolist()
    [0, 0, 1, 1, 1, 1]
    """
    block = check_int("block", block, 1)
    return _Fixed(block, check_int("summary", summary, 0, block))
