"""Sparsity patterns: which keys j each query i may read, in three views.

A pattern is a small object named after its parameters (``window_2_2``). For L
queries and S keys (S defaults to L) it gives

- ``edge_index(L, S=None)``: LongTensor (2, E); row 0 = source = key j, row 1 =
  target = query i; sorted by target, then source; no duplicates. Built from
  per-row arithmetic in O(E) memory, never by scanning the L x S grid.
- ``mask(L, S=None)``: BoolTensor (L, S), True = query i may attend key j (the
  SDPA polarity). The reference view: ``mask_mod`` evaluated on a grid.
- ``mask_mod(b, h, q_idx, kv_idx)``: the rule as an elementwise predicate,
  usable as FlexAttention's ``mask_mod`` (no branching on tensor values).

``random`` and ``bigbird`` depend on (L, S) through their random draws; their
``mask_mod`` looks up a table, so bind them first: ``p.bind(L, S).mask_mod``.
Every other pattern's ``bind`` returns itself (``topk``/``threshold`` check the
size). ``a | b`` and ``a & b`` compose; ``kind`` is "full", "causal" or None,
for the kernels' dispatch.

References
----------
.. [1] Child et al., "Generating Long Sequences with Sparse Transformers", 2019.
.. [2] Beltagy et al., "Longformer: The Long-Document Transformer", 2020.
.. [3] Zaheer et al., "Big Bird: Transformers for Longer Sequences", 2020.
.. [4] Dao, "FlashAttention-2", 2023 (``flash_attn_func(window_size=...)``).
"""
from __future__ import annotations

import functools
import operator

import torch
from torch import Tensor

__all__ = ["Pattern", "full", "causal", "window", "dilated", "longformer_window", "flash_window",
           "strided", "fixed", "global_tokens", "random", "bigbird", "longformer", "topk",
           "threshold", "stats"]


def _int(name, value, low=0, high=None):
    """Validate an int argument; raise TypeError/ValueError with the template."""
    what = f"an int in [{low}, {high}]" if high is not None else \
        {None: "an int", 0: "a non-negative int", 1: "a positive int"}[low]
    msg = f"Expected {name!r} to be {what} (got {value!r})"
    if isinstance(value, bool):
        raise TypeError(msg)
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(msg) from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(msg)
    return value


def _ragged(counts: Tensor) -> tuple[Tensor, Tensor]:
    """Row id and offset within the row for ``counts[r]`` items in each row r."""
    rows = torch.repeat_interleave(torch.arange(counts.numel()), counts)  # (E,)
    starts = torch.cumsum(counts, 0) - counts  # (R,)
    return rows, torch.arange(rows.numel()) - starts[rows]  # (E,), (E,)


def _sort_unique(j: Tensor, i: Tensor, S: int) -> Tensor:
    """Edges (j, i) sorted by target, then source, duplicates dropped."""
    key = torch.unique(i * S + j)  # (E,) sorted
    return torch.stack([key % S, key // S])  # (2, E)


class Pattern:
    """A rule saying which keys j each query i may read (see the module docstring).

    Attributes: ``name`` (after the parameters, for test ids and plot titles) and
    ``kind`` ("full", "causal" or None: lets the kernels take a dense fast path).
    Subclasses implement ``_edges(L, S)`` (sorted, O(E)) and ``_rule(q_idx, kv_idx)``.

    Examples
    --------
    >>> p = window(1, 1) | global_tokens([0])
    >>> p.name, p.kind, p.edge_index(4).shape, p.mask(4).sum().item()
    ('window_1_1|global_0', None, torch.Size([2, 14]), 14)
    >>> from torch.nn.attention.flex_attention import create_block_mask
    >>> create_block_mask(p.mask_mod, None, None, 4, 4, device="cpu").shape
    (1, 1, 4, 4)
    """

    kind = None  # "full" or "causal" lets the kernels dispatch to dense paths

    def __init__(self, name: str, call: str):
        self.name, self._call = name, call

    def __repr__(self) -> str:
        return self._call

    def _sizes(self, L, S):
        L = _int("L", L)
        return L, (L if S is None else _int("S", S))

    def edge_index(self, L: int, S: int | None = None) -> Tensor:
        """Edges (2, E): row 0 = key j, row 1 = query i, sorted by i then j."""
        L, S = self._sizes(L, S)
        if L == 0 or S == 0:
            return torch.empty(2, 0, dtype=torch.long)
        return self._edges(L, S)

    def mask(self, L: int, S: int | None = None) -> Tensor:
        """Dense BoolTensor (L, S); True = query i may attend key j."""
        L, S = self._sizes(L, S)
        if L == 0 or S == 0:
            return torch.zeros(L, S, dtype=torch.bool)
        q, kv = torch.arange(L).unsqueeze(1), torch.arange(S).unsqueeze(0)  # (L, 1), (1, S)
        return self.bind(L, S)._rule(q, kv).expand(L, S).clone()  # (L, S)

    @property
    def mask_mod(self):
        """The rule as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> BoolTensor``.

        A plain 4-argument function (what ``create_block_mask`` inspects) of
        elementwise tensor ops; broadcasts over index grids.
        """
        rule = self._rule

        def mask_mod(b, h, q_idx, kv_idx):
            return rule(q_idx, kv_idx)

        return mask_mod

    def bind(self, L: int, S: int | None = None) -> Pattern:
        """The pattern whose ``mask_mod`` is valid for (L, S); itself unless size-dependent."""
        self._sizes(L, S)
        return self

    def __or__(self, other):
        return _Composite("|", [self, other]) if isinstance(other, Pattern) else NotImplemented

    def __and__(self, other):
        return _Composite("&", [self, other]) if isinstance(other, Pattern) else NotImplemented


class _Composite(Pattern):
    """Union (``|``) or intersection (``&``) of patterns, computed on keys ``i * S + j``."""

    def __init__(self, op, parts, name=None, call=None):
        flat = []
        for p in parts:  # (a | b) | c -> a | b | c, for readable names
            same = isinstance(p, _Composite) and p.op == op and p._auto
            flat += p.parts if same else [p]
        wrap = [isinstance(p, _Composite) and p._auto and p.op != op for p in flat]
        auto_name = op.join(f"({p.name})" if w else p.name for p, w in zip(flat, wrap))
        auto_call = f" {op} ".join(f"({p!r})" if w else repr(p) for p, w in zip(flat, wrap))
        super().__init__(name or auto_name, call or auto_call)
        self.op, self.parts, self._auto = op, flat, name is None

    @property
    def kind(self):
        kinds = [p.kind for p in self.parts]
        if self.op == "|":
            return "full" if "full" in kinds else (kinds[0] if len(set(kinds)) == 1 else None)
        rest = [k for k in kinds if k != "full"]
        return "full" if not rest else (rest[0] if len(set(rest)) == 1 else None)

    def _edges(self, L, S):
        keys = [e[1] * S + e[0] for e in (p.edge_index(L, S) for p in self.parts)]  # [(E_p,)]
        if self.op == "|":
            key = torch.unique(torch.cat(keys))  # (E,) sorted
        else:
            key = functools.reduce(lambda a, b: a[torch.isin(a, b)], keys)  # (E,) sorted
        return torch.stack([key % S, key // S])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        f = operator.or_ if self.op == "|" else operator.and_
        return functools.reduce(f, (p._rule(q_idx, kv_idx) for p in self.parts))

    def bind(self, L, S=None):
        parts = [p.bind(L, S) for p in self.parts]
        return _Composite(self.op, parts, None if self._auto else self.name, self._call)


# ---------------------------------------------------------------- full, causal, window
class _Full(Pattern):
    kind = "full"

    def _edges(self, L, S):
        rows, off = _ragged(torch.full((L,), S))  # (E,), (E,)
        return torch.stack([off, rows])  # (2, L * S)

    def _rule(self, q_idx, kv_idx):
        return (q_idx >= 0) & (kv_idx >= 0)


def full() -> Pattern:
    """The complete graph: every query i reads every key j, i -> i included.

    Rule: all (i, j) with 0 <= i < L, 0 <= j < S; L * S edges. Ordinary
    (unmasked) self- or cross-attention.

    Examples
    --------
    >>> full().edge_index(2)
    tensor([[0, 1, 0, 1],
            [0, 0, 1, 1]])
    """
    return _Full("full", "full()")


class _Causal(Pattern):
    kind = "causal"

    def _edges(self, L, S):
        rows, off = _ragged((torch.arange(L) + 1).clamp(max=S))  # (E,), (E,)
        return torch.stack([off, rows])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        return kv_idx <= q_idx


def causal() -> Pattern:
    """The causal (decoder) DAG: query i reads keys j <= i.

    Rule: j <= i, top-left aligned as SDPA's ``is_causal=True`` when L != S;
    L (L + 1) / 2 edges when L == S.

    Examples
    --------
    >>> causal().edge_index(3)
    tensor([[0, 0, 1, 0, 1, 2],
            [0, 1, 1, 2, 2, 2]])
    """
    return _Causal("causal", "causal()")


class _Window(Pattern):
    def __init__(self, left, right, dilation):
        self.left, self.right, self.dilation = left, right, dilation
        txt = ["inf" if v is None else str(v) for v in (left, right)]
        name = f"window_{txt[0]}_{txt[1]}" + (f"_d{dilation}" if dilation != 1 else "")
        super().__init__(name, f"window(left={left}, right={right}, dilation={dilation})")

    @property
    def kind(self):
        if self.left is None and self.dilation == 1 and self.right in (0, None):
            return "causal" if self.right == 0 else "full"
        return None

    def _edges(self, L, S):
        d, i = self.dilation, torch.arange(L)  # (L,)
        lo = -torch.div(i, d, rounding_mode="floor")  # (L,) smallest t with i + d t >= 0
        hi = torch.div(S - 1 - i, d, rounding_mode="floor")  # (L,) largest t with i + d t < S
        lo = lo if self.left is None else lo.clamp(min=-self.left)
        hi = hi if self.right is None else hi.clamp(max=self.right)
        rows, off = _ragged((hi - lo + 1).clamp(min=0))  # (E,), (E,)
        return torch.stack([rows + d * (lo[rows] + off), rows])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        diff = kv_idx - q_idx  # j - i = d t
        ok = diff % self.dilation == 0
        if self.left is not None:  # Python branch on a parameter, never on tensor values
            ok = ok & (diff >= -self.left * self.dilation)
        if self.right is not None:
            ok = ok & (diff <= self.right * self.dilation)
        return ok


def window(left: int | None, right: int | None, dilation: int = 1) -> Pattern:
    """Sliding window: query i reads j = i + d t for integers t in [-left, right].

    Rule: ``j - i`` a multiple of ``dilation`` d with ``-left * d <= j - i <= right * d``
    and 0 <= j < S; None means unbounded on that side (``window(None, 0)`` is
    causal). Query i itself is always included (t = 0). Edge count for L == S
    and d = 1: L (left + right + 1) - left (left + 1) / 2 - right (right + 1) / 2
    while left, right < L. Windows are top-left aligned (i and j are absolute
    positions). Presets: :func:`longformer_window`, :func:`flash_window`.

    Parameters
    ----------
    left, right : int >= 0 or None
        Number of keys (in steps of d) before and after i.
    dilation : int >= 1
        Gap d between keys; d > 1 is the dilated window of Longformer [2]_.

    Raises
    ------
    TypeError, ValueError
        For a non-int or negative ``left``/``right``, or ``dilation`` < 1.

    Examples
    --------
    >>> p = window(1, 0)
    >>> p.name, p.edge_index(3).tolist()
    ('window_1_0', [[0, 0, 1, 1, 2], [0, 1, 1, 2, 2]])
    """
    left = None if left is None else _int("left", left)
    right = None if right is None else _int("right", right)
    return _Window(left, right, _int("dilation", dilation, 1))


def dilated(left: int, right: int, dilation: int = 2) -> Pattern:
    """Dilated sliding window [2]_: :func:`window` with a gap ``dilation`` between keys.

    Rule: j = i + d t, t in [-left, right], 0 <= j < S.

    Examples
    --------
    >>> dilated(1, 1, 2).mask(5)[2].int().tolist()
    [1, 0, 1, 0, 1]
    """
    return window(left, right, dilation)


def longformer_window(w: int) -> Pattern:
    """Longformer's sliding window of size w [2]_ (Section 3.1): w / 2 keys each side.

    Rule: |i - j| <= w / 2, so w + 1 keys per query away from the edges. ``w``
    must be even, as in the reference implementation.

    Examples
    --------
    >>> longformer_window(4).name
    'window_2_2'
    """
    w = _int("w", w)
    if w % 2:
        raise ValueError(f"Expected 'w' to be an even non-negative int (got {w})")
    return window(w // 2, w // 2)


def flash_window(left: int, right: int) -> Pattern:
    """FlashAttention's ``window_size=(left, right)`` [4]_: keys in [i - left, i + right].

    Rule: inclusive on both sides, -1 means unbounded (``flash_window(-1, 0)`` is
    causal). Equal to FlashAttention for L == S; for L != S FlashAttention aligns
    bottom-right (it shifts i by S - L), whereas this pattern is top-left aligned.

    Examples
    --------
    >>> flash_window(-1, 0).kind
    'causal'
    """
    left, right = (None if v == -1 else v for v in (left, right))
    return window(left, right)


# ---------------------------------------------------------------- Sparse Transformer
class _Strided(Pattern):
    def __init__(self, stride):
        self.stride = stride
        super().__init__(f"strided_{stride}", f"strided(stride={stride})")

    def _edges(self, L, S):
        l, i = self.stride, torch.arange(L)  # (L,)
        n_far = torch.div(i, l, rounding_mode="floor")  # (L,) keys i - l, i - 2l, ... >= 0
        rows, off = _ragged(n_far + (i + 1).clamp(max=l))  # (E,), (E,)
        far = rows % l + off * l  # (E,) every l-th key, ascending
        near = (rows - l + 1).clamp(min=0) + off - n_far[rows]  # (E,) the last l keys
        j = torch.where(off < n_far[rows], far, near)  # (E,)
        keep = j < S  # (E,)
        return torch.stack([j[keep], rows[keep]])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        diff = q_idx - kv_idx
        return (diff >= 0) & ((diff < self.stride) | (diff % self.stride == 0))


def strided(stride: int) -> Pattern:
    """Strided attention of the Sparse Transformer [1]_ (Section 4.2), both heads united.

    Rule: j <= i and (i - j < l or (i - j) mod l == 0), the union of
    A(1) = {max(0, i - l), ..., i} and A(2) = {j : (i - j) mod l = 0}, l = ``stride``.
    Query i has min(i + 1, l) + floor(i / l) keys; E = sum over i < L (j < S).
    Every pair j <= i is connected within 2 hops.

    Examples
    --------
    >>> strided(2).mask(5)[4].int().tolist()
    [1, 0, 1, 1, 1]
    """
    return _Strided(_int("stride", stride, 1))


class _Fixed(Pattern):
    def __init__(self, block, summary):
        self.block, self.summary = block, summary
        super().__init__(f"fixed_{block}_{summary}", f"fixed(block={block}, summary={summary})")

    def _edges(self, L, S):
        l, c, i = self.block, self.summary, torch.arange(L)  # (L,)
        start = torch.div(i, l, rounding_mode="floor") * l  # (L,) first key of i's block
        n_sum = start // l * c  # (L,) summary keys of earlier blocks
        rows, off = _ragged(n_sum + i - start + 1)  # (E,), (E,)
        c1 = max(c, 1)  # c == 0 has no summary keys; avoid dividing by 0
        summ = torch.div(off, c1, rounding_mode="floor") * l + l - c + off % c1  # (E,)
        own = start[rows] + off - n_sum[rows]  # (E,) keys of i's own block up to i
        j = torch.where(off < n_sum[rows], summ, own)  # (E,)
        keep = j < S  # (E,)
        return torch.stack([j[keep], rows[keep]])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        l, c = self.block, self.summary
        block_q, block_kv = (torch.div(x, l, rounding_mode="floor") for x in (q_idx, kv_idx))
        return (kv_idx <= q_idx) & ((block_kv == block_q) | (kv_idx % l >= l - c))


def fixed(block: int, summary: int) -> Pattern:
    """Fixed attention of the Sparse Transformer [1]_ (Section 4.2), both heads united.

    Rule: j <= i and (floor(j / l) == floor(i / l) or j mod l in {l - c, ..., l - 1}),
    A(1) = i's own block, A(2) = the last c ("summary") keys of every block,
    l = ``block``, c = ``summary``. Query i has (i mod l) + 1 + c floor(i / l) keys.

    Examples
    --------
    >>> fixed(3, 1).mask(6)[5].int().tolist()
    [0, 0, 1, 1, 1, 1]
    """
    block = _int("block", block, 1)
    return _Fixed(block, _int("summary", summary, 0, block))


# ---------------------------------------------------------------- global, random, bigbird
class _Global(Pattern):
    def __init__(self, idx: Tensor):
        self.indices = idx
        txt = "_".join(map(str, idx.tolist())) or "none"
        super().__init__(f"global_{txt}", f"global_tokens(indices={idx.tolist()})")

    def _edges(self, L, S):
        g = self.indices
        is_g = torch.zeros(L, dtype=torch.bool)  # (L,)
        is_g[g[g < L]] = True
        keys = g[g < S]  # (G,) global keys that exist
        rows, off = _ragged(torch.where(is_g, S, keys.numel()))  # (E,), (E,)
        pad = torch.cat([keys, keys.new_zeros(1)])  # (G + 1,) safe gather when G == 0
        j = torch.where(is_g[rows], off, pad[off.clamp(max=keys.numel())])  # (E,)
        return torch.stack([j, rows])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        g = self.indices.to(q_idx.device)  # (G,)
        return (q_idx.unsqueeze(-1) == g).any(-1) | (kv_idx.unsqueeze(-1) == g).any(-1)


def global_tokens(indices) -> Pattern:
    """Global tokens: every global token reads all keys and is read by all queries.

    Rule: i in G or j in G (symmetric). Indices >= L (queries) or >= S (keys) are
    ignored, so one pattern serves every length; negative indices raise. For
    L == S and g = |G ∩ [0, L)|: 2 g L - g^2 edges.

    Examples
    --------
    >>> global_tokens([0]).mask(3).int().tolist()
    [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    """
    seq = indices.tolist() if isinstance(indices, Tensor) else indices
    seq = [seq] if isinstance(seq, int) else list(seq)
    idx = sorted({_int("indices", v) for v in seq})
    return _Global(torch.tensor(idx, dtype=torch.long))


class _Sized(Pattern):
    """A pattern whose edges depend on (L, S); ``mask_mod`` needs ``bind(L, S)``."""

    def _rule(self, q_idx, kv_idx):
        raise ValueError(f"Expected a bound pattern: {self.name}'s keys depend on (L, S), "
                         f"use pattern.bind(L, S).mask_mod")

    def bind(self, L, S=None):
        return _Bound(self, *self._sizes(L, S))


class _Bound(Pattern):
    """A size-dependent pattern with its lookup table for one (L, S)."""

    def __init__(self, parent, L, S):
        super().__init__(parent.name, f"{parent!r}.bind({L}, {S})")
        self.parent, self.size = parent, (L, S)
        self.table, self.block = parent._table(L, S)  # (ceil(L/b), ceil(S/b)) bool, b

    def _edges(self, L, S):
        return self.parent._edges(L, S)

    def bind(self, L, S=None):
        return self if self._sizes(L, S) == self.size else self.parent.bind(L, S)

    def _rule(self, q_idx, kv_idx):
        L, S = self.size
        qb = torch.div(q_idx.clamp(0, L - 1), self.block, rounding_mode="floor")
        kb = torch.div(kv_idx.clamp(0, S - 1), self.block, rounding_mode="floor")
        return self.table.to(q_idx.device)[qb, kb] & (q_idx < L) & (kv_idx < S)


class _Random(_Sized):
    def __init__(self, k, seed):
        self.k, self.seed = k, seed
        super().__init__(f"random_{k}_s{seed}", f"random(k={k}, seed={seed})")

    def _keys(self, L, S):
        g, k = torch.Generator().manual_seed(self.seed), min(self.k, S)
        if 2 * k > S:  # dense enough: a random order of each row (E >= L S / 2)
            keys = torch.rand(L, S, generator=g).argsort(1)[:, :k]  # (L, k)
        else:  # Floyd's algorithm, vectorised over rows: O(L k^2), no (L, S) grid
            keys = torch.empty(L, 0, dtype=torch.long)  # (L, 0)
            for t in range(S - k, S):
                r = torch.randint(0, t + 1, (L,), generator=g)  # (L,)
                seen = (keys == r.unsqueeze(1)).any(1)  # (L,)
                keys = torch.cat([keys, torch.where(seen, t, r).unsqueeze(1)], 1)  # (L, m + 1)
        return keys.sort(1).values  # (L, k)

    def _edges(self, L, S):
        keys = self._keys(L, S)  # (L, k)
        rows = torch.arange(L).repeat_interleave(keys.shape[1])  # (L k,)
        return torch.stack([keys.reshape(-1), rows])  # (2, L k)

    def _table(self, L, S):
        keys = self._keys(L, S)  # (L, k)
        return torch.zeros(L, S, dtype=torch.bool).scatter_(1, keys, True), 1  # (L, S)


def random(k: int, seed: int = 0) -> Pattern:
    """Random keys: each query reads min(k, S) distinct keys drawn uniformly.

    Rule: for each i, a uniform random subset of {0, ..., S - 1} of size min(k, S),
    drawn from ``torch.Generator().manual_seed(seed)``: the same for the same
    (L, S, seed), in training and evaluation alike. L min(k, S) edges. Bind
    before using ``mask_mod``: ``random(k).bind(L, S).mask_mod``.

    Examples
    --------
    >>> p = random(2, seed=0)
    >>> p.name, p.edge_index(4).shape, p.mask(4).sum(1).tolist()
    ('random_2_s0', torch.Size([2, 8]), [2, 2, 2, 2])
    """
    return _Random(_int("k", k), _int("seed", seed, None))


class _BigBird(_Sized):
    def __init__(self, block, window_blocks, global_blocks, random_blocks, seed):
        self.block, self.window_blocks, self.global_blocks = block, window_blocks, global_blocks
        self.random_blocks, self.seed = random_blocks, seed
        args = (block, window_blocks, global_blocks, random_blocks, seed)
        super().__init__("bigbird_b{}_w{}_g{}_r{}_s{}".format(*args),
                         "bigbird(block={}, window_blocks={}, global_blocks={}, "
                         "random_blocks={}, seed={})".format(*args))

    def _table(self, L, S):
        b, w, g = self.block, self.window_blocks, self.global_blocks
        nq, nk = -(-L // b), -(-S // b)  # blocks, the last one possibly partial
        qb, kb = torch.arange(nq).unsqueeze(1), torch.arange(nk).unsqueeze(0)  # (nq, 1), (1, nk)
        near = (kb - qb >= -((w - 1) // 2)) & (kb - qb <= w // 2)  # (nq, nk) sliding blocks
        g_left, g_right = (g + 1) // 2, g // 2  # first and last blocks, as in the reference
        g_q, g_k = (qb < g_left) | (qb >= nq - g_right), (kb < g_left) | (kb >= nk - g_right)
        table = near | g_q | g_k  # (nq, nk)
        gen = torch.Generator().manual_seed(self.seed)
        draw = torch.rand(nq, nk, generator=gen).masked_fill(table, 2.0)  # (nq, nk) taken last
        pick = draw.argsort(1)[:, :self.random_blocks]  # (nq, r) random key blocks
        rand = torch.zeros_like(table).scatter_(1, pick, True) & ~table  # (nq, nk)
        return table | rand, b

    def _edges(self, L, S):
        table, b = self._table(L, S)
        qb, kb = table.nonzero().T  # (Eb,), (Eb,) block edges
        nq_b = (L - qb * b).clamp(max=b)  # (Eb,) queries in block qb
        nk_b = (S - kb * b).clamp(max=b)  # (Eb,) keys in block kb
        e, off = _ragged(nq_b * nk_b)  # (E,), (E,)
        i = qb[e] * b + torch.div(off, nk_b[e], rounding_mode="floor")  # (E,)
        j = kb[e] * b + off % nk_b[e]  # (E,)
        return _sort_unique(j, i, S)  # (2, E)


def bigbird(block: int, window_blocks: int = 3, global_blocks: int = 2,
            random_blocks: int = 2, seed: int = 0) -> Pattern:
    """BigBird block-sparse attention (ITC) [3]_, as in the reference implementation.

    Rule, on blocks of ``block`` tokens (query block a = floor(i / b), key block
    c = floor(j / b), the last block partial when b does not divide L or S):
    (i, j) is an edge when c is one of the ``window_blocks`` blocks around a
    (a - floor((w-1)/2) <= c <= a + floor(w/2)), or a or c is global, or c is
    one of a's ``random_blocks`` random blocks. Global blocks are the first
    ceil(g / 2) and last floor(g / 2) blocks (g = 2: first and last, as in the
    reference). Random blocks are drawn per query block without replacement among
    the blocks not already attended, seeded; fewer when fewer remain. Roughly
    b L (w + g + r) edges plus g b L for the global rows. Bind before ``mask_mod``.

    Examples
    --------
    >>> p = bigbird(block=2, window_blocks=1, global_blocks=1, random_blocks=0)
    >>> p.name, p.mask(6).int().tolist()[4]
    ('bigbird_b2_w1_g1_r0_s0', [1, 1, 0, 0, 1, 1])
    """
    return _BigBird(_int("block", block, 1), _int("window_blocks", window_blocks),
                    _int("global_blocks", global_blocks), _int("random_blocks", random_blocks),
                    _int("seed", seed, None))


def longformer(window: int, global_indices=(0,)) -> Pattern:
    """Longformer attention [2]_: sliding window of size w (w / 2 each side) | global tokens.

    Rule: |i - j| <= w / 2, or i or j in ``global_indices`` (default [CLS] = 0).

    Examples
    --------
    >>> longformer(2).name, longformer(2).mask(3).int().tolist()
    ('longformer_w2_g0', [[1, 1, 1], [1, 1, 1], [1, 1, 1]])
    """
    g = global_tokens(global_indices)
    name = f"longformer_w{window}_g" + "_".join(map(str, g.indices.tolist()))
    call = f"longformer(window={window}, global_indices={g.indices.tolist()})"
    return _Composite("|", [longformer_window(window), g], name, call)


# ---------------------------------------------------------------- data-dependent
class _Scored(Pattern):
    """A pattern read off dense scores (L, S) of one layer and head; its size is fixed."""

    def __init__(self, table, name, call):
        super().__init__(name, call)
        self.table = table  # (L, S) bool

    def _sizes(self, L=None, S=None):
        shape = tuple(self.table.shape)
        got = super()._sizes(shape[0] if L is None else L, shape[1] if S is None else S)
        if got != shape:
            raise ValueError(f"Expected (L, S) == {shape}, the shape of 'scores' (got {got})")
        return got

    def edge_index(self, L=None, S=None):
        return super().edge_index(L, S)

    def mask(self, L=None, S=None):
        return super().mask(L, S)

    def _edges(self, L, S):
        i, j = self.table.nonzero().T  # (E,), (E,) row-major: sorted by i, then j
        return torch.stack([j, i])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        L, S = self.table.shape
        return self.table.to(q_idx.device)[q_idx.clamp(0, L - 1), kv_idx.clamp(0, S - 1)] \
            & (q_idx < L) & (kv_idx < S)


def _scores(scores) -> Tensor:
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        got = scores.dtype if isinstance(scores, Tensor) else type(scores).__name__
        raise TypeError(f"Expected 'scores' to be a floating-point Tensor (got {got})")
    if scores.dim() != 2:
        raise ValueError(f"Expected 'scores' to have shape (L, S) (got {tuple(scores.shape)}); "
                         f"pass one layer and head, e.g. weights[h]")
    if torch.isnan(scores).any():
        raise ValueError("Expected 'scores' without NaN (got NaN)")
    return scores.detach().cpu()


def topk(scores: Tensor, k: int) -> Pattern:
    """Top-k keys per query, chosen from dense scores (oracle pruning).

    Rule: for each query i, the min(k, S) keys j with the highest ``scores[i, j]``;
    ties go to the lower j; k >= S keeps all. L min(k, S) edges. ``scores`` is
    one layer and head, shape (L, S), pre-softmax scores or softmax weights (the
    ranking is the same). For H heads build one pattern per head:
    ``[topk(w[h], k).mask() for h in range(H)]``; ``edge_index()`` and ``mask()``
    default to the scores' (L, S), and other sizes raise ValueError.

    Examples
    --------
    >>> p = topk(torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.5, 0.0]]), k=1)
    >>> p.name, p.edge_index().tolist()
    ('topk_1', [[1, 0], [0, 1]])
    """
    scores, k = _scores(scores), _int("k", k)
    L, S = scores.shape
    order = scores.sort(dim=1, descending=True, stable=True).indices[:, :min(k, S)]  # (L, k)
    table = torch.zeros(L, S, dtype=torch.bool).scatter_(1, order, True)  # (L, S)
    return _Scored(table, f"topk_{k}", f"topk(scores=<Tensor {(L, S)}>, k={k})")


def threshold(scores: Tensor, tau: float) -> Pattern:
    """Keys whose score reaches a threshold: (i, j) is an edge when scores[i, j] >= tau.

    ``scores`` is one layer and head, shape (L, S); tau is in the scores' units
    (for softmax weights, a probability in [0, 1]). A query may keep no key
    (its output row is then exactly 0). Sizes as in :func:`topk`.

    Examples
    --------
    >>> threshold(torch.tensor([[0.1, 0.7], [0.5, 0.5]]), 0.5).edge_index().tolist()
    [[1, 0, 1], [0, 1, 1]]
    """
    scores = _scores(scores)
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or tau != tau:
        raise TypeError(f"Expected 'tau' to be a real number (got {tau!r})")
    return _Scored(scores >= tau, f"threshold_{tau:g}",
                   f"threshold(scores=<Tensor {tuple(scores.shape)}>, tau={tau!r})")


# ---------------------------------------------------------------- statistics
DIAMETER_MAX_L = 128  # networkx all-pairs BFS is Python-speed: skip above this


def stats(pattern: Pattern, L: int, p: int = 2) -> dict:
    """Size and connectivity of a pattern on L = S tokens.

    Parameters
    ----------
    pattern : Pattern
    L : int >= 0
    p : int >= 1
        Hop budget of the Sparse Transformer's criterion [1]_.

    Returns
    -------
    dict
        ``edges`` (int), ``density`` (edges / L^2, in [0, 1]), ``edges_per_query_min``,
        ``_mean``, ``_max`` (int, float, int), ``causal`` (no edge with j > i),
        ``reachable_within_p`` (every pair of the parent pattern, all j <= i if
        causal else all (i, j), joined by a path j -> ... -> i of at most p edges;
        j == i counts as reached in 0 hops), and ``diameter``: the most hops any
        parent pair needs (networkx BFS), None if a pair is unreachable or
        L > ``DIAMETER_MAX_L``.

    Notes
    -----
    Reachability uses a dense (L, L) matrix and p sparse products, O(p E L)
    time: meant for L up to a few thousand.

    Examples
    --------
    >>> s = stats(strided(4), 16)
    >>> s["edges"], s["causal"], s["reachable_within_p"], s["diameter"]
    (82, True, True, 2)
    """
    L, p = _int("L", L), _int("p", p, 1)
    src, dst = pattern.edge_index(L, L)  # (E,), (E,)
    per_query = torch.bincount(dst, minlength=L)  # (L,)
    is_causal = bool((src <= dst).all())
    parent = torch.ones(L, L, dtype=torch.bool)  # (L, L)
    parent = parent.tril() if is_causal else parent
    adj = torch.sparse_coo_tensor(torch.stack([dst, src]), torch.ones(src.numel()), (L, L),
                                  check_invariants=False)
    reach = torch.eye(L)  # (L, L) reach[i, j]: j reaches i within t hops
    for _ in range(p):
        reach = ((reach + torch.sparse.mm(adj, reach)) > 0).float()  # (L, L)
    out = {
        "edges": src.numel(),
        "density": src.numel() / (L * L) if L else 0.0,
        "edges_per_query_min": int(per_query.min()) if L else 0,
        "edges_per_query_mean": float(per_query.float().mean()) if L else 0.0,
        "edges_per_query_max": int(per_query.max()) if L else 0,
        "causal": is_causal,
        "reachable_within_p": bool(reach.bool()[parent].all()),
        "diameter": None,
    }
    if L <= DIAMETER_MAX_L:
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_nodes_from(range(L))
        graph.add_edges_from(zip(src.tolist(), dst.tolist()))  # j -> i
        hops, need = dict(nx.all_pairs_shortest_path_length(graph)), parent.nonzero().tolist()
        if all(i in hops[j] for i, j in need):
            out["diameter"] = max((hops[j][i] for i, j in need), default=0)
    return out


def is_pattern(obj) -> bool:
    """Whether ``obj`` is a :class:`Pattern` (the one check the package uses; a Tensor never is)."""
    return isinstance(obj, Pattern)
