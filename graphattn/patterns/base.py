"""The pattern object: three views of one rule, composition, size limits, ``is_pattern``.

A :class:`Pattern` turns (L, S) into an edge list, a dense mask, or a
FlexAttention ``mask_mod``. Subclasses implement ``_edges(L, S)`` (sorted by
target, then source, O(E)) and ``_rule(q_idx, kv_idx)`` (an elementwise
predicate). Size-dependent patterns (random draws) derive from ``_Sized`` and
are bound to one (L, S) by ``bind``.
"""

from __future__ import annotations

import functools
import operator
from typing import TypeGuard

import torch
from torch import Tensor

from graphattn.validate import check_int, message

__all__ = ["Pattern", "is_pattern", "MAX_LENGTH", "MAX_ELEMENTS"]

MAX_LENGTH = 2**31 - 1  # largest L or S: the int32 index range of the CSR and CUDA kernels
MAX_ELEMENTS = 2**31  # most edges (a (2, E) int64 list of 32 GiB) or dense mask entries one call builds


class _TooLarge(ValueError):
    """Raised by :func:`_ragged` before it allocates more than ``MAX_ELEMENTS`` items."""


def _ragged(counts: Tensor) -> tuple[Tensor, Tensor]:
    """Row id and offset within the row for ``counts[r]`` items in each row r.

    Refuses (``_TooLarge``) a total above ``MAX_ELEMENTS`` before allocating it;
    ``Pattern.edge_index`` turns that into a ValueError naming L and S.
    """
    total = int(counts.sum())  # counts[r] <= S <= 2**31 and R <= 2**31: no int64 overflow
    if total > MAX_ELEMENTS:
        raise _TooLarge(total)
    rows = torch.repeat_interleave(torch.arange(counts.numel()), counts, output_size=total)  # (E,)
    starts = torch.cumsum(counts, 0) - counts  # (R,)
    return rows, torch.arange(total) - starts[rows]  # (E,), (E,)


def _sort_unique(j: Tensor, i: Tensor, S: int) -> Tensor:
    """Edges (j, i) sorted by target, then source, duplicates dropped (keys i S + j < 2**62)."""
    key = torch.unique(i * S + j)  # (E,) sorted
    return torch.stack([key % S, key // S])  # (2, E)


def _check_elements(L: int, S: int, what: str, name: str = "L * S") -> None:
    """Refuse an (L, S) grid of more than ``MAX_ELEMENTS`` entries before allocating it."""
    if L * S > MAX_ELEMENTS:
        raise ValueError(
            message(
                name,
                f"at most {MAX_ELEMENTS} for {what}",
                f"{L} * {S} = {L * S}",
                "use edge_index(L, S), which is O(E)",
            )
        )


class Pattern:
    """A rule saying which keys j each query i may read (see :mod:`graphattn.patterns`).

    Attributes: ``name`` (after the parameters, for test ids and plot titles) and
    ``kind`` ("full", "causal" or None: lets the kernels take a dense fast path).
    Subclasses implement ``_edges(L, S)`` (sorted, O(E)) and ``_rule(q_idx, kv_idx)``.

    Sizes: ``L`` and ``S`` are ints in ``[0, MAX_LENGTH]``; ``edge_index`` refuses
    more than ``MAX_ELEMENTS`` edges and ``mask`` more than ``MAX_ELEMENTS``
    entries (ValueError) before allocating them.

    Examples
    --------
    >>> from graphattn.patterns import window, global_tokens
    >>> p = window(1, 1) | global_tokens([0])
    >>> p.name, p.kind, p.edge_index(4).shape, p.mask(4).sum().item()
    ('window_1_1|global_0', None, torch.Size([2, 14]), 14)
    >>> from torch.nn.attention.flex_attention import create_block_mask
    >>> create_block_mask(p.mask_mod, None, None, 4, 4, device="cpu").shape
    (1, 1, 4, 4)
    """

    kind: str | None = None  # "full" or "causal" lets the kernels dispatch to dense paths

    def __init__(self, name: str, call: str):
        self.name, self._call = name, call

    def __repr__(self) -> str:
        return self._call

    def _sizes(self, L, S):
        L = check_int("L", L, 0, MAX_LENGTH)
        return L, (L if S is None else check_int("S", S, 0, MAX_LENGTH))

    def _edges(self, L: int, S: int) -> Tensor:
        """The edges ``(2, E)`` for a query side of ``L`` and a key side of ``S``, sorted by target then source."""
        raise NotImplementedError(f"{type(self).__name__} does not define _edges")

    def _rule(self, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        """The elementwise predicate: True where query ``q_idx`` may read key ``kv_idx``."""
        raise NotImplementedError(f"{type(self).__name__} does not define _rule")

    def edge_index(self, L: int, S: int | None = None) -> Tensor:
        """Edges (2, E), int64: row 0 = key j, row 1 = query i, sorted by i then j.

        Raises
        ------
        TypeError, ValueError
            ``L`` or ``S`` not an int in ``[0, MAX_LENGTH]``, or more than
            ``MAX_ELEMENTS`` edges.
        """
        L, S = self._sizes(L, S)
        if L == 0 or S == 0:
            return torch.empty(2, 0, dtype=torch.long)
        try:
            return self._edges(L, S)
        except _TooLarge as err:
            raise ValueError(
                message(
                    "L and S",
                    f"sizes giving at most {MAX_ELEMENTS} edges of {self.name}",
                    f"L = {L}, S = {S}: {err.args[0]} edges",
                )
            ) from None

    def mask(self, L: int, S: int | None = None) -> Tensor:
        """Dense BoolTensor (L, S); True = query i may attend key j.

        Raises
        ------
        TypeError, ValueError
            As :meth:`edge_index`, and ``L * S > MAX_ELEMENTS``.
        """
        L, S = self._sizes(L, S)
        _check_elements(L, S, "a dense mask")
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


def is_pattern(obj) -> TypeGuard[Pattern]:
    """True if ``obj`` is a :class:`Pattern`: THE one check, used wherever a pattern or a tensor may come.

    Examples
    --------
    >>> from graphattn.patterns import causal
    >>> is_pattern(causal()), is_pattern(causal().edge_index(3))
    (True, False)
    """
    return isinstance(obj, Pattern)


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
        # key i * S + j < L * S <= 2**62 orders edges by target, then source, and is one int64
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


class _Sized(Pattern):
    """A pattern whose edges depend on (L, S); ``mask_mod`` needs ``bind(L, S)``.

    Subclasses implement ``_table(L, S) -> (table, block)``: a bool table over
    blocks of ``block`` queries and keys, (ceil(L / block), ceil(S / block)).
    """

    def _rule(self, q_idx, kv_idx):
        raise ValueError(
            message(
                "pattern",
                "bound to (L, S) before its mask_mod is used",
                f"{self.name}, whose keys depend on (L, S)",
                "use pattern.bind(L, S).mask_mod",
            )
        )

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
