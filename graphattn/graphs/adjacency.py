"""Adjacency forms PyG users pass (edge_index, EdgeIndex, torch.sparse, SparseTensor) as edge lists
(part of :mod:`graphattn.graphs`)."""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.graphs.edges import _size_pair

__all__ = ["to_edge_index", "ADJ_CACHE_SIZE"]


_ADJ_CACHE: dict[int, tuple] = {}  # id(sparse adjacency) -> (weakref, version, (edge_index, values))
ADJ_CACHE_SIZE = 16


def _sparse_to_edge_index(adj) -> tuple[Tensor, Tensor | None]:
    """A transposed sparse adjacency ``adj_t (L, S)`` (row = target i, column = source j) as edges.

    The edge order is PyG's (:func:`torch_geometric.utils.to_edge_index` for
    ``torch.sparse``, ``SparseTensor.coo()``), so per-edge outputs line up with
    what PyG's own convs return for the same adjacency.
    """
    if isinstance(adj, Tensor):
        from torch_geometric.utils import to_edge_index as pyg_to_edge_index

        indices, values = pyg_to_edge_index(adj)  # (2, E) rows = targets, (E, ...) values
    else:  # torch_sparse.SparseTensor
        row, col, values = adj.coo()
        indices = torch.stack([row, col])  # (2, E)
    return indices.flip(0), values  # (2, E): row 0 = source j (column of adj_t), row 1 = target i


def _cached_conversion(adj) -> tuple[Tensor, Tensor | None]:
    """:func:`_sparse_to_edge_index`, once per adjacency object (so the kernels' structure cache hits)."""
    import weakref

    version = getattr(adj, "_version", None) if isinstance(adj, Tensor) and not adj.is_inference() else -1
    entry = _ADJ_CACHE.get(id(adj))
    if entry is not None and entry[0]() is adj and entry[1] == version and version != -1:
        return entry[2]
    result = _sparse_to_edge_index(adj)
    oid = id(adj)

    def forget(ref, oid=oid):
        if _ADJ_CACHE.get(oid, (None,))[0] is ref:
            del _ADJ_CACHE[oid]

    try:
        _ADJ_CACHE[oid] = (weakref.ref(adj, forget), version, result)
    except TypeError:  # not weak-referenceable: convert every call
        return result
    while len(_ADJ_CACHE) > ADJ_CACHE_SIZE:
        _ADJ_CACHE.pop(next(iter(_ADJ_CACHE)))
    return result


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
        raise TypeError(f"Expected 'edge_index' to be a LongTensor (2, E), an EdgeIndex, a torch.sparse "
                        f"adjacency or a SparseTensor (got {type(adj).__name__})")
    if size is not None and own is not None and tuple(own) != size:
        raise ValueError(f"Expected 'size' to match the adjacency's size (S, L) = {tuple(own)} (got {size})")
    return edge_index, size or own, values
