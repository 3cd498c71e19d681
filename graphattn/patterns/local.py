"""Local patterns: full, causal and sliding windows (plain, dilated, Longformer, FlashAttention).

Every builder validates its parameters with :mod:`graphattn.validate` and
returns a :class:`~graphattn.patterns.Pattern`; see that class for the views.
"""

from __future__ import annotations

import torch

from graphattn.patterns.base import MAX_ELEMENTS, MAX_LENGTH, Pattern, _ragged, _TooLarge
from graphattn.patterns.spec import spec_family
from graphattn.validate import check_int, message

__all__ = ["full", "causal", "window", "dilated", "longformer_window", "flash_window"]


class _Full(Pattern):
    kind = "full"

    def _edges(self, L, S):
        if L * S > MAX_ELEMENTS:  # known exactly: refuse before the (L,) counts
            raise _TooLarge(L * S)
        rows, off = _ragged(torch.full((L,), S))  # (E,), (E,)
        return torch.stack([off, rows])  # (2, L * S)

    def _rule(self, q_idx, kv_idx):
        return (q_idx >= 0) & (kv_idx >= 0)


@spec_family("full")
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
        m = min(L, S)  # rows i < m read i + 1 keys, the other L - m rows all S
        count = m * (m + 1) // 2 + (L - m) * S
        if count > MAX_ELEMENTS:  # known exactly: refuse before the (L,) counts
            raise _TooLarge(count)
        rows, off = _ragged((torch.arange(L) + 1).clamp(max=S))  # (E,), (E,)
        return torch.stack([off, rows])  # (2, E)

    def _rule(self, q_idx, kv_idx):
        return kv_idx <= q_idx


@spec_family("causal")
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
        # |j - i| <= MAX_LENGTH, so a wider bound is no bound; the clamp keeps it an int64
        if self.left is not None:  # Python branch on a parameter, never on tensor values
            ok = ok & (diff >= -min(self.left * self.dilation, MAX_LENGTH + 1))
        if self.right is not None:
            ok = ok & (diff <= min(self.right * self.dilation, MAX_LENGTH + 1))
        return ok


def _window_spec(values: dict, positional: bool) -> dict:
    """``window:8`` (one size by position) is left = right = 8; ``window:left=4`` is refused, not half a window."""
    if positional and "right" not in values:
        values = {**values, "right": values["left"]}
    if "left" not in values and "right" not in values:
        raise ValueError("'window' needs a size, e.g. window:8 or window:left=4,right=2")
    if "left" not in values or "right" not in values:
        raise ValueError(
            "give both 'left' and 'right' (window:left=4,right=0 for one side), "
            "or one size, window:8, for left = right = 8"
        )
    return values


@spec_family("window", complete=_window_spec)
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
    dilation : int >= 1, default 1
        Gap d between keys; d > 1 is the dilated window of Longformer [2]_.

    Raises
    ------
    TypeError, ValueError
        For a non-int or negative ``left``/``right``, or ``dilation`` < 1.

    References
    ----------
    .. [2] Beltagy et al., "Longformer: The Long-Document Transformer", 2020.

    Examples
    --------
    >>> p = window(1, 0)
    >>> p.name, p.edge_index(3).tolist()
    ('window_1_0', [[0, 0, 1, 1, 2], [0, 1, 1, 2, 2]])
    """
    left = None if left is None else check_int("left", left)
    right = None if right is None else check_int("right", right)
    return _Window(left, right, check_int("dilation", dilation, 1))


def dilated(left: int, right: int, dilation: int = 2) -> Pattern:
    """Dilated sliding window [2]_: :func:`window` with a gap ``dilation`` between keys.

    Rule: j = i + d t, t in [-left, right], 0 <= j < S.

    References
    ----------
    .. [2] Beltagy et al., "Longformer: The Long-Document Transformer", 2020.

    Examples
    --------
    >>> dilated(1, 1, 2).mask(5)[2].int().tolist()
    [1, 0, 1, 0, 1]
    """
    return window(left, right, dilation)


def longformer_window(w: int) -> Pattern:
    """Longformer's sliding window of size w [2]_ (Section 3.1): w / 2 keys each side.

    Rule: ``|i - j| <= w / 2``, so w + 1 keys per query away from the edges. ``w``
    must be even, as in the reference implementation.

    References
    ----------
    .. [2] Beltagy et al., "Longformer: The Long-Document Transformer", 2020.

    Examples
    --------
    >>> longformer_window(4).name
    'window_2_2'
    """
    w = check_int("w", w)
    if w % 2:
        raise ValueError(message("w", "an even non-negative int", w))
    return window(w // 2, w // 2)


def flash_window(left: int, right: int) -> Pattern:
    """FlashAttention's ``window_size=(left, right)`` [4]_: keys in [i - left, i + right].

    Rule: inclusive on both sides, -1 means unbounded (``flash_window(-1, 0)`` is
    causal). Equal to FlashAttention for L == S; for L != S FlashAttention aligns
    bottom-right (it shifts i by S - L), whereas this pattern is top-left aligned.

    References
    ----------
    .. [4] Dao, "FlashAttention-2", 2023 (``flash_attn_func(window_size=...)``).

    Examples
    --------
    >>> flash_window(-1, 0).kind
    'causal'
    """
    left, right = (check_int(name, v, -1, None) for name, v in (("left", left), ("right", right)))
    return window(None if left == -1 else left, None if right == -1 else right)
