"""Adjacency forms PyG users pass (edge_index, EdgeIndex, torch.sparse, SparseTensor) as edge lists
(part of :mod:`graphattn.graphs`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn import _compat
from graphattn.cache import ContentCache
from graphattn.graphs.edges import _size_pair
from graphattn.validate import check_int, message

__all__ = ["to_edge_index", "set_adjacency_cache_size", "ADJ_CACHE_SIZE"]


ADJ_CACHE_SIZE = 16
_ADJ_CACHE = ContentCache(
    "graphattn.graphs adjacency cache", ADJ_CACHE_SIZE, "graphattn.graphs.set_adjacency_cache_size(n)"
)


def set_adjacency_cache_size(n: int) -> None:
    """Keep the edge lists of at most ``n`` sparse adjacencies (default ``ADJ_CACHE_SIZE`` = 16; 0 disables)."""
    _ADJ_CACHE.resize(check_int("n", n, low=0))


def _sparse_to_edge_index(adj) -> tuple[Tensor, Tensor | None]:
    """A transposed sparse adjacency ``adj_t (L, S)`` (row = target i, column = source j) as edges.

    The edge order is PyG's (:func:`torch_geometric.utils.to_edge_index` for
    ``torch.sparse``, ``SparseTensor.coo()``), so per-edge outputs line up with
    what PyG's own convs return for the same adjacency.
    """
    if isinstance(adj, Tensor):
        from torch_geometric.utils import to_edge_index as pyg_to_edge_index

        if adj.layout == torch.sparse_coo and not adj.is_coalesced():
            # PyG marks the caller's tensor coalesced in place (adj._coalesced_(True)), which reads an entry
            # stored twice as two edges and leaves the caller's tensor lying about itself (a later
            # .coalesce() keeps the duplicate). A coalesced copy sums duplicates, as torch.sparse defines.
            adj = adj.coalesce()  # a new tensor; the caller's is left as it was
        if adj.layout == torch.sparse_coo:  # PyG's own steps without its in-place mark (refused under torch.func)
            indices, values = adj.indices().detach().long(), adj.values()  # (2, E) rows = targets, (E, ...)
        else:
            indices, values = pyg_to_edge_index(adj)  # (2, E) rows = targets, (E, ...) values
    else:  # torch_sparse.SparseTensor
        row, col, values = adj.coo()
        indices = torch.stack([row, col])  # (2, E)
    return indices.flip(0), values  # (2, E): row 0 = source j (column of adj_t), row 1 = target i


def _components(adj) -> tuple[Tensor, ...]:
    """The tensors an adjacency's edges and values are read from (what a cache hit is verified against)."""
    if isinstance(adj, Tensor):
        if adj.layout == torch.sparse_coo:
            return adj._indices(), adj._values()  # private: indices() refuses uncoalesced tensors (checked on 2.13)
        if adj.layout in (torch.sparse_csr, torch.sparse_bsr):
            return adj.crow_indices(), adj.col_indices(), adj.values()
        return adj.ccol_indices(), adj.row_indices(), adj.values()  # CSC / BSC
    row, col, value = adj.storage.row(), adj.storage.col(), adj.storage.value()  # SparseTensor
    return (row, col) if value is None else (row, col, value)


def _cached_conversion(adj) -> tuple[Tensor, Tensor | None]:
    """:func:`_sparse_to_edge_index`, once per adjacency content (so the kernels' structure cache hits too).

    Inside a ``torch.func`` transform an adjacency built there has no storage to key on: converted, not cached.
    """
    if _compat.functorch_active():
        return _sparse_to_edge_index(adj)
    return _ADJ_CACHE.get(
        ("adjacency", adj.layout if isinstance(adj, Tensor) else "SparseTensor", tuple(adj.size())),
        _components(adj),
        lambda: _sparse_to_edge_index(adj),
    )


def to_edge_index(adj, size=None) -> tuple[Tensor, tuple[int, int] | None, Tensor | None]:
    """Any adjacency PyG's ``MessagePassing`` accepts, as ``(edge_index, size, values)``.

    Parameters
    ----------
    adj : Tensor (2, E), torch_geometric.EdgeIndex, torch.sparse Tensor (L, S), or torch_sparse.SparseTensor (L, S)
        An edge list (row 0 = source j, row 1 = target i), or the *transposed*
        adjacency ``adj_t`` PyG passes to ``propagate``: ``adj_t[i, j] != 0``
        is the edge j -> i (``to_torch_csr_tensor(edge_index).t()``,
        ``SparseTensor.from_edge_index(edge_index).t()``), in COO, CSR or CSC layout.
    size : tuple of int, optional
        ``(S, L)`` (sources, targets), PyG order. A sparse adjacency carries its
        own size, which must agree; an ``EdgeIndex`` its ``sparse_size``.

    Returns
    -------
    edge_index : Tensor, shape (2, E)
        A plain tensor (an ``EdgeIndex``'s data, zero-copy); for a sparse
        adjacency the edges in PyG's order for that layout.
    size : tuple (S, L) or None
        From ``size``, the sparse shape or the ``EdgeIndex``; None when unknown.
    values : Tensor, shape (E, ...), or None
        The sparse adjacency's values (None for edge lists).

    Raises
    ------
    TypeError
        For another kind of object.
    ValueError
        If ``size`` disagrees with the adjacency's own size.
    """
    if size is not None:
        size = _size_pair(size)
    if isinstance(adj, Tensor) and adj.layout != torch.strided:
        own = (adj.size(1), adj.size(0))  # adj_t is (L, S)
        edge_index, values = _cached_conversion(adj)
    elif type(adj).__name__ == "SparseTensor" and hasattr(adj, "coo"):
        own = (adj.size(1), adj.size(0))
        edge_index, values = _cached_conversion(adj)
    elif isinstance(adj, Tensor):
        own, values, edge_index = None, None, adj
        if hasattr(adj, "sparse_size") and hasattr(adj, "as_tensor"):  # torch_geometric.EdgeIndex
            known = adj.sparse_size()  # (S, L), None where not known
            own = tuple(known) if None not in known else None
            edge_index = adj.as_tensor()  # the same plain tensor on every call
    else:
        raise TypeError(
            message(
                "edge_index",
                "a LongTensor (2, E), an EdgeIndex, a torch.sparse adjacency or a SparseTensor",
                type(adj).__name__,
            )
        )
    if size is not None and own is not None and tuple(own) != size:
        raise ValueError(message("size", f"the adjacency's size (S, L) = {tuple(own)}", str(size), verb="match"))
    return edge_index, size or own, values
