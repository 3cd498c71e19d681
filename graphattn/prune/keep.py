"""What a spec keeps in one layer: :class:`Spec` (fixed pattern, pattern function or data-dependent rule).

A :class:`Spec` turns the dense weights of a layer and the model's own graph
into the kept edges of every head (:meth:`Spec.keep`), answers the bridge's
sparsity callable (:meth:`Spec.select`) and gives the teacher-forced mass
(:meth:`Spec.forced_mass`). Specs are parsed from text by
:func:`graphattn.prune.specs.parse_spec`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from graphattn import patterns
from graphattn.interop.masks import place
from graphattn.patterns import topk_mask

__all__ = ["Spec", "dense_weights"]


def dense_weights(query: Tensor, key: Tensor, valid: Tensor) -> Tensor:
    """Dense weights ``softmax(q k^T / sqrt(D))`` over the model's graph ``valid (B, 1, L, S)``: (B, H, L, S).

    The bridge's default scaling, as BERT, GPT-2 and their relatives use.
    """
    scores = (query @ key.transpose(-1, -2)) * query.shape[-1] ** -0.5  # (B, H, L, D) · (B, H, D, S) -> (B, H, L, S)
    scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)  # (B, H, L, S): exp() is exactly 0 there
    return scores.softmax(-1)  # (B, H, L, S)


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
    mask_fn: Callable[[int], Tensor] | None = field(default=None, repr=False)  # n -> (n, n) bool, a fixed pattern
    layers: frozenset | None = None  # layers (from 0) the spec prunes; None: every layer
    heads: frozenset | None = None  # heads it prunes; None: every head
    budget: Callable[[Tensor, Tensor], Tensor] | None = field(default=None, repr=False)  # keys per query (top-k)
    draw: Callable[[int, int, int], Tensor] | None = field(default=None, repr=False)  # (n, layer, head) -> (n, n)

    @classmethod
    def budgeted(cls, text: str, name: str, family: str, budget, **kw) -> Spec:
        """A top-k spec: query i keeps its ``budget(weights, valid)[..., i]`` highest-weight keys (ties: lower key)."""
        return cls(text, name, family, None, lambda w, valid: topk_mask(w, budget(w, valid)), budget=budget, **kw)

    def forced_mass(self, layer: int, weights: Tensor, valid: Tensor, ranked: Tensor) -> Tensor:
        """The dense mass this spec keeps in ``layer``, per query: (B, H, L).

        ``ranked`` is ``weights`` sorted descending, cumulated along the keys,
        shared by all specs: a top-k spec's mass is read off it (ties do not
        change the mass), the others go through :meth:`keep_in`.
        """
        if self.budget is None or not self.applies(layer) or self.heads is not None:
            return (weights * self.keep_in(layer, weights, valid).expand_as(weights)).sum(-1)  # (B, H, L)
        counts = self.budget(weights, valid).expand(weights.shape[:-1]).unsqueeze(-1)  # (B, H, L, 1)
        mass = ranked.gather(-1, (counts - 1).clamp(min=0)).squeeze(-1)  # (B, H, L)
        return mass * (counts.squeeze(-1) > 0)  # (B, H, L)

    @property
    def data_dependent(self) -> bool:
        """Whether the kept edges depend on the data (top-k, threshold, oracle): then they are not a saving."""
        return self.pattern is None and self.mask_fn is None and self.draw is None

    def applies(self, layer: int) -> bool:
        """Whether the spec prunes ``layer`` (dense elsewhere)."""
        return self.layers is None or layer in self.layers

    def pattern_mask(self, n: int) -> Tensor:
        """The fixed pattern's mask on n tokens, (n, n) bool (cached)."""
        if n not in self._masks:
            mask = self.pattern.mask(n) if self.pattern is not None else self.mask_fn(n)  # (n, n)
            if not isinstance(mask, Tensor):
                raise TypeError(
                    f"Expected the pattern function of spec {self.name!r} to return a bool Tensor "
                    f"of shape ({n}, {n}), True = may attend (got {type(mask).__name__})"
                )
            if mask.dtype != torch.bool:
                raise TypeError(
                    f"Expected the pattern function of spec {self.name!r} to return a bool mask, "
                    f"True = may attend (got dtype {mask.dtype}; use mask > 0 or mask.bool())"
                )
            if mask.shape != (n, n):
                raise ValueError(
                    f"Expected the pattern function of spec {self.name!r} to return shape ({n}, {n}) "
                    f"for {n} tokens (got {tuple(mask.shape)})"
                )
            self._masks[n] = mask
        return self._masks[n]

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
        weights : Tensor, shape (..., L, L)
            Dense weights of the layer (rows = queries, softmax over the valid keys).
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
        if valid is None:
            valid = torch.ones(weights.shape[-2:], dtype=torch.bool, device=weights.device)  # (L, L)
        if self.draw is not None:
            keep = self._drawn(valid, layer, weights.shape[-3])  # (B, H, L, S)
        else:
            keep = self._placed(valid) if not self.data_dependent else self._select(weights, valid) & valid
        if self.heads is None:
            return keep
        chosen = torch.tensor([h in self.heads for h in range(weights.shape[-3])], device=keep.device)  # (H,)
        return torch.where(chosen[:, None, None], keep, valid)  # (..., H, L, S): dense in the other heads

    def _placed(self, valid: Tensor) -> Tensor:
        """The fixed pattern on each sequence's own tokens, inside ``valid (..., L, L)``."""
        present = valid.any(-2).reshape(-1, valid.shape[-1])  # (sequences, L): tokens that exist
        out = place(present, self.pattern_mask)  # (sequences, L, L)
        return out.view(valid.shape) & valid  # (..., L, L)

    def _drawn(self, valid: Tensor, layer: int, heads: int) -> Tensor:
        """A draw per head of ``layer`` on each sequence's own tokens: ``valid (B, 1, L, S)`` -> (B, H, L, S)."""

        def drawn(n: int) -> Tensor:  # (H, n, n), each head's draw cached
            for h in range(heads):
                if (n, layer, h) not in self._masks:
                    self._masks[(n, layer, h)] = self.draw(n, layer, h)  # (n, n)
            return torch.stack([self._masks[(n, layer, h)] for h in range(heads)])

        present = valid.any(-2).reshape(-1, valid.shape[-1])  # (B, L): tokens that exist
        return place(present, drawn, (heads,)) & valid  # (B, H, L, S)
