"""Sparsity patterns: which keys j each query i may read, in three views.

A pattern is a small object named after its parameters (``window_2_2``). For L
queries and S keys (S defaults to L) it gives

- ``edge_index(L, S=None)``: LongTensor (2, E); row 0 = source = key j, row 1 =
  target = query i; sorted by target, then source; no duplicates. Built from
  per-row arithmetic in O(E) memory, never by scanning the L x S grid.
- ``mask(L, S=None)``: BoolTensor (L, S), True = query i may attend key j (the
  SDPA polarity). The reference view: ``mask_mod`` evaluated on a grid.
- ``mask_mod(b, h, q_idx, kv_idx)``: the rule as an elementwise predicate,
  usable as FlexAttention's ``mask_mod`` (no branching on tensor values).

``random`` and ``bigbird`` depend on (L, S) through their random draws; their
``mask_mod`` looks up a table, so bind them first: ``p.bind(L, S).mask_mod``.
Every other pattern's ``bind`` returns itself (``topk``/``threshold`` check the
size). ``a | b`` and ``a & b`` compose; ``kind`` is "full", "causal" or None,
for the kernels' dispatch. :func:`is_pattern` is the one pattern check and
:func:`topk_mask` the one (batched) top-k,
:func:`threshold_mask` the one (batched) threshold.

Modules, by concept: ``base`` (Pattern, composition, size limits), ``local``
(full, causal, windows), ``sparse_transformer`` (strided, fixed), ``mixtures``
(global tokens, random, BigBird, Longformer), ``scored`` (top-k, threshold),
``connectivity`` (stats), ``spec`` (:func:`from_spec`: a pattern from text such as
``window:8|global:0``, its grammar read off the builders registered with
``spec_family``). The presets reproduce the Sparse Transformer [1]_,
Longformer [2]_, BigBird [3]_ and FlashAttention's sliding window [4]_.

References
----------
.. [1] Child et al., "Generating Long Sequences with Sparse Transformers", 2019.
.. [2] Beltagy et al., "Longformer: The Long-Document Transformer", 2020.
.. [3] Zaheer et al., "Big Bird: Transformers for Longer Sequences", 2020.
.. [4] Dao, "FlashAttention-2", 2023 (``flash_attn_func(window_size=...)``).
"""

from graphattn.patterns.base import MAX_ELEMENTS, MAX_LENGTH, Pattern, is_pattern
from graphattn.patterns.connectivity import DIAMETER_MAX_L, REACH_MAX_L, stats
from graphattn.patterns.local import causal, dilated, flash_window, full, longformer_window, window
from graphattn.patterns.mixtures import bigbird, global_tokens, longformer, random
from graphattn.patterns.scored import threshold, threshold_mask, topk, topk_mask
from graphattn.patterns.sparse_transformer import fixed, strided
from graphattn.patterns.spec import from_spec

__all__ = [
    "Pattern",
    "is_pattern",
    "full",
    "causal",
    "window",
    "dilated",
    "longformer_window",
    "flash_window",
    "strided",
    "fixed",
    "global_tokens",
    "random",
    "bigbird",
    "longformer",
    "topk",
    "topk_mask",
    "threshold",
    "threshold_mask",
    "from_spec",
    "stats",
    "MAX_LENGTH",
    "MAX_ELEMENTS",
    "REACH_MAX_L",
    "DIAMETER_MAX_L",
]
