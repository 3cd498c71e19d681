"""Mixtures: global tokens, random keys, BigBird and Longformer.

``random`` and ``bigbird`` depend on (L, S) through their random draws; they
take an explicit seed and never touch the global RNG, so they are the same in
training and evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from graphattn.patterns.base import (
    MAX_ELEMENTS,
    Pattern,
    _check_elements,
    _Composite,
    _ragged,
    _Sized,
    _sort_unique,
    _TooLarge,
)
from graphattn.patterns.local import longformer_window
from graphattn.patterns.spec import spec_family
from graphattn.validate import as_int, check_int, message

__all__ = ["global_tokens", "random", "bigbird", "longformer"]

SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


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


@spec_family("global")
def global_tokens(indices: Sequence[int] | int | Tensor) -> _Global:
    """Global tokens: every global token reads all keys and is read by all queries.

    Rule: i in G or j in G (symmetric). Indices >= L (queries) or >= S (keys) are
    ignored, so one pattern serves every length; negative indices raise. For
    L == S and ``g = |G ∩ [0, L)|``: ``2 g L - g^2`` edges.

    Examples
    --------
    >>> global_tokens([0]).mask(3).int().tolist()
    [[1, 1, 1], [1, 0, 0], [1, 0, 0]]
    """
    seq = indices.reshape(-1).tolist() if isinstance(indices, Tensor) else indices
    if as_int(seq) is not None:
        seq = [seq]
    if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
        raise TypeError(message("indices", "an int or a sequence of non-negative ints", repr(seq)))
    idx = sorted({check_int("indices", v) for v in seq})
    return _Global(torch.tensor(idx, dtype=torch.long))


DRAW_CHUNK = 2**20  # random numbers drawn at once by the dense draw: rows of S per chunk


def _dense_draw(L: int, S: int, k: int, g: torch.Generator) -> Tensor:
    """K distinct keys per row for 8 k > S: the top k of S uniform numbers, in chunks of rows.

    The k largest of S i.i.d. uniforms are a uniform k-subset; E = L k > L S / 8,
    so the L S numbers drawn are fewer than 8 E. float64 makes ties negligible.
    """
    rows = max(1, DRAW_CHUNK // S)
    parts = [
        torch.rand(min(rows, L - r), S, generator=g, dtype=torch.float64).topk(k, dim=1).indices
        for r in range(0, L, rows)
    ]  # [(rows, k)]
    return torch.cat(parts)  # (L, k)


def _sparse_draw(L: int, S: int, k: int, g: torch.Generator) -> Tensor:
    """K distinct keys per row for 8 k <= S, by rejection: O(L k log k), no (L, S) grid.

    Each try draws m = 2 k + 2 keys with replacement per row; a row with at
    least k distinct values keeps a uniform k-subset of them (random priorities),
    the others draw again. Both steps are symmetric in the key labels, so the
    kept subset is uniform among all k-subsets. With k <= S / 8, m draws give
    about S (1 - e^(-m/S)) >= 1.77 k distinct keys: rows almost never retry.
    """
    keys, todo, m = torch.empty(L, k, dtype=torch.long), torch.arange(L), 2 * k + 2
    while todo.numel():
        draw = torch.randint(0, S, (todo.numel(), m), generator=g).sort(1).values  # (n, m)
        first = torch.ones_like(draw, dtype=torch.bool)  # (n, m) first copy of each value
        first[:, 1:] = draw[:, 1:] != draw[:, :-1]
        priority = torch.rand(draw.shape, generator=g, dtype=torch.float64).masked_fill(~first, 2.0)  # (n, m)
        pick = draw.gather(1, priority.topk(k, dim=1, largest=False).indices)  # (n, k)
        ok = first.sum(1) >= k  # (n,)
        keys[todo[ok]] = pick[ok]
        todo = todo[~ok]
    return keys  # (L, k)


class _Random(_Sized):
    def __init__(self, k, seed):
        self.k, self.seed = k, seed
        super().__init__(f"random_{k}_s{seed}", f"random(k={k}, seed={seed})")

    def _keys(self, L, S):
        g, k = torch.Generator().manual_seed(self.seed), min(self.k, S)
        if k == 0:
            return torch.empty(L, 0, dtype=torch.long)  # (L, 0)
        if L * k > MAX_ELEMENTS:  # before drawing; edge_index says which L and S
            raise _TooLarge(L * k)
        keys = _dense_draw(L, S, k, g) if 8 * k > S else _sparse_draw(L, S, k, g)  # (L, k)
        return keys.sort(1).values  # (L, k)

    def _edges(self, L, S):
        keys = self._keys(L, S)  # (L, k)
        rows = torch.arange(L).repeat_interleave(keys.shape[1])  # (L k,)
        return torch.stack([keys.reshape(-1), rows])  # (2, L k)

    def _table(self, L, S):
        _check_elements(L, S, f"the lookup table of {self.name}")
        keys = self._keys(L, S)  # (L, k)
        return torch.zeros(L, S, dtype=torch.bool).scatter_(1, keys, True), 1  # (L, S)


@spec_family("random")
def random(k: int, seed: int = 0) -> Pattern:
    """Random keys: each query reads min(k, S) distinct keys drawn uniformly.

    Rule: for each i, a uniform random subset of {0, ..., S - 1} of size min(k, S),
    drawn from ``torch.Generator().manual_seed(seed)``: the same for the same
    (L, S, seed), in training and evaluation alike; the global RNG is untouched.
    L min(k, S) edges, drawn in O(E log S) time and O(E) memory: by rejection
    for 8 k <= S, as the top k of S uniform numbers per row otherwise. Bind before
    using ``mask_mod``: ``random(k).bind(L, S).mask_mod``.

    Parameters
    ----------
    k : int >= 0
        Keys per query; k >= S keeps all.
    seed : int, default 0
        Any seed ``torch.Generator.manual_seed`` accepts, in [-2**63, 2**64 - 1].

    Examples
    --------
    >>> p = random(2, seed=0)
    >>> p.name, p.edge_index(4).shape, p.mask(4).sum(1).tolist()
    ('random_2_s0', torch.Size([2, 8]), [2, 2, 2, 2])
    """
    return _Random(check_int("k", k), check_int("seed", seed, *SEED_RANGE))


class _BigBird(_Sized):
    def __init__(self, block, window_blocks, global_blocks, random_blocks, seed):
        self.block, self.window_blocks, self.global_blocks = block, window_blocks, global_blocks
        self.random_blocks, self.seed = random_blocks, seed
        args = (block, window_blocks, global_blocks, random_blocks, seed)
        super().__init__(
            "bigbird_b{}_w{}_g{}_r{}_s{}".format(*args),
            "bigbird(block={}, window_blocks={}, global_blocks={}, random_blocks={}, seed={})".format(*args),
        )

    def _table(self, L, S):
        b, w, g = self.block, self.window_blocks, self.global_blocks
        nq, nk = -(-L // b), -(-S // b)  # blocks, the last one possibly partial
        _check_elements(nq, nk, f"the block table of {self.name}", "ceil(L / block) * ceil(S / block)")
        qb, kb = torch.arange(nq).unsqueeze(1), torch.arange(nk).unsqueeze(0)  # (nq, 1), (1, nk)
        near = (kb - qb >= -((w - 1) // 2)) & (kb - qb <= w // 2)  # (nq, nk) sliding blocks
        g_left, g_right = (g + 1) // 2, g // 2  # first and last blocks, as in the reference
        g_q, g_k = (qb < g_left) | (qb >= nq - g_right), (kb < g_left) | (kb >= nk - g_right)
        table = near | g_q | g_k  # (nq, nk)
        gen = torch.Generator().manual_seed(self.seed)
        draw = torch.rand(nq, nk, generator=gen).masked_fill(table, 2.0)  # (nq, nk) taken last
        pick = draw.argsort(1)[:, : self.random_blocks]  # (nq, r) random key blocks
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


@spec_family("bigbird")
def bigbird(
    block: int, window_blocks: int = 3, global_blocks: int = 2, random_blocks: int = 2, seed: int = 0
) -> Pattern:
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

    References
    ----------
    .. [3] Zaheer et al., "Big Bird: Transformers for Longer Sequences", 2020.

    Examples
    --------
    >>> p = bigbird(block=2, window_blocks=1, global_blocks=1, random_blocks=0)
    >>> p.name, p.mask(6).int().tolist()[4]
    ('bigbird_b2_w1_g1_r0_s0', [1, 1, 0, 0, 1, 1])
    """
    return _BigBird(
        check_int("block", block, 1),
        check_int("window_blocks", window_blocks),
        check_int("global_blocks", global_blocks),
        check_int("random_blocks", random_blocks),
        check_int("seed", seed, *SEED_RANGE),
    )


@spec_family("longformer")
def longformer(window: int, global_indices: Sequence[int] = (0,)) -> Pattern:
    """Longformer attention [2]_: sliding window of size w (w / 2 each side) | global tokens.

    Rule: ``|i - j| <= w / 2``, or i or j in ``global_indices`` (default [CLS] = 0).

    References
    ----------
    .. [2] Beltagy et al., "Longformer: The Long-Document Transformer", 2020.

    Examples
    --------
    >>> longformer(2).name, longformer(2).mask(3).int().tolist()
    ('longformer_w2_g0', [[1, 1, 1], [1, 1, 1], [1, 1, 1]])
    """
    g = global_tokens(global_indices)
    name = f"longformer_w{window}_g" + "_".join(map(str, g.indices.tolist()))
    call = f"longformer(window={window}, global_indices={g.indices.tolist()})"
    return _Composite("|", [longformer_window(window), g], name, call)
