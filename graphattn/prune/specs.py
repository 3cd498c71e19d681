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

import torch
from torch import Tensor

from graphattn import patterns
from graphattn.prune.keep import Spec, dense_weights, threshold_keep
from graphattn.validate import check_int

__all__ = ["Spec", "parse_spec", "as_spec", "dense_weights", "SPEC_HELP", "DEFAULT_PATTERNS", "threshold_keep"]

DEFAULT_PATTERNS = ["window:8", "longformer:window=16,global=0", "bigbird:block=8,random=1", "topk:4", "topk:16"]

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
random:32[,seed=0][,per=head]       32 random keys per query; per=head draws anew for every layer and head
global:0                            global tokens (all read them, they read all); several: global:0+5;
                                    by role: global:cls, global:sep (each sequence's last token),
                                    global:cls+sep, global:first4
topk:16                             the 16 highest-weight keys per query, per layer and head (oracle)
threshold:0.01                      keys whose dense weight is >= 0.01, per layer and head
a|b, a&b                            union, intersection, e.g. window:4|global:0
SPEC@layers=3-5                     only in layers 3 to 5 (from 0; dense elsewhere); layers=2 or 0+5 too
SPEC@heads=0-3                      only in heads 0 to 3 (dense in the others); both: SPEC@layers=1@heads=0"""


def _value(family: str, key: str, text: str, kind):
    try:
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if kind is str:
            if text not in ("model", "head"):
                raise ValueError(text)
            return text
        return [i for t in text.split("+") for i in _role(t.strip().lower())]  # index list: 0+5, cls+sep
    except ValueError:
        what = {int: "an int", float: "a number", str: "model or head"}.get(
            kind, "indices or roles like 0, 0+5, cls, sep, cls+sep, first4")
        raise ValueError(f"Expected '{key}' of spec '{family}' to be {what} (got {text!r})") from None


def _role(token: str) -> list[int]:
    """A global token by index or role: ``cls`` -> [0], ``sep``/``last`` -> [-1] (each sequence's last token),
    ``first4`` -> [0, 1, 2, 3], ``7`` -> [7].
    """
    if token == "cls":
        return [0]
    if token in ("sep", "last"):
        return [-1]
    if token.startswith("first") and token[5:].isdigit() and int(token[5:]) > 0:
        return list(range(int(token[5:])))
    value = int(token)  # ValueError for anything else
    if value < 0:
        raise ValueError(token)
    return [value]


def _global(indices: list[int]):
    """``global_tokens`` of fixed indices, or a pattern function when one is the last token (-1)."""
    fixed = sorted({i for i in indices if i >= 0})
    if -1 not in indices:
        return patterns.global_tokens(fixed)

    def mask(n: int) -> Tensor:
        return patterns.global_tokens(sorted({*(i for i in fixed if i < n), n - 1})).mask(n)  # (n, n)

    return mask


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
    "random": ((("k", int), ("seed", int), ("per", str)), lambda k, seed=0, per="model": patterns.random(k, seed)),
    "global": ((("indices", list),), _global),
    "topk": ((("k", int),), None),
    "threshold": ((("tau", float),), None),
}


def _per_head(k: int, seed: int):
    """BigBird-style random keys, drawn anew for every (layer, head).

    The draw of (layer, head) is ``patterns.random(k, seed * 1_000_003 + 1009 * layer + head)``.
    """
    def draw(n: int, layer: int, head: int) -> Tensor:
        return patterns.random(k, seed=seed * 1_000_003 + 1009 * layer + head).mask(n)  # (n, n)

    return draw


def _bad(text: str, why: str) -> ValueError:
    """The one spec error: the first line names the families (what the command prints), then examples."""
    return ValueError(f"Expected a pattern spec family[:args], family one of {', '.join(_FAMILIES)} "
                      f"(got {text!r}: {why}); 'graphattn prune --help' lists the valid specs with examples")


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
            return Spec.budgeted(text, f"topk_{k}", "topk", lambda w, valid: valid.sum(-1).clamp(max=k))
        elif family == "random" and kwargs.get("per") == "head":
            k, seed = check_int("k", kwargs["k"], low=1), kwargs.get("seed", 0)
            return Spec(text, f"random_{k}_s{seed}_per_head", family, None, draw=_per_head(k, seed))
        elif family == "threshold":
            tau = kwargs["tau"]
            if not 0.0 <= tau <= 1.0:
                raise ValueError(f"Expected 'tau' to be a weight in [0, 1] (got {tau})")
            return Spec(text, f"threshold_{tau:g}", "threshold", None, lambda w, valid: threshold_keep(w, tau))
        else:
            pat = build(**kwargs)
            if not patterns.is_pattern(pat):  # a pattern function (global:sep, the last token)
                name = "global_" + "+".join(str(i) if i >= 0 else "last" for i in kwargs["indices"])
                return Spec(text, name, family, None, mask_fn=pat)
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
    if not any(p.data_dependent for p in parts) and any(p.draw is not None for p in parts):  # per-head draws

        def draw(n: int, layer: int, head: int) -> Tensor:
            out = [p.draw(n, layer, head) if p.draw is not None else p.pattern_mask(n) for p in parts]  # (n, n)
            for m in out[1:]:
                out[0] = reduce(out[0], m)
            return out[0]

        return Spec(text, op.join(p.name for p in parts), family, None, draw=draw)
    if not any(p.data_dependent for p in parts):  # fixed parts, one a pattern function: still fixed

        def mask(n: int) -> Tensor:
            out = parts[0].pattern_mask(n)  # (n, n)
            for p in parts[1:]:
                out = reduce(out, p.pattern_mask(n))  # (n, n)
            return out

        return Spec(text, op.join(p.name for p in parts), family, None, mask_fn=mask)

    def select(weights: Tensor, valid: Tensor) -> Tensor:
        keep = parts[0].keep(weights, valid)  # (..., L, L)
        for p in parts[1:]:
            keep = reduce(keep, p.keep(weights, valid))  # (..., L, L)
        return keep

    return Spec(text, op.join(p.name for p in parts), family, None, select)


def _indices(text: str, what: str) -> frozenset:
    """``3-5`` -> {3, 4, 5}; ``0+5`` -> {0, 5}; ``2`` -> {2}."""
    out = set()
    for part in text.split("+"):
        lo, dash, hi = part.partition("-")
        try:
            lo, hi = int(lo), int(hi if dash else lo)
        except ValueError:
            raise _bad(text, f"expected {what} like 3-5, 2 or 0+5") from None
        if lo < 0 or hi < lo:
            raise _bad(text, f"expected {what} as a range low-high with 0 <= low <= high")
        out.update(range(lo, hi + 1))
    return frozenset(out)


def _span(indices: frozenset) -> str:
    """{3, 4, 5} -> ``3-5``; {0, 5} -> ``0+5``; {2} -> ``2``."""
    lo, hi = min(indices), max(indices)
    if len(indices) > 1 and indices == frozenset(range(lo, hi + 1)):
        return f"{lo}-{hi}"
    return "+".join(map(str, sorted(indices)))


def as_spec(item, name: str | None = None) -> Spec:
    """A spec from a string (:func:`parse_spec`), a :class:`Spec`, a Pattern, or a pattern function.

    A pattern function ``fn(n) -> Tensor (n, n) bool`` (True = may attend,
    rows = queries) is a fixed pattern of your own: it gets an oracle row like
    the built-in ones. Its name is ``name`` or the function's ``__name__``.

    Examples
    --------
    >>> import torch
    >>> def first_two(n):
    ...     return torch.zeros(n, n, dtype=torch.bool).index_fill_(1, torch.arange(min(2, n)), True)
    >>> as_spec(first_two).name, as_spec(first_two).data_dependent
    ('first_two', False)
    """
    if isinstance(item, Spec):
        return item
    if isinstance(item, str):
        return parse_spec(item)
    if patterns.is_pattern(item):
        return Spec(name or item.name, name or item.name, name or item.name, item)
    if callable(item):
        label = name or getattr(item, "__name__", "custom")
        return Spec(label, label, "custom", None, mask_fn=item)
    raise TypeError(f"Expected a spec to be a str, Spec, Pattern or pattern function (got {type(item).__name__})")


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
    if "@" in text:
        base, *scopes = text.split("@")
        spec = parse_spec(base)
        for scope in scopes:
            key, eq, val = scope.partition("=")
            if key.strip() not in ("layers", "heads") or not eq:
                raise _bad(text, f"expected @layers=... or @heads=... (got @{scope})")
            setattr(spec, key.strip(), _indices(val.strip(), key.strip()))
        spec.text = text
        scopes = [k for k in ("layers", "heads") if getattr(spec, k) is not None]
        suffix = "".join(f"@{k}={_span(getattr(spec, k))}" for k in scopes)
        spec.name += suffix
        return spec
    if "|" in text:
        return _combine(text, "|", [parse_spec(t) for t in text.split("|")])
    if "&" in text:
        return _combine(text, "&", [parse_spec(t) for t in text.split("&")])
    try:
        return _atom(text)
    except ValueError as err:
        if "lists the valid specs" in str(err):
            raise
        raise _bad(text, str(err)) from None
