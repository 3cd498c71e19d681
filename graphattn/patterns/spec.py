"""Fixed patterns from short text specs: ``window:8``, ``longformer:16``, ``window:4|global:0+5``.

A spec is ``family[:args]``: ``args`` are comma-separated values, by name
(``key=value``) or by position in the builder's own parameter order. ``a|b`` is
the union of two specs and ``a&b`` their intersection (``&`` binds tighter, as
in Python). Only fixed patterns live here; data-dependent rules (top-k,
threshold), per-sequence roles (the last token) and layer or head scopes are
the pruning experiment's (:mod:`graphattn.prune.specs`), which builds on
:func:`parse_atom` and :data:`FAMILIES`.

The grammar is read off the builders: a builder decorated with
:func:`spec_family` is a family, its parameters in their order are the spec's
positional values, each named by the parameter's name up to its first
underscore (``global_indices`` is ``global``), typed by its annotation (``int``,
``float`` or ``Sequence[int]``), required when it has no default. A new pattern
is a decorated builder in its own module; nothing here changes.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from graphattn.patterns.base import Pattern
from graphattn.validate import message

__all__ = [
    "from_spec",
    "parse_atom",
    "build",
    "spec_family",
    "Family",
    "Kind",
    "INT",
    "FLOAT",
    "INDICES",
    "FAMILIES",
    "SpecError",
]


class SpecError(ValueError):
    """A malformed spec; ``spec`` is the text, ``why`` the reason (the message is one line)."""

    def __init__(self, spec: str, why: str):
        super().__init__(
            f"Expected pattern spec {spec!r} to be family[:args] with family one of {', '.join(_fixed())} ({why})"
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


def _float(text: str) -> float:
    """An ASCII decimal number (``0.1``, ``1e-3``, ``.5``).

    Python's ``float`` would also take ``0_1`` (1.0), other scripts' digits, ``nan`` and ``inf``.
    """
    if re.fullmatch(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*", text) is None:
        raise ValueError(text)
    return float(text)


INT = Kind(_int, "an int")
FLOAT = Kind(_float, "a number")
INDICES = Kind(_indices, "non-negative ints joined by '+', like 0 or 0+5")


@dataclass(frozen=True)
class Family:
    """One family of the grammar, read off its builder by :func:`spec_family`.

    Attributes
    ----------
    name : str
        The family as written (``window``).
    params : tuple of (str, Kind)
        Spec keys in positional order, with how each is read.
    builder : callable
        The pattern's builder; :meth:`build` calls it with the given values.
    arguments : dict of str to str
        Spec key -> the builder's parameter name (``global`` -> ``global_indices``).
    required : tuple of str
        Spec keys without a default.
    scored : bool
        Whether the builder reads scores (``topk``, ``threshold``): data-dependent,
        so not a fixed pattern (:func:`from_spec` refuses it; the pruning
        experiment selects from the dense weights).
    complete : callable or None
        ``complete(values, positional)`` -> values, for a family's shorthand
        (``window:8`` is both sides); ``positional`` says whether the first
        value was given by position. Raises ValueError for what the family refuses.
    """

    name: str
    params: tuple[tuple[str, Kind], ...]
    builder: Callable[..., Pattern]
    arguments: dict[str, str]
    required: tuple[str, ...]
    scored: bool = False
    complete: Callable[[dict, bool], dict] | None = None

    def with_kinds(self, kinds: dict[Kind, Kind], extra: tuple[tuple[str, Kind], ...] = ()) -> Family:
        """The same family with some kinds read otherwise (roles for indices) and ``extra`` keys after the builder's."""
        params = tuple((key, kinds.get(kind, kind)) for key, kind in self.params) + extra
        return Family(self.name, params, self.builder, self.arguments, self.required, self.scored, self.complete)

    def build(self, values: dict) -> Pattern:
        """The pattern from parsed values (:func:`parse_atom`); ValueError/TypeError as the builder."""
        missing = [key for key in self.required if key not in values]
        if missing:
            raise ValueError(f"missing parameter {missing[0]!r}")
        return self.builder(**{self.arguments[key]: value for key, value in values.items()})


# family -> its grammar, filled by @spec_family as the pattern modules load (graphattn.patterns imports them all)
FAMILIES: dict[str, Family] = {}

_KINDS: tuple[tuple[object, Kind], ...] = ((Sequence[int], INDICES), (int, INT), (float, FLOAT))

F = TypeVar("F", bound=Callable[..., Pattern])


def _kind(builder: Callable, parameter: inspect.Parameter) -> Kind:
    union = typing.get_origin(parameter.annotation) in (typing.Union, types.UnionType)
    options = typing.get_args(parameter.annotation) if union else (parameter.annotation,)  # int | None: (int, None)
    for annotation, kind in _KINDS:  # Sequence[int] first: global_tokens also takes one int
        if annotation in options:
            return kind
    raise TypeError(
        message(
            f"{builder.__name__}({parameter.name})",
            "annotated int, float or Sequence[int] to be read from a spec",
            repr(parameter.annotation),
        )
    )


def spec_family(name: str, *, complete: Callable[[dict, bool], dict] | None = None) -> Callable[[F], F]:
    """Register a pattern builder as the spec family ``name``; the builder is returned unchanged.

    Its parameters, in order, become the family's positional values; each is
    written as its name up to the first underscore (``window_blocks`` ->
    ``window``), read by its annotation (``int``, ``float``, ``Sequence[int]``)
    and required when it has no default. A first parameter ``scores`` makes the
    family data-dependent (``topk``): the experiment's grammar, not
    :func:`from_spec`'s.

    Parameters
    ----------
    name : str
        The family as written in a spec.
    complete : callable, optional
        ``complete(values, positional) -> values``: the family's shorthand and
        its refusals (see :class:`Family`).

    Examples
    --------
    >>> [key for key, _ in FAMILIES["bigbird"].params]  # bigbird(block, window_blocks, global_blocks, ...)
    ['block', 'window', 'global', 'random', 'seed']
    >>> FAMILIES["bigbird"].required
    ('block',)
    """

    def register(builder: F) -> F:
        signature = inspect.signature(builder, eval_str=True)
        parameters = list(signature.parameters.values())
        scored = bool(parameters) and parameters[0].name == "scores"
        params, arguments, required = [], {}, []
        for parameter in parameters[scored:]:
            key = parameter.name.split("_")[0]
            if key in arguments:
                raise ValueError(
                    message(
                        f"{builder.__name__}'s parameters",
                        "distinct spec keys (a name up to its first underscore)",
                        f"{key!r} twice",
                    )
                )
            arguments[key] = parameter.name
            params.append((key, _kind(builder, parameter)))
            if parameter.default is inspect.Parameter.empty:
                required.append(key)
        FAMILIES[name] = Family(name, tuple(params), builder, arguments, tuple(required), scored, complete)
        return builder

    return register


def _fixed() -> dict[str, Family]:
    return {name: family for name, family in FAMILIES.items() if not family.scored}


def parse_atom(text: str, families: dict | None = None, spec: str | None = None) -> tuple[str, dict]:
    """Split one spec without ``|``/``&`` into its family and typed parameters.

    Parameters
    ----------
    text : str
        ``family[:args]``.
    families : dict of str to Family, default the fixed families of :data:`FAMILIES`
        The grammar.
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
        parameter, a value of the wrong kind, or what the family's shorthand refuses.

    Examples
    --------
    >>> parse_atom("window:4,right=2")
    ('window', {'left': 4, 'right': 2})
    >>> parse_atom("window:8")  # one positional size is both sides
    ('window', {'left': 8, 'right': 8})
    """
    families, spec = _fixed() if families is None else families, text if spec is None else spec
    family, _, args = text.strip().partition(":")
    family = family.strip().lower()
    if family not in families:
        raise SpecError(spec, f"unknown family {family!r}")
    params = dict(families[family].params)
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
    complete = families[family].complete
    if complete is not None:
        try:
            values = complete(values, bool(items) and "=" not in items[0])
        except ValueError as err:
            raise SpecError(spec, str(err).splitlines()[0]) from None
    return family, values


def build(family: str, values: dict) -> Pattern:
    """The pattern of one family from its parsed parameters (:func:`parse_atom`); ValueError/TypeError as the builder.

    Parameters not given take the builder's defaults (``longformer``: global token 0).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}")
    return FAMILIES[family].build(values)


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
    family, values = parse_atom(text, None, spec)
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
