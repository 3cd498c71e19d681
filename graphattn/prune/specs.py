"""Short pattern specs for the command line: ``window:8``, ``topk:16``, ``window:4|global:0``.

A spec names a pattern family and its parameters, ``family[:args]``, where
``args`` are comma-separated ``key=value`` pairs or positional values in the
order listed below. ``a|b`` is the union of two specs and ``a&b`` their
intersection (``&`` binds tighter). Each spec becomes a :class:`Spec` whose
``keep(weights, valid)`` gives the kept edges of one layer for every head: fixed
patterns come from :mod:`graphattn.patterns`; ``topk`` and ``threshold`` are
chosen from the dense weights of the layer and head they prune.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from graphattn import patterns
from graphattn.patterns import topk_mask
from graphattn.validate import check_int

__all__ = ["Spec", "parse_spec", "SPEC_HELP", "DEFAULT_PATTERNS", "threshold_keep"]

DEFAULT_PATTERNS = ["window:2", "window:8", "window:32", "longformer:window=16,global=0",
                    "bigbird:block=8,random=1", "random:16", "strided:16", "topk:4", "topk:16", "threshold:0.02"]

SPEC_HELP = """\
full                                complete graph (dense attention)
causal                              j <= i
window:8                            symmetric window, left = right = 8 (FlashAttention's inclusive
                                    (left, right)); 17 keys per query away from the ends
window:left=4,right=2[,dilation=2]  any window
longformer:window=16[,global=0]     Longformer: window w, w/2 each side (w even), | global tokens;
                                    several global tokens: global=0+5
strided:16                          Sparse Transformer strided (causal, as in the paper)
fixed:block=16,summary=2            Sparse Transformer fixed (causal, as in the paper)
bigbird:block=16[,window=3,global=2,random=2,seed=0]
                                    BigBird blocks (window, global, random counted in blocks)
random:32[,seed=0]                  32 random keys per query
global:0                            global tokens (all read them, they read all); several: global:0+5
topk:16                             the 16 highest-weight keys per query, per layer and head (oracle)
threshold:0.01                      keys whose dense weight is >= 0.01, per layer and head
a|b, a&b                            union, intersection, e.g. window:4|global:0"""


def threshold_keep(weights: Tensor, tau: float) -> Tensor:
    """Keys whose dense weight reaches ``tau``, per head: (..., L, S) -> (..., L, S) bool."""
    return weights >= tau


@dataclass
class Spec:
    """A parsed spec: what to keep in one layer, for every head.

    Attributes
    ----------
    text : str
        The spec as written.
    name : str
        Canonical name (the pattern's name, e.g. ``window_8_8``, ``topk_16``).
    family : str
        Curve label in plots: ``window``, ``topk``, ``window|global``, ...
    pattern : Pattern or None
        The fixed pattern (None for data-dependent specs).
    """

    text: str
    name: str
    family: str
    pattern: patterns.Pattern | None = None
    _select: Callable[[Tensor, Tensor], Tensor] | None = field(default=None, repr=False)  # (weights, valid)
    _masks: dict = field(default_factory=dict, repr=False)

    @property
    def data_dependent(self) -> bool:
        return self.pattern is None

    def pattern_mask(self, n: int) -> Tensor:
        """The fixed pattern's mask on n tokens, (n, n) bool (cached)."""
        if n not in self._masks:
            self._masks[n] = self.pattern.mask(n)  # (n, n)
        return self._masks[n]

    def keep(self, weights: Tensor, valid: Tensor | None = None) -> Tensor:
        """Kept edges of one layer, for every head, inside the model's own graph.

        Parameters
        ----------
        weights : Tensor, shape (..., L, L)
            Dense weights of the layer (rows = queries, softmax over the valid keys).
        valid : Tensor, shape (..., L, L), dtype bool, optional
            The model's graph (padding, causality), broadcastable to
            ``weights``; a sequence's tokens are those some query reads, and a
            fixed pattern is laid over them in order (so left and right padding
            agree). Default: every edge.

        Returns
        -------
        Tensor, dtype bool
            True = may attend, inside ``valid``: shape ``valid.shape`` for a
            fixed pattern (one mask for all heads), ``weights.shape`` otherwise.
        """
        if valid is None:
            valid = torch.ones(weights.shape[-2:], dtype=torch.bool, device=weights.device)  # (L, L)
        if self.pattern is not None:
            return self._placed(valid)
        return self._select(weights, valid) & valid

    def _placed(self, valid: Tensor) -> Tensor:
        """The fixed pattern on each sequence's own tokens, inside ``valid (..., L, L)``."""
        present = valid.any(-2).reshape(-1, valid.shape[-1])  # (sequences, L): tokens that exist
        out = torch.zeros(present.shape[0], valid.shape[-2], valid.shape[-1], dtype=torch.bool,
                          device=valid.device)  # (sequences, L, L)
        for sequence, tokens in zip(out, present):
            where = tokens.nonzero().squeeze(1)  # (n,): positions of the n tokens
            sequence[where.unsqueeze(1), where] = self.pattern_mask(where.numel()).to(valid.device)  # (n, n)
        return out.view(valid.shape) & valid  # (..., L, L)


def _value(family: str, key: str, text: str, kind):
    try:
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        return [int(t) for t in text.split("+")]  # index list: 0+5
    except ValueError:
        what = {int: "an int", float: "a number"}.get(kind, "indices like 0 or 0+5")
        raise ValueError(f"Expected '{key}' of spec '{family}' to be {what} (got {text!r})") from None


# family -> (parameters in positional order with types, builder(**kwargs) -> Pattern or selector)
_FAMILIES = {
    "full": ((), lambda: patterns.full()),
    "causal": ((), lambda: patterns.causal()),
    "window": ((("left", int), ("right", int), ("dilation", int)), None),
    "longformer": ((("window", int), ("global", list)),
                   lambda window, **kw: patterns.longformer(window, kw.get("global", [0]))),
    "strided": ((("stride", int),), lambda stride: patterns.strided(stride)),
    "fixed": ((("block", int), ("summary", int)), lambda block, summary: patterns.fixed(block, summary)),
    "bigbird": ((("block", int), ("window", int), ("global", int), ("random", int), ("seed", int)),
                lambda block, **kw: patterns.bigbird(block, kw.get("window", 3), kw.get("global", 2),
                                                     kw.get("random", 2), kw.get("seed", 0))),
    "random": ((("k", int), ("seed", int)), lambda k, seed=0: patterns.random(k, seed)),
    "global": ((("indices", list),), lambda indices: patterns.global_tokens(indices)),
    "topk": ((("k", int),), None),
    "threshold": ((("tau", float),), None),
}


def _bad(text: str, why: str) -> ValueError:
    """The one spec error: the first line names the families (what the command prints), then examples."""
    return ValueError(f"Expected a pattern spec family[:args], family one of {', '.join(_FAMILIES)} "
                      f"(got {text!r}: {why}); see 'graphattn prune --help'. Valid specs:\n{SPEC_HELP}")


def _window(left=None, right=None, dilation=1):
    if left is None and right is None:
        raise ValueError("Expected 'window' to get a size, e.g. window:8 or window:left=4,right=4")
    left = right if left is None else left
    right = left if right is None else right  # window:8 -> left = right = 8
    return patterns.window(left, right, dilation)


def _atom(text: str) -> Spec:
    family, _, args = text.strip().partition(":")
    family = family.strip().lower()
    if family not in _FAMILIES:
        raise _bad(text, f"unknown family {family!r}")
    params, build = _FAMILIES[family]
    names = [p for p, _ in params]
    kwargs = {}
    for pos, item in enumerate(a.strip() for a in args.split(",") if a.strip()):
        key, eq, val = item.partition("=")
        if not eq:
            key, val = (names[pos] if pos < len(names) else None), item
        key = key.strip().lower()
        if key not in names:
            raise _bad(text, f"{family!r} takes {', '.join(names) or 'no parameters'} (got {key or item!r})")
        if key in kwargs:
            raise _bad(text, f"{key!r} given twice")
        kwargs[key] = _value(family, key, val.strip(), dict(params)[key])
    try:
        if family == "window":
            pat = _window(**kwargs)
        elif family == "topk":
            k = check_int("k", kwargs["k"], low=1)
            # min(k, valid keys) per query: padding rows keep 0, so no tie among their equal weights
            return Spec(text, f"topk_{k}", "topk", None,
                        lambda w, valid: topk_mask(w, valid.sum(-1).clamp(max=k)))
        elif family == "threshold":
            tau = kwargs["tau"]
            if not 0.0 <= tau <= 1.0:
                raise ValueError(f"Expected 'tau' to be a weight in [0, 1] (got {tau})")
            return Spec(text, f"threshold_{tau:g}", "threshold", None, lambda w, valid: threshold_keep(w, tau))
        else:
            pat = build(**kwargs)
    except KeyError as err:
        raise _bad(text, f"missing parameter {err.args[0]!r}") from None
    except TypeError as err:  # a missing positional parameter of a builder
        raise _bad(text, str(err)) from None
    return Spec(text, pat.name, family, pat)


def _combine(text: str, op: str, parts: list[Spec]) -> Spec:
    family = op.join(dict.fromkeys(p.family for p in parts))
    if all(p.pattern is not None for p in parts):
        pat = parts[0].pattern
        for p in parts[1:]:
            pat = (pat | p.pattern) if op == "|" else (pat & p.pattern)
        return Spec(text, pat.name, family, pat)
    reduce = torch.logical_or if op == "|" else torch.logical_and

    def select(weights: Tensor, valid: Tensor) -> Tensor:
        keep = parts[0].keep(weights, valid)  # (..., L, L)
        for p in parts[1:]:
            keep = reduce(keep, p.keep(weights, valid))  # (..., L, L)
        return keep

    return Spec(text, op.join(p.name for p in parts), family, None, select)


def parse_spec(text: str) -> Spec:
    """Parse a spec string into a :class:`Spec` (see :data:`SPEC_HELP`).

    Parameters
    ----------
    text : str
        ``family[:args]``, or specs joined by ``|`` (union) and ``&``
        (intersection, binds tighter).

    Returns
    -------
    Spec

    Raises
    ------
    ValueError
        For an unknown family, an unknown, repeated, missing or malformed
        parameter, or a value the pattern refuses; the message lists the valid
        specs with examples.

    Examples
    --------
    >>> parse_spec("window:8").name
    'window_8_8'
    >>> parse_spec("longformer:window=16,global=0").name
    'longformer_w16_g0'
    >>> parse_spec("window:4|global:0").family
    'window|global'
    """
    if not isinstance(text, str) or not text.strip():
        raise _bad(str(text), "empty")
    if "|" in text:
        return _combine(text, "|", [parse_spec(t) for t in text.split("|")])
    if "&" in text:
        return _combine(text, "&", [parse_spec(t) for t in text.split("&")])
    try:
        return _atom(text)
    except ValueError as err:
        if "Valid specs" in str(err):
            raise
        raise _bad(text, str(err)) from None
