"""Attention kernels over an edge list: scores, per-target softmax, aggregation, dispatch.

For every edge ``(j, i)`` of ``edge_index`` (row 0 = source = key j, row 1 =
target = query i) and every head h:

1) score      ``s_ijh = (q_ih · k_jh) * scale (+ edge_bias_ijh)``
2) softmax    ``alpha_ijh = exp(s_ijh) / sum_{j' -> i} exp(s_ij'h)`` over the incoming edges of i
3) aggregate  ``y_ih = sum_{j -> i} alpha_ijh v_jh``

A query with no incoming edge gets an exact zero row (docs/design.md).

Three exact kernels, none of which copies features onto edges (no ``(E, H, D)``
tensor; extra memory is O(E H) + O(N H D)), a module each:

- :mod:`~graphattn.ops.sdpa`: :func:`torch.nn.functional.scaled_dot_product_attention`
  (its fused flash kernel when the weights are not requested) when the edge set
  is the complete graph or the causal DAG: a ``Pattern`` of kind
  ``"full"``/``"causal"`` (no edge is ever built), or an edge list that is
  exactly that set (detected in O(E) once per graph).
- :mod:`~graphattn.ops.block`: graphs whose edges fill at least ``MIN_FILL`` of
  the 64 x 64 tiles they touch (windows, block-sparse patterns, causal with a
  bias): dense tiles (GEMM) masked to the edges, one fused softmax per tile row.
- :mod:`~graphattn.ops.csr`: any graph (random, top-k, duplicate edges): sampled
  dense-dense matmul, the segment softmax, CSR x dense; backward with the
  transposed CSR.

The rest, one concept per module: :mod:`~graphattn.ops.dispatch` (the entry
:func:`attention`, argument checks, :func:`choose_impl`),
:mod:`~graphattn.ops.structure` (the sorted structure, its tiles and its
cache, :func:`prepare`), :mod:`~graphattn.ops.softmax` (the one segment
softmax), :mod:`~graphattn.ops.guard` (exactness for non-finite features) and
:mod:`~graphattn.ops.shared` (scale, compute dtype, dropout).
The structure cache keeps :func:`cache_size` graphs (default ``CACHE_SIZE`` = 8;
change it with :func:`set_cache_size`; it warns once when it thrashes), is
verified by content (never stale, whatever wrote to ``edge_index``) and is
safe under concurrent calls.

Inside, three levels: the kernels (plain functions, a module each) ->
:mod:`~graphattn.ops.operators` (the ``torch.library`` operators
``graphattn::attention``, ``graphattn::ragged_attention`` and their
backwards, with fake implementations and registered autograd, so
``torch.compile(fullgraph=True)`` and ``torch.export`` keep the fast path) ->
:mod:`~graphattn.ops.dispatch` (the public entries). Gradients equal the
dense oracle's (float64 gradcheck in ``tests/test_ops.py``); second
derivatives are exact too (a differentiable backward under
``create_graph=True``, see the operators' module).
"""

from graphattn.ops import additive, operators  # noqa: F401  (registers the graphattn:: operators)
from graphattn.ops.dispatch import IMPLS, attention, batched_attention, check_edge_bias, check_qkv, choose_impl
from graphattn.ops.operators import OPERATORS
from graphattn.ops.scored import scored_attention
from graphattn.ops.softmax import edge_scores, segment_softmax
from graphattn.ops.structure import (
    BLOCK,
    CACHE_SIZE,
    MIN_FILL,
    TILE_FLOATS,
    _Graph,  # noqa: F401  (tests build structures directly: ops._Graph)
    cache_size,
    prepare,
    set_cache_size,
)

__all__ = [
    "attention",
    "scored_attention",
    "batched_attention",
    "prepare",
    "segment_softmax",
    "edge_scores",
    "check_qkv",
    "check_edge_bias",
    "choose_impl",
    "set_cache_size",
    "cache_size",
    "IMPLS",
    "BLOCK",
    "MIN_FILL",
    "TILE_FLOATS",
    "CACHE_SIZE",
    "OPERATORS",
]
