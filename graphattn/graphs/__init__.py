"""Conversions between dense masks and edge lists, validation, and batching.

This is the only package that converts between ``(L, S)`` masks and ``(2, E)``
edge lists. Conventions (docs/design.md):

- ``edge_index[0]`` is the source j (key/value position), ``edge_index[1]`` the
  target i (query position); an edge ``(j, i)`` means "query i may read key j".
- ``mask[i, j] == True`` means "may attend", exactly when ``(j, i)`` is an edge
  (the polarity of ``F.scaled_dot_product_attention``).
- Size tuples follow PyG: ``size=(S, L)`` (sources, targets).

Modules: :mod:`~graphattn.graphs.edges` (validation, mask <-> edge list,
sorting), :mod:`~graphattn.graphs.weights` (per-edge <-> dense per-head
weights), :mod:`~graphattn.graphs.batching` (variable-length batches, padded
<-> node tensors), :mod:`~graphattn.graphs.adjacency` (EdgeIndex, torch.sparse
and SparseTensor adjacencies).
"""

from graphattn.graphs.adjacency import ADJ_CACHE_SIZE, set_adjacency_cache_size, to_edge_index
from graphattn.graphs.batching import batch_sequences, nodes_to_padded, padded_to_nodes
from graphattn.graphs.edges import check_edge_index, edge_index_to_mask, mask_to_edge_index, sort_edge_index
from graphattn.graphs.weights import dense_to_edge_weights, edge_weights_to_dense

__all__ = [
    "check_edge_index",
    "mask_to_edge_index",
    "edge_index_to_mask",
    "sort_edge_index",
    "edge_weights_to_dense",
    "dense_to_edge_weights",
    "batch_sequences",
    "padded_to_nodes",
    "nodes_to_padded",
    "to_edge_index",
    "set_adjacency_cache_size",
    "ADJ_CACHE_SIZE",
]
