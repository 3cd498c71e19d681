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

import functools
import operator

from torch import Tensor

from graphattn import patterns
from graphattn.patterns import spec as spec_text
from graphattn.prune.keep import Drawn, Fixed, Selected, Spec, dense_weights
from graphattn.validate import check_int, message

__all__ = [
    "Spec",
    "Span",
    "parse_spec",
    "check_spec",
    "as_spec",
    "dense_weights",
    "SPEC_HELP",
    "DEFAULT_PATTERNS",
    "reseed",
    "SEEDED",
]

DEFAULT_PATTERNS = ["window:8", "longformer:window=16,global=0", "bigbird:block=8,random=1", "topk:4", "topk:16"]

SPEC_HELP = """\
full                                complete graph (dense attention)
causal                              j <= i
window:8                            symmetric window, left = right = 8 (FlashAttention's inclusive
                                    (left, right)); 17 keys per query away from the ends
window:left=4,right=2[,dilation=2]  any window (both sides named: window:left=4,right=0 is one-sided)
longformer:window=16[,global=0]     Longformer: window w, w/2 each side (w even), | global tokens;
                                    several global tokens: global=0+5; by role as for global: global=cls+sep
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
SPEC@layers=3-5                     only in layers 3 to 5 (from 0; dense elsewhere); layers=2 or 0+5 too;
                                    checked against the model before it loads
SPEC@heads=0-3                      only in heads 0 to 3 (dense in the others); both: SPEC@layers=1@heads=0"""


MAX_FIRST = 4096  # global:firstN lists N indices; more positions than any model here reads (512, 1024)


def _roles(text: str) -> list[int]:
    """``0+5`` -> [0, 5]; ``cls`` -> [0]; ``sep``/``last`` -> [-1] (each sequence's last token);
    ``first4`` -> [0, 1, 2, 3]; anything else raises ValueError.
    """
    out = []
    for token in (t.strip().lower() for t in text.split("+")):
        if token == "cls":
            out.append(0)
        elif token in ("sep", "last"):
            out.append(-1)
        elif token.startswith("first"):  # first0, first-1, first99999999 (a list that size) refused
            count = spec_text.INT.convert(token[5:])
            if not 0 < count <= MAX_FIRST:
                raise ValueError(token)
            out.extend(range(count))
        elif spec_text.INT.convert(token) < 0:  # ValueError for anything else
            raise ValueError(token)
        else:
            out.append(int(token))
    return out


ROLES = spec_text.Kind(_roles, f"indices or roles like 0, 0+5, cls, sep, cls+sep, first4 (firstN: N <= {MAX_FIRST})")


def _per(text: str) -> str:
    if text.lower() not in ("model", "head"):
        raise ValueError(text)
    return text.lower()


PER = spec_text.Kind(_per, "model or head")


# the grammar of graphattn.patterns (read off the builders' signatures), index lists read as roles;
# random keys may be drawn per head; topk and threshold (scored builders) select from the dense weights
def _families() -> dict[str, spec_text.Family]:
    return {
        name: family.with_kinds({spec_text.INDICES: ROLES}, (("per", PER),) if name == "random" else ())
        for name, family in spec_text.FAMILIES.items()
    }


def _global(indices: list[int]):
    """``global_tokens`` of fixed indices, or a pattern function when one is the last token (-1)."""
    fixed = sorted({i for i in indices if i >= 0})
    if -1 not in indices:
        return patterns.global_tokens(fixed)

    def mask(n: int) -> Tensor:
        return patterns.global_tokens(sorted({*(i for i in fixed if i < n), n - 1})).mask(n)  # (n, n)

    return mask


def _per_head(k: int, seed: int):
    """BigBird-style random keys, drawn anew for every (layer, head).

    The draw of (layer, head) is ``patterns.random(k, seed * 1_000_003 + 1009 * layer + head)``.
    """

    def draw(n: int, layer: int, head: int) -> Tensor:
        return patterns.random(k, seed=seed * 1_000_003 + 1009 * layer + head).mask(n)  # (n, n)

    return draw


def _bad(text: str, why: str) -> ValueError:
    """The one spec error: one line naming the spec and the families, then where the examples are."""
    return ValueError(
        f"Expected a pattern spec family[:args], family one of {', '.join(_families())} "
        f"(got {text!r}: {why}); 'graphattn prune --help' lists the valid specs with examples"
    )


def _role_names(indices: list[int]) -> str:
    return "+".join(str(i) if i >= 0 else "last" for i in indices)


def _atom(text: str, whole: str) -> Spec:
    try:
        family, kwargs = spec_text.parse_atom(text, _families(), whole)
    except spec_text.SpecError as err:
        raise _bad(whole, err.why) from None
    roles = kwargs.get("indices", kwargs.get("global", [])) if family in ("global", "longformer") else []
    try:
        if family == "topk":
            k = check_int("k", kwargs["k"], low=1)
            # min(k, valid keys) per query: padding rows keep 0, so no tie among their equal weights
            return Spec.budgeted(text, f"topk_{k}", "topk", lambda w, valid: valid.sum(-1).clamp(max=k))
        if family == "threshold":
            tau, name = kwargs["tau"], f"threshold_{kwargs['tau']:g}"
            if not 0.0 <= tau <= 1.0:
                raise ValueError(message("tau", "a weight in [0, 1]", tau))
            return Spec(text, name, "threshold", Selected(lambda w, valid: patterns.threshold_mask(w, tau), name))
        if family == "random" and kwargs.pop("per", "model") == "head":
            k, seed = check_int("k", kwargs["k"], low=0), kwargs.get("seed", 0)  # as patterns.random: 0 keys, empty
            name = f"random_{k}_s{seed}_per_head"
            return Spec(text, name, family, Drawn(_per_head(k, seed), name))
        if -1 in roles:  # the last token of each sequence: a pattern function of the length
            tokens = _global(roles)
            if family == "global":
                name = "global_" + _role_names(roles)
                return Spec(text, name, family, Fixed(tokens, name))
            local = patterns.longformer_window(check_int("window", kwargs["window"], low=0))

            def mask(n: int) -> Tensor:
                return local.mask(n) | tokens(n)  # (n, n)

            name = f"longformer_w{kwargs['window']}_g" + _role_names(roles)
            return Spec(text, name, family, Fixed(mask, name))
        pat = spec_text.build(family, kwargs)
    except KeyError as err:
        raise _bad(whole, f"missing parameter {err.args[0]!r}") from None
    except (TypeError, ValueError) as err:
        raise _bad(whole, str(err).splitlines()[0]) from None
    return Spec(text, pat.name, family, Fixed(pat))


def _combine(text: str, op: str, parts: list[Spec]) -> Spec:
    """The parts' rules joined by their own ``|`` / ``&`` (:class:`graphattn.prune.keep.Rule`)."""
    rule = functools.reduce(operator.or_ if op == "|" else operator.and_, (p.rule for p in parts))
    return Spec(text, rule.name, op.join(dict.fromkeys(p.family for p in parts)), rule)


class Span:
    """Layer or head indices as inclusive ranges, never expanded (``@layers=0-99999999999`` costs nothing).

    ``3-5`` -> [(3, 5)]; ``0+5`` -> [(0, 0), (5, 5)]; ``i in span`` and ``span.max()`` as for a set.
    """

    def __init__(self, ranges):
        merged = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        self.ranges = tuple(merged)

    def __contains__(self, index) -> bool:
        return any(lo <= index <= hi for lo, hi in self.ranges)

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    def max(self) -> int:
        return self.ranges[-1][1]

    def __eq__(self, other) -> bool:
        if isinstance(other, (set, frozenset)):
            return len(other) == len(self) and all(i in self for i in other)
        return isinstance(other, Span) and other.ranges == self.ranges

    def __hash__(self) -> int:
        return hash(self.ranges)

    def __str__(self) -> str:
        return "+".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in self.ranges)

    __repr__ = __str__


def _span(text: str, what: str, whole: str) -> Span:
    """``3-5``, ``2`` or ``0+5`` as a :class:`Span`."""
    ranges = []
    for part in text.split("+"):
        lo, dash, hi = part.partition("-")
        try:
            lo, hi = spec_text.INT.convert(lo), spec_text.INT.convert(hi if dash else lo)
        except ValueError:
            raise _bad(whole, f"expected {what} like 3-5, 2 or 0+5 (got {text!r})") from None
        if lo < 0 or hi < lo:
            raise _bad(whole, f"expected {what} as a range low-high with 0 <= low <= high (got {text!r})")
        ranges.append((lo, hi))
    return Span(ranges)


def check_spec(spec: Spec, layers: int, heads: int) -> Spec:
    """Refuse, before any model runs, a spec whose ``@layers`` or ``@heads`` reach past the model, or whose
    pattern function returns no bool (n, n) mask: one line naming the spec and the model's range.

    Ranges are compared by their ends, never expanded (``@layers=0-99999999999`` answers at once).

    Parameters
    ----------
    spec : Spec
    layers, heads : int
        The model's number of attention layers and of heads per layer.

    Raises
    ------
    ValueError
        ``Expected 'window:8@layers=10' to scope layers within 0-5 of the 6-layer model (got 10)``.
    TypeError
        A pattern function's mask that is not a bool Tensor (a float mask is named as such).
    """
    for what, count in (("layers", layers), ("heads", heads)):
        check_int(what, count, low=1)
        span = getattr(spec, what)
        if span is not None and span.max() >= count:
            noun = {"layers": f"the {count}-layer model", "heads": f"the model's {count} heads"}[what]
            raise ValueError(message(spec.text, f"{what} within 0-{count - 1} of {noun}", span, verb="scope"))
    if isinstance(spec.rule, Fixed) and spec.pattern is None:
        spec.pattern_mask(3)  # a pattern function's contract, on 3 tokens
    return spec


SEEDED = ("random", "bigbird")  # families with a random draw: their rows are repeated over seeds


def reseed(spec: Spec, offset: int) -> Spec | None:
    """``spec`` with the seed of every random or BigBird part moved by ``offset``; None if it draws nothing.

    Examples
    --------
    >>> reseed(parse_spec("window:2|random:3,seed=4"), 1).text
    'window:2|random:k=3,seed=5'
    >>> reseed(parse_spec("window:2"), 1) is None
    True
    """
    import re

    base, at, scopes = spec.text.partition("@")
    parts, changed = re.split(r"([|&])", base), False
    for n, part in enumerate(parts):
        if part in "|&" or part.split(":")[0].strip().lower() not in SEEDED:
            continue
        family, values = spec_text.parse_atom(part, _families())
        values["seed"] = values.get("seed", 0) + offset
        parts[n] = f"{family}:" + ",".join(f"{k}={v}" for k, v in values.items())
        changed = True
    return parse_spec("".join(parts) + at + scopes) if changed else None


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
        return Spec(name or item.name, name or item.name, name or item.name, Fixed(item))
    if callable(item):
        label = name or getattr(item, "__name__", "custom")
        return Spec(label, label, "custom", Fixed(item, label))
    raise TypeError(message("spec", "a str, Spec, Pattern or pattern function", type(item).__name__))


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
    if not isinstance(text, str):
        raise TypeError(message("spec", "a str such as 'window:8'", type(text).__name__))
    return _parse(text, text)


def _parse(text: str, whole: str) -> Spec:
    if not text.strip():
        raise _bad(whole, "empty")
    if "@" in text:
        base, *scopes = text.split("@")
        spec = _parse(base, whole)
        for scope in scopes:
            key, eq, val = scope.partition("=")
            key = key.strip().lower()
            if key not in ("layers", "heads") or not eq:
                raise _bad(whole, f"expected @layers=... or @heads=... (got @{scope})")
            if getattr(spec, key) is not None:
                raise _bad(whole, f"@{key} given twice; join indices with '+', e.g. @{key}=1+2")
            setattr(spec, key, _span(val.strip(), key, whole))
        spec.text = text
        spec.name += "".join(f"@{k}={getattr(spec, k)}" for k in ("layers", "heads") if getattr(spec, k) is not None)
        return spec
    if "|" in text:
        return _combine(text, "|", [_parse(t, whole) for t in text.split("|")])
    if "&" in text:
        return _combine(text, "&", [_parse(t, whole) for t in text.split("&")])
    return _atom(text, whole)
