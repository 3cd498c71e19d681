"""Fixed patterns from short text specs: ``window:8``, ``longformer:16``, ``window:4|global:0+5``.

A spec is ``family[:args]``: ``args`` are comma-separated values, by name
(``key=value``) or by position in the order of :data:`FAMILIES`. ``a|b`` is the
union of two specs and ``a&b`` their intersection (``&`` binds tighter, as in
Python). Only fixed patterns live here; data-dependent rules (top-k,
threshold), per-sequence roles (the last token) and layer or head scopes are
the pruning experiment's (:mod:`graphattn.prune.specs`), which builds on
:func:`parse_atom` and :func:`build`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from graphattn.patterns.base import Pattern
from graphattn.patterns.local import causal, full, window
from graphattn.patterns.mixtures import bigbird, global_tokens, longformer, random
from graphattn.patterns.sparse_transformer import fixed, strided
from graphattn.validate import message

__all__ = ["from_spec", "parse_atom", "build", "Kind", "INT", "FLOAT", "INDICES", "FAMILIES", "SpecError"]


class SpecError(ValueError):
    """A malformed spec; ``spec`` is the text, ``why`` the reason (the message is one line)."""

    def __init__(self, spec: str, why: str):
        super().__init__(
            f"Expected pattern spec {spec!r} to be family[:args] with family one of {', '.join(FAMILIES)} ({why})"
        )
        self.spec, self.why = spec, why


class Kind(NamedTuple):
    """How a parameter's text becomes a value: ``convert(text)`` raises ValueError; ``what`` says what it takes."""

    convert: Callable[[str], object]
    what: str


def _int(text: str) -> int:
    """ASCII decimal digits with an optional sign; Python's ``int`` would also take ``3_0`` (30) and other scripts' digits."""
    if re.fullmatch(r"\s*[+-]?[0-9]+\s*", text) is None:
        raise ValueError(text)
    return int(text)


def _indices(text: str) -> list[int]:
    """``0+5`` -> [0, 5]; negative or non-int tokens raise ValueError."""
    out = [_int(t) for t in text.split("+")]
    if any(v < 0 for v in out):
        raise ValueError(text)
    return out


INT = Kind(_int, "an int")
FLOAT = Kind(float, "a number")
INDICES = Kind(_indices, "non-negative ints joined by '+', like 0 or 0+5")

# family -> its parameters in positional order
FAMILIES: dict[str, tuple[tuple[str, Kind], ...]] = {
    "full": (),
    "causal": (),
    "window": (("left", INT), ("right", INT), ("dilation", INT)),
    "longformer": (("window", INT), ("global", INDICES)),
    "strided": (("stride", INT),),
    "fixed": (("block", INT), ("summary", INT)),
    "bigbird": (("block", INT), ("window", INT), ("global", INT), ("random", INT), ("seed", INT)),
    "random": (("k", INT), ("seed", INT)),
    "global": (("indices", INDICES),),
}


def parse_atom(text: str, families: dict | None = None, spec: str | None = None) -> tuple[str, dict]:
    """Split one spec without ``|``/``&`` into its family and typed parameters.

    Parameters
    ----------
    text : str
        ``family[:args]``.
    families : dict, default :data:`FAMILIES`
        ``family -> ((name, Kind), ...)`` in positional order.
    spec : str, optional
        The whole spec, named in errors (default ``text``).

    Returns
    -------
    (str, dict)
        The family (lower case) and ``{name: value}`` for the parameters given.

    Raises
    ------
    SpecError
        For an unknown family or parameter, too many values, a repeated
        parameter or a value of the wrong kind.

    Examples
    --------
    >>> parse_atom("window:4,right=2")
    ('window', {'left': 4, 'right': 2})
    >>> parse_atom("window:8")  # one positional size is both sides
    ('window', {'left': 8, 'right': 8})
    """
    families, spec = FAMILIES if families is None else families, text if spec is None else spec
    family, _, args = text.strip().partition(":")
    family = family.strip().lower()
    if family not in families:
        raise SpecError(spec, f"unknown family {family!r}")
    params = dict(families[family])
    names = list(params)
    items = [a.strip() for a in args.split(",")] if args.strip() else []
    if any(not item for item in items):
        raise SpecError(spec, f"an empty value in {args!r}")
    values = {}
    for pos, item in enumerate(items):
        key, eq, val = item.partition("=")
        if not eq:
            if pos >= len(names):
                raise SpecError(
                    spec,
                    f"{family!r} takes {', '.join(names) or 'no parameters'}: "
                    f"at most {len(names)} values (got {len(items)})",
                )
            key, val = names[pos], item
        key = key.strip().lower()
        if key not in params:
            raise SpecError(spec, f"{family!r} takes {', '.join(names) or 'no parameters'} (got {key!r})")
        if key in values:
            raise SpecError(spec, f"{key!r} given twice")
        try:
            values[key] = params[key].convert(val.strip())
        except ValueError:
            raise SpecError(
                spec, f"expected {key!r} of {family!r} to be {params[key].what} (got {val.strip()!r})"
            ) from None
    if family == "window" and items and "=" not in items[0] and "right" not in values:
        values["right"] = values["left"]  # one positional size, window:8, is both sides; window:left=4 is not
    return family, values


def _window(left=None, right=None, dilation=1) -> Pattern:
    if left is None and right is None:
        raise ValueError("'window' needs a size, e.g. window:8 or window:left=4,right=2")
    if left is None or right is None:  # window:left=4 is not a half window: say so
        raise ValueError(
            "give both 'left' and 'right' (window:left=4,right=0 for one side), "
            "or one size, window:8, for left = right = 8"
        )
    return window(left, right, dilation)


def _need(**kw):
    missing = [k for k, v in kw.items() if v is None]
    if missing:
        raise ValueError(f"missing parameter {missing[0]!r}")


def build(family: str, values: dict) -> Pattern:
    """The pattern of one family from its parsed parameters (:func:`parse_atom`); ValueError/TypeError as the builder.

    ``longformer`` takes global token 0 unless told otherwise; ``bigbird`` and
    ``random`` take the builders' defaults.
    """
    v = dict(values)
    if family == "window":
        return _window(**v)
    if family == "full":
        return full()
    if family == "causal":
        return causal()
    if family == "longformer":
        _need(window=v.get("window"))
        return longformer(v["window"], v.get("global", [0]))
    if family == "strided":
        _need(stride=v.get("stride"))
        return strided(v["stride"])
    if family == "fixed":
        _need(block=v.get("block"), summary=v.get("summary"))
        return fixed(v["block"], v["summary"])
    if family == "bigbird":
        _need(block=v.get("block"))
        return bigbird(v["block"], v.get("window", 3), v.get("global", 2), v.get("random", 2), v.get("seed", 0))
    if family == "random":
        _need(k=v.get("k"))
        return random(v["k"], v.get("seed", 0))
    if family == "global":
        _need(indices=v.get("indices"))
        return global_tokens(v["indices"])
    raise ValueError(f"unknown family {family!r}")


def _parse(text: str, spec: str) -> Pattern:
    if not text.strip():
        raise SpecError(spec, "empty")
    if "|" in text:
        parts = [_parse(t, spec) for t in text.split("|")]
        out = parts[0]
        for p in parts[1:]:
            out = out | p
        return out
    if "&" in text:
        parts = [_parse(t, spec) for t in text.split("&")]
        out = parts[0]
        for p in parts[1:]:
            out = out & p
        return out
    family, values = parse_atom(text, FAMILIES, spec)
    try:
        return build(family, values)
    except (ValueError, TypeError) as err:
        raise SpecError(spec, str(err).splitlines()[0]) from None


def from_spec(text: str) -> Pattern:
    """A fixed pattern from a short text spec.

    Families and their parameters, positional order first:

    - ``full``, ``causal``
    - ``window:left,right[,dilation]``; ``window:8`` is left = right = 8
      (FlashAttention's inclusive ``(left, right)``)
    - ``longformer:window[,global]`` (w / 2 each side | global tokens, default 0)
    - ``strided:stride``, ``fixed:block,summary`` (Sparse Transformer, causal)
    - ``bigbird:block[,window,global,random,seed]`` (counted in blocks)
    - ``random:k[,seed]``
    - ``global:indices``

    Index lists join non-negative ints with ``+`` (``global:0+5``). ``a|b`` is
    the union, ``a&b`` the intersection; ``&`` binds tighter.

    Parameters
    ----------
    text : str
        The spec; family and keys are case-insensitive, spaces are ignored.

    Returns
    -------
    Pattern
        The same object as the builder call, e.g. ``window(8, 8)``.

    Raises
    ------
    TypeError
        If ``text`` is not a str.
    ValueError
        One line naming the spec: an unknown family or parameter, a missing,
        repeated or malformed value, too many values, a one-sided window
        (``window:left=4``), or a value the builder refuses.

    See Also
    --------
    graphattn.prune.parse_spec : adds top-k, threshold, per-sequence global
        roles (``global:cls+sep``) and ``@layers`` / ``@heads`` scopes.

    Examples
    --------
    >>> from_spec("window:2").name
    'window_2_2'
    >>> from_spec("window:left=1,right=0").mask(3).int().tolist()
    [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    >>> from_spec("longformer:window=16,global=0+5").name
    'longformer_w16_g0_5'
    >>> from_spec("window:1|global:0").mask(4).int().tolist()
    [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]]
    >>> try:
    ...     from_spec("window:8,8,1,4")
    ... except ValueError as err:
    ...     print(err.why)
    'window' takes left, right, dilation: at most 3 values (got 4)
    """
    if not isinstance(text, str):
        raise TypeError(message("text", "a pattern spec str such as 'window:8'", type(text).__name__))
    if "@" in text:
        raise SpecError(text, "scopes @layers / @heads belong to graphattn.prune.parse_spec")
    return _parse(text, text)
