"""What a spec keeps in one layer: a :class:`Rule` of three kinds, scoped by a :class:`Spec`.

A :class:`Rule` is a fixed pattern (:class:`Fixed`: a Pattern or a pattern
function of the length), a pattern drawn per layer and head (:class:`Drawn`) or
a data-dependent selection from the layer's dense weights (:class:`Selected`);
rules combine with ``|`` and ``&``. A :class:`Spec` turns the dense weights of a layer and the model's own graph
into the kept edges of every head (:meth:`Spec.keep`), answers the bridge's
sparsity callable (:meth:`Spec.select`) and gives the teacher-forced mass
(:meth:`Spec.forced_mass`). Specs are parsed from text by
:func:`graphattn.prune.specs.parse_spec`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from graphattn import patterns
from graphattn.interop.masks import place
from graphattn.patterns import topk_mask
from graphattn.validate import message, shape_message

__all__ = ["Spec", "Rule", "Fixed", "Drawn", "Selected", "dense_weights"]


def dense_weights(query: Tensor, key: Tensor, valid: Tensor) -> Tensor:
    """Dense weights ``softmax(q k^T / sqrt(D))`` over the model's graph ``valid (B, 1, L, S)``: (B, H, L, S).

    The bridge's default scaling, as BERT, GPT-2 and their relatives use.
    """
    scores = (query @ key.transpose(-1, -2)) * query.shape[-1] ** -0.5  # (B, H, L, D) · (B, H, D, S) -> (B, H, L, S)
    scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)  # (B, H, L, S): exp() is exactly 0 there
    return scores.softmax(-1)  # (B, H, L, S)


class Rule(ABC):
    """What a spec keeps in one pruned layer, for every head: one of three kinds.

    - :class:`Fixed`: one mask per length n, ``mask(n) -> (n, n)`` (a Pattern or
      a pattern function), laid over each sequence's own tokens;
    - :class:`Drawn`: a mask per (n, layer, head), ``mask(n, layer, head)``
      (``random:16,per=head``);
    - :class:`Selected`: chosen from the layer's dense weights,
      ``select(weights, valid)`` (top-k, threshold, oracle): data-dependent.

    ``a | b`` and ``a & b`` combine rules: two patterns through the patterns' own
    ``|`` / ``&``, otherwise the more general kind of the two (fixed < drawn < selected).
    """

    name: str
    data_dependent: bool = False

    @abstractmethod
    def keep(self, weights: Tensor, valid: Tensor, layer: int) -> Tensor:
        """Kept edges inside ``valid (..., L, S)``: ``valid.shape`` (fixed) or ``weights.shape``."""

    def at(self, n: int, layer: int, head: int) -> Tensor:
        """The (n, n) mask of one head of ``layer`` on n tokens (fixed and drawn rules)."""
        raise TypeError(message("rule", "fixed or drawn", f"{self.name!r}, chosen from the dense weights"))

    def __or__(self, other: Rule) -> Rule:
        return _combine("|", self, other)

    def __and__(self, other: Rule) -> Rule:
        return _combine("&", self, other)


class Fixed(Rule):
    """A fixed pattern: a :class:`~graphattn.patterns.Pattern`, or a pattern function ``n -> (n, n)`` bool.

    ``pattern`` is the Pattern (None for a function): the bridge places it itself.
    """

    def __init__(self, source: patterns.Pattern | Callable[[int], Tensor], name: str | None = None):
        self.pattern: patterns.Pattern | None = None
        self._fn: Callable[[int], Tensor] | None = None
        if patterns.is_pattern(source):
            self.pattern = source
        else:
            self._fn = cast(Callable[[int], Tensor], source)
        self.name = name or str(
            self.pattern.name if self.pattern is not None else getattr(source, "__name__", "custom")
        )
        self._masks: dict[int, Tensor] = {}

    def mask(self, n: int) -> Tensor:
        """The mask on n tokens, (n, n) bool (cached); a pattern function's answer is checked."""
        if n not in self._masks:
            mask = self._fn(n) if self._fn is not None else cast(patterns.Pattern, self.pattern).mask(n)  # (n, n)
            if not isinstance(mask, Tensor):
                raise TypeError(
                    message(
                        f"{self.name}(n)",
                        f"a bool Tensor of shape ({n}, {n}), True = may attend",
                        type(mask).__name__,
                        verb="return",
                    )
                )
            if mask.dtype != torch.bool:
                raise TypeError(
                    message(
                        f"{self.name}(n)",
                        "a bool mask, True = may attend",
                        f"dtype {mask.dtype}",
                        "use mask > 0 or mask.bool()",
                        verb="return",
                    )
                )
            if mask.shape != (n, n):
                raise ValueError(
                    message(f"{self.name}(n)", f"shape ({n}, {n}) for {n} tokens", tuple(mask.shape), verb="return")
                )
            self._masks[n] = mask
        return self._masks[n]

    def at(self, n: int, layer: int, head: int) -> Tensor:
        return self.mask(n)

    def keep(self, weights: Tensor, valid: Tensor, layer: int) -> Tensor:
        return _placed(self.mask, valid)


class Drawn(Rule):
    """A pattern drawn anew for every (layer, head): ``draw(n, layer, head) -> (n, n)`` bool (cached)."""

    def __init__(self, draw: Callable[[int, int, int], Tensor], name: str):
        self.draw, self.name = draw, name
        self._masks: dict[tuple[int, int, int], Tensor] = {}

    def at(self, n: int, layer: int, head: int) -> Tensor:
        if (n, layer, head) not in self._masks:
            self._masks[(n, layer, head)] = self.draw(n, layer, head)  # (n, n)
        return self._masks[(n, layer, head)]

    def keep(self, weights: Tensor, valid: Tensor, layer: int) -> Tensor:
        return _drawn(self.at, valid, layer, weights.shape[-3])


class Selected(Rule):
    """Chosen from the layer's dense weights: ``select(weights, valid) -> (..., L, S)`` bool, per head.

    ``budget(weights, valid)``, for a top-k rule, is the number of keys each
    query keeps: the teacher-forced mass is then read off the sorted weights.
    """

    data_dependent = True

    def __init__(
        self,
        select: Callable[[Tensor, Tensor], Tensor],
        name: str,
        budget: Callable[[Tensor, Tensor], Tensor] | None = None,
    ):
        self.select, self.name, self.budget = select, name, budget

    @classmethod
    def topk(cls, budget: Callable[[Tensor, Tensor], Tensor], name: str) -> Selected:
        """Query i keeps its ``budget(weights, valid)[..., i]`` highest-weight keys (ties: lower key)."""
        return cls(lambda w, valid: topk_mask(w, budget(w, valid)), name, budget)

    def keep(self, weights: Tensor, valid: Tensor, layer: int) -> Tensor:
        return self.select(weights, valid) & valid


class _Joined(Rule):
    """Rules joined by ``|`` or ``&`` with a data-dependent one among them: each part keeps, then they join."""

    data_dependent = True

    def __init__(self, op: str, parts: list[Rule]):
        self.reduce, self.parts, self.name = _REDUCE[op], parts, op.join(p.name for p in parts)

    def keep(self, weights: Tensor, valid: Tensor, layer: int) -> Tensor:
        keep = self.parts[0].keep(weights, valid, layer)  # (..., L, S)
        for part in self.parts[1:]:
            keep = self.reduce(keep, part.keep(weights, valid, layer))  # (..., L, S)
        return keep


_REDUCE = {"|": torch.logical_or, "&": torch.logical_and}


def _combine(op: str, a: Rule, b: Rule) -> Rule:
    """``a op b``: patterns through their own ``|``/``&``; else the more general kind of the two."""
    reduce, name = _REDUCE[op], f"{a.name}{op}{b.name}"
    if a.data_dependent or b.data_dependent:
        return _Joined(op, [a, b])
    if isinstance(a, Fixed) and isinstance(b, Fixed):
        if a.pattern is not None and b.pattern is not None:
            return Fixed(a.pattern | b.pattern if op == "|" else a.pattern & b.pattern)
        return Fixed(lambda n: reduce(a.mask(n), b.mask(n)), name)  # (n, n)
    return Drawn(lambda n, layer, head: reduce(a.at(n, layer, head), b.at(n, layer, head)), name)  # (n, n)


@dataclass
class Spec:
    """A parsed spec: a :class:`Rule` scoped to some layers and heads, with its text and labels.

    Attributes
    ----------
    text : str
        The spec as written.
    name : str
        Canonical name (the pattern's name, e.g. ``window_8_8``, ``topk_16``).
    family : str
        Curve label in plots: ``window``, ``topk``, ``window|global``, ...
    rule : Rule
        What it keeps in a layer it prunes: :class:`Fixed`, :class:`Drawn` or :class:`Selected`.
    layers, heads : Span, frozenset or None
        Layers and heads (from 0) it prunes; None: every one (dense elsewhere).
    """

    text: str
    name: str
    family: str
    rule: Rule
    layers: frozenset | None = None  # layers (from 0) the spec prunes; None: every layer
    heads: frozenset | None = None  # heads it prunes; None: every head

    @classmethod
    def budgeted(cls, text: str, name: str, family: str, budget, **kw) -> Spec:
        """A top-k spec: query i keeps its ``budget(weights, valid)[..., i]`` highest-weight keys (ties: lower key)."""
        return cls(text, name, family, Selected.topk(budget, name), **kw)

    @property
    def pattern(self) -> patterns.Pattern | None:
        """The fixed Pattern, or None (a pattern function, a draw, a data-dependent rule)."""
        return self.rule.pattern if isinstance(self.rule, Fixed) else None

    @property
    def budget(self) -> Callable[[Tensor, Tensor], Tensor] | None:
        """Keys per query of a top-k spec, or None."""
        return self.rule.budget if isinstance(self.rule, Selected) else None

    def forced_mass(self, layer: int, weights: Tensor, valid: Tensor, ranked: Tensor) -> Tensor:
        """The dense mass this spec keeps in ``layer``, per query: (B, H, L).

        ``ranked`` is ``weights`` sorted descending, cumulated along the keys,
        shared by all specs: a top-k spec's mass is read off it (ties do not
        change the mass), the others go through :meth:`keep_in`.
        """
        budget = self.budget
        if budget is None or not self.applies(layer) or self.heads is not None:
            return (weights * self.keep_in(layer, weights, valid).expand_as(weights)).sum(-1)  # (B, H, L)
        counts = budget(weights, valid).expand(weights.shape[:-1]).unsqueeze(-1)  # (B, H, L, 1)
        mass = ranked.gather(-1, (counts - 1).clamp(min=0)).squeeze(-1)  # (B, H, L)
        return mass * (counts.squeeze(-1) > 0)  # (B, H, L)

    @property
    def data_dependent(self) -> bool:
        """Whether the kept edges depend on the data (top-k, threshold, oracle): then they are not a saving."""
        return self.rule.data_dependent

    def applies(self, layer: int) -> bool:
        """Whether the spec prunes ``layer`` (dense elsewhere)."""
        return self.layers is None or layer in self.layers

    def pattern_mask(self, n: int) -> Tensor:
        """The fixed pattern's mask on n tokens, (n, n) bool (cached)."""
        if not isinstance(self.rule, Fixed):
            raise TypeError(
                message("spec", "a fixed pattern to give one mask", f"{self.text!r}, a {type(self.rule).__name__} rule")
            )
        return self.rule.mask(n)

    def select(self, layer: int, query: Tensor, key: Tensor, valid: Tensor):
        """What the bridge's sparsity callable returns for ``layer``: None (dense), a Pattern or a mask.

        ``valid (B, 1, L, S)`` is the model's graph. A data-dependent spec
        computes the dense weights here (:func:`dense_weights`): the selection's cost.
        """
        if not self.applies(layer):
            return None
        if self.pattern is not None and self.heads is None:
            return self.pattern  # placed by the bridge on each sequence's tokens (cached for the forward)
        weights = dense_weights(query, key, valid) if self.data_dependent else None  # (B, H, L, S)
        shape = (*valid.shape[:1], query.shape[1], *valid.shape[2:])  # (B, H, L, S)
        return self.keep(weights if weights is not None else valid.expand(shape), valid, layer)

    def keep_in(self, layer: int, weights: Tensor, valid: Tensor) -> Tensor:
        """:meth:`keep` in ``layer``: every edge of ``valid`` where the spec does not apply."""
        return self.keep(weights, valid, layer) if self.applies(layer) else valid

    def keep(self, weights: Tensor, valid: Tensor | None = None, layer: int = 0) -> Tensor:
        """Kept edges of one layer, for every head, inside the model's own graph.

        Parameters
        ----------
        weights : Tensor, shape (..., H, L, L)
            Dense weights of the layer (rows = queries, softmax over the valid keys);
            the head axis is required (per-head draws and ``@heads`` scopes read it).
        valid : Tensor, shape (..., L, L), dtype bool, optional
            The model's graph (padding, causality), broadcastable to
            ``weights``; a sequence's tokens are those some query reads, and a
            fixed pattern is laid over them in order (so left and right padding
            agree). Default: every edge.
        layer : int, default 0
            Which layer's draw a per-head random spec uses (``random:16,per=head``).

        Returns
        -------
        Tensor, dtype bool
            True = may attend, inside ``valid``: shape ``valid.shape`` for a
            fixed pattern (one mask for all heads), ``weights.shape`` otherwise.
        """
        if not isinstance(weights, Tensor) or weights.dim() < 3:
            got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
            raise ValueError(shape_message("weights", "(..., H, L, L)", got))
        if valid is None:
            valid = torch.ones(weights.shape[-2:], dtype=torch.bool, device=weights.device)  # (L, L)
        keep = self.rule.keep(weights, valid, layer)
        if self.heads is None:
            return keep
        chosen = torch.tensor([h in self.heads for h in range(weights.shape[-3])], device=keep.device)  # (H,)
        return torch.where(chosen[:, None, None], keep, valid)  # (..., H, L, S): dense in the other heads


def _placed(mask_of: Callable[[int], Tensor], valid: Tensor) -> Tensor:
    """The fixed pattern ``mask_of(n) -> (n, n)`` on each sequence's own tokens, inside ``valid (..., L, L)``."""
    present = valid.any(-2).reshape(-1, valid.shape[-1])  # (sequences, L): tokens that exist
    return place(present, mask_of).view(valid.shape) & valid  # (..., L, L)


def _drawn(mask_at: Callable[[int, int, int], Tensor], valid: Tensor, layer: int, heads: int) -> Tensor:
    """A draw ``mask_at(n, layer, head)`` per head of ``layer`` on each sequence's own tokens:
    ``valid (B, 1, L, S)`` -> (B, H, L, S).
    """
    present = valid.any(-2).reshape(-1, valid.shape[-1])  # (B, L): tokens that exist

    def drawn(n: int) -> Tensor:  # (H, n, n)
        return torch.stack([mask_at(n, layer, h) for h in range(heads)])

    return place(present, drawn, (heads,)) & valid  # (B, H, L, S)
