"""Conversions between dense masks and edge lists, validation, and batching.

This is the only module that converts between ``(L, S)`` masks and ``(2, E)``
edge lists. Conventions (DESIGN.md):

- ``edge_index[0]`` is the source j (key/value position), ``edge_index[1]`` the
  target i (query position); an edge ``(j, i)`` means "query i may read key j".
- ``mask[i, j] == True`` means "may attend", exactly when ``(j, i)`` is an edge
  (the polarity of ``F.scaled_dot_product_attention``).
- Size tuples follow PyG: ``size=(S, L)`` (sources, targets).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from graphattn.patterns import MAX_ELEMENTS, MAX_LENGTH, full, is_pattern
from graphattn.validate import as_int, check_int, check_tensor, message

__all__ = ["check_edge_index", "mask_to_edge_index", "edge_index_to_mask", "sort_edge_index",
           "edge_weights_to_dense", "dense_to_edge_weights", "batch_sequences", "padded_to_nodes",
           "nodes_to_padded"]


def _size_pair(size, name: str = "size") -> tuple[int, int]:
    """Return ``(S, L)`` from an int ``N`` (square) or a pair ``(S, L)``, each in [0, MAX_LENGTH]."""
    if as_int(size) is not None:
        size = (size, size)
    pair = [as_int(s) for s in size] if isinstance(size, (tuple, list, torch.Size)) and len(size) == 2 else None
    if pair is None or None in pair:
        raise TypeError(message(name, "an int N or a pair of ints (S, L)", size))
    if not all(0 <= n <= MAX_LENGTH for n in pair):
        raise ValueError(message(name, f"non-negative sizes <= {MAX_LENGTH}", tuple(pair)))
    return pair[0], pair[1]


def _check_dense(num_dst: int, num_src: int, heads: int = 1) -> None:
    """Refuse a dense (H, L, S) result of more than ``MAX_ELEMENTS`` entries before allocating it."""
    if heads * num_dst * num_src > MAX_ELEMENTS:
        raise ValueError(message("size", f"a dense (H, L, S) of at most {MAX_ELEMENTS} entries",
                                 f"H = {heads}, L = {num_dst}, S = {num_src}", "keep the edge list"))


def check_edge_index(edge_index: Tensor, num_sources: int, num_targets: int, name: str = "edge_index") -> None:
    """Validate an edge list against ``num_sources`` keys and ``num_targets`` queries.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E), dtype int64 (int32 accepted)
        Row 0 = source j (key), row 1 = target i (query).
    num_sources : int
        S, the number of key/value nodes; sources must lie in ``[0, S)``.
    num_targets : int
        L, the number of query nodes; targets must lie in ``[0, L)``.
    name : str, default "edge_index"
        The argument's name in the messages (e.g. ``"edge_index[2]"`` for layer 2).

    Raises
    ------
    TypeError, ValueError, IndexError
        Not an integer tensor (a nested list too); a shape other than (2, E); an index out of range.
    """
    if not isinstance(edge_index, Tensor):
        raise TypeError(message(name, "a LongTensor of shape (2, E)", type(edge_index).__name__,
                                "build one with torch.tensor(..., dtype=torch.long)"))
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected {name!r} to have an integer dtype (got {edge_index.dtype}); "
                        "to turn a bool mask into edges use graphattn.graphs.mask_to_edge_index")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:  # the template's own example (STYLE.md)
        raise ValueError(f"Expected {name!r} to have shape (2, E) (got {tuple(edge_index.shape)})")
    if edge_index.numel() == 0:
        return
    lo = int(edge_index.min())
    if lo < 0:
        raise IndexError(message(name, "non-negative", f"a minimum of {lo}"))
    max_src, max_dst = (int(m) for m in edge_index.amax(dim=1))
    if max_src >= num_sources:
        raise IndexError(message(f"{name}[0]", f"sources < S = {num_sources} key nodes", max_src))
    if max_dst >= num_targets:
        raise IndexError(message(f"{name}[1]", f"targets < L = {num_targets} query nodes", max_dst))


def _check_mask(mask: Tensor, name: str = "mask") -> None:
    """A 2-D bool tensor, True = may attend; the message for a float mask states the polarity."""
    check_tensor(name, mask, shape_text="(L, S)")
    if mask.dtype != torch.bool:
        raise TypeError(message(name, "a bool tensor where True means may attend", mask.dtype,
                                f"for a 0/1 tensor where 1 means may attend, pass {name}.bool(); an "
                                f"nn.MultiheadAttention mask (True = blocked) must be inverted first: ~{name}"))
    check_tensor(name, mask, dim=2, shape_text="(L, S)")


def mask_to_edge_index(mask: Tensor) -> Tensor:
    """Turn a dense attention mask into an edge list.

    Parameters
    ----------
    mask : Tensor, shape (L, S), dtype bool
        ``mask[i, j] == True`` means query i may attend key j (SDPA polarity).

    Returns
    -------
    edge_index : Tensor, shape (2, E), dtype int64
        One edge ``(j, i)`` per True entry; row 0 = source j, row 1 = target i;
        sorted by target, then source.

    Raises
    ------
    TypeError, ValueError
        ``mask`` not a bool tensor (a 0/1 tensor is refused: say ``mask.bool()``); not 2-D.

    Examples
    --------
    >>> import torch
    >>> mask_to_edge_index(torch.tensor([[True, False], [True, True]]))
    tensor([[0, 0, 1],
            [0, 1, 1]])
    """
    _check_mask(mask)
    query, key = mask.nonzero(as_tuple=True)  # (E,), (E,) row-major: sorted by i, then j
    return torch.stack([key, query])  # (2, E)


def edge_index_to_mask(edge_index: Tensor, size) -> Tensor:
    """Turn an edge list into a dense attention mask.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E)
        Row 0 = source j (key), row 1 = target i (query).
    size : int or (int, int)
        ``N`` for a square graph, or the PyG pair ``(S, L)`` (sources, targets).

    Returns
    -------
    mask : Tensor, shape (L, S), dtype bool
        ``mask[i, j]`` is True exactly when ``(j, i)`` is an edge.

    Raises
    ------
    TypeError, ValueError, IndexError
        As :func:`check_edge_index`; a malformed ``size``; more than ``MAX_ELEMENTS`` entries.

    Examples
    --------
    >>> import torch
    >>> edge_index_to_mask(torch.tensor([[0, 0, 1], [0, 1, 1]]), 2)
    tensor([[ True, False],
            [ True,  True]])
    """
    num_src, num_dst = _size_pair(size)
    check_edge_index(edge_index, num_src, num_dst)
    _check_dense(num_dst, num_src)
    mask = torch.zeros(num_dst, num_src, dtype=torch.bool, device=edge_index.device)  # (L, S)
    mask[edge_index[1], edge_index[0]] = True
    return mask


def sort_edge_index(edge_index: Tensor, num_sources: int) -> tuple[Tensor, Tensor]:
    """Sort edges by target, then source (stable); return the sorted edges and the permutation.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E), int64 or int32
        Row 0 = source j (key), row 1 = target i (query).
    num_sources : int
        S; every source must lie in ``[0, S)``.

    Returns
    -------
    edge_index : Tensor, shape (2, E)
        Same dtype as the input.
    perm : Tensor, shape (E,)
        ``sorted = edge_index[:, perm]``; equal edges keep their order. Raises as
        :func:`check_edge_index` (targets are only checked to be non-negative).

    Examples
    --------
    >>> import torch
    >>> sort_edge_index(torch.tensor([[1, 0, 0], [1, 1, 0]]), 2)
    (tensor([[0, 0, 1],
            [0, 1, 1]]), tensor([2, 1, 0]))
    """
    num_sources = check_int("num_sources", num_sources)
    check_edge_index(edge_index, num_sources, 2 ** 63)  # any int64 target
    src, dst = edge_index.long()  # (E,), (E,) the key in int64: int32 edges would wrap
    if dst.numel() and (int(dst.max()) + 1) * max(num_sources, 1) <= 2 ** 63 - 1:
        perm = torch.argsort(dst * max(num_sources, 1) + src, stable=True)  # (E,) key i S + j
    else:  # i S + j would not fit in int64: two stable passes, by source, then by target
        by_src = torch.argsort(src, stable=True)  # (E,)
        perm = by_src[torch.argsort(dst[by_src], stable=True)]  # (E,)
    return edge_index[:, perm], perm


def edge_weights_to_dense(edge_index: Tensor, alpha: Tensor, size) -> Tensor:
    """Scatter per-edge weights into dense per-head matrices, zero off the edges.

    Parameters
    ----------
    edge_index : Tensor, shape (2, E)
        Row 0 = source j (key), row 1 = target i (query).
    alpha : Tensor, shape (E,) or (E, H)
        One weight per edge (and head). Duplicate edges are summed.
    size : int or (int, int)
        ``N`` for a square graph, or the PyG pair ``(S, L)`` (sources, targets).

    Returns
    -------
    weights : Tensor, shape (H, L, S), or (L, S) for a 1-D ``alpha``
        Queries on rows: ``weights[h, i, j] = alpha[e, h]`` for the edge ``e = (j, i)``.

    Raises
    ------
    TypeError, ValueError, IndexError
        As :func:`edge_index_to_mask`, and ``alpha`` not ``(E,)`` or ``(E, H)``.

    Examples
    --------
    >>> import torch
    >>> edge_weights_to_dense(torch.tensor([[0, 0, 1], [0, 1, 1]]), torch.tensor([1.0, 0.25, 0.75]), 2)
    tensor([[1.0000, 0.0000],
            [0.2500, 0.7500]])
    """
    num_src, num_dst = _size_pair(size)
    check_edge_index(edge_index, num_src, num_dst)
    shape_text = f"(E,) or (E, H) with E = {edge_index.size(1)}"
    check_tensor("alpha", alpha, dim=(1, 2), shape_text=shape_text)
    if alpha.size(0) != edge_index.size(1):
        raise ValueError(message("alpha", f"a Tensor of shape {shape_text}", f"shape {tuple(alpha.shape)}"))
    flat = alpha.unsqueeze(-1) if alpha.dim() == 1 else alpha  # (E, H)
    _check_dense(num_dst, num_src, flat.size(1))
    dense = flat.new_zeros(num_dst, num_src, flat.size(1))  # (L, S, H)
    dense.index_put_((edge_index[1], edge_index[0]), flat, accumulate=True)
    dense = dense.permute(2, 0, 1)  # (H, L, S)
    return dense[0] if alpha.dim() == 1 else dense


def dense_to_edge_weights(weights: Tensor, edge_index: Tensor) -> Tensor:
    """Read dense per-head weights at the edges: the inverse of :func:`edge_weights_to_dense`.

    Parameters
    ----------
    weights : Tensor, shape (H, L, S) or (L, S)
        Queries on rows, keys on columns.
    edge_index : Tensor, shape (2, E)

    Returns
    -------
    alpha : Tensor, shape (E, H), or (E,) for 2-D ``weights``
        ``alpha[e, h] = weights[h, i, j]`` for the edge ``e = (j, i)``.

    Examples
    --------
    >>> import torch
    >>> dense_to_edge_weights(torch.tensor([[1.0, 0.0], [0.25, 0.75]]), torch.tensor([[0, 0, 1], [0, 1, 1]]))
    tensor([1.0000, 0.2500, 0.7500])
    """
    check_tensor("weights", weights, dim=(2, 3), shape_text="(H, L, S) or (L, S)")
    num_dst, num_src = weights.shape[-2:]
    check_edge_index(edge_index, num_src, num_dst)
    if weights.dim() == 2:
        return weights[edge_index[1], edge_index[0]]  # (E,)
    return weights[:, edge_index[1], edge_index[0]].t()  # (H, E) -> (E, H)


def _check_lengths(lengths) -> list[int]:
    if isinstance(lengths, Tensor):
        lengths = lengths.tolist()
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(message("lengths", "a sequence of ints, one per sequence", lengths))
    lengths = list(lengths)
    ints = [as_int(n) for n in lengths]
    if any(n is None or n < 0 for n in ints) or sum(ints) > MAX_LENGTH:
        raise ValueError(message("lengths", f"non-negative ints, {MAX_LENGTH} nodes at most in all", lengths))
    return ints


def batch_sequences(lengths: Sequence[int] | Tensor, pattern=None) -> tuple[Tensor, Tensor]:
    """Turn a variable-length batch into one disjoint graph.

    Sequence b has ``lengths[b]`` tokens; its nodes are numbered after those of
    the sequences before it (the order of ``padded_to_nodes``). Padding nodes do
    not exist, so no query can attend a padding key and no masking is needed:
    this equals dense attention with a ``key_padding_mask`` on the valid positions.

    Parameters
    ----------
    lengths : sequence of int or Tensor, shape (B,)
        Number of tokens of each sequence.
    pattern : graphattn.patterns.Pattern, optional
        Connectivity inside each sequence (default: the complete graph
        ``patterns.full()``). Must provide ``edge_index(L)``.

    Returns
    -------
    edge_index : Tensor, shape (2, E)
        Sorted by target, then source; ``E = sum_b E_b``.
    batch : Tensor, shape (N,)
        Sequence index of each node, ``N = sum(lengths)`` (PyG's ``batch`` vector).

    Raises
    ------
    TypeError, ValueError
        A length not a non-negative int, or more than ``MAX_LENGTH`` nodes; ``pattern`` not a Pattern.

    Examples
    --------
    >>> edge_index, batch = batch_sequences([2, 1])
    >>> edge_index
    tensor([[0, 1, 0, 1, 2],
            [0, 0, 1, 1, 2]])
    >>> batch
    tensor([0, 0, 1])
    """
    lengths = _check_lengths(lengths)
    pattern = full() if pattern is None else pattern
    if not is_pattern(pattern):
        raise TypeError(message("pattern", "a graphattn.patterns.Pattern, e.g. patterns.causal()", pattern))
    counts = torch.tensor(lengths, dtype=torch.long)  # (B,)
    offsets = torch.cumsum(counts, 0) - counts  # (B,)
    cache: dict[int, Tensor] = {}
    parts = []
    for n, offset in zip(lengths, offsets.tolist()):
        if n not in cache:
            cache[n] = pattern.edge_index(n)  # (2, E_b)
        parts.append(cache[n] + offset)
    edge_index = torch.cat(parts, dim=1) if parts else torch.empty(2, 0, dtype=torch.long)  # (2, E)
    batch = torch.repeat_interleave(torch.arange(len(lengths)), counts)  # (N,)
    return edge_index, batch


def padded_to_nodes(x: Tensor, lengths: Sequence[int] | Tensor) -> tuple[Tensor, Tensor]:
    """Drop the padding of a right-padded ``(B, T, F)`` batch: node features and ``batch``.

    Parameters
    ----------
    x : Tensor, shape (B, T, ...)
        Right-padded batch; sequence b occupies ``x[b, :lengths[b]]``.
    lengths : sequence of int or Tensor, shape (B,)

    Returns
    -------
    nodes : Tensor, shape (N, ...)
        ``N = sum(lengths)``, sequences one after the other.
    batch : Tensor, shape (N,)

    Raises
    ------
    TypeError, ValueError
        ``x`` not a Tensor; ``len(lengths) != B`` or a length above ``T``.
    """
    lengths = _check_lengths(lengths)
    shape_text = f"(B, T, ...) with B = len(lengths) = {len(lengths)}"
    check_tensor("x", x, shape_text=shape_text)
    if x.dim() < 2 or x.size(0) != len(lengths):
        raise ValueError(message("x", f"a Tensor of shape {shape_text}", f"shape {tuple(x.shape)}"))
    if lengths and max(lengths) > x.size(1):
        raise ValueError(message("lengths", f"<= T = {x.size(1)}", max(lengths)))
    counts = torch.tensor(lengths, dtype=torch.long, device=x.device)  # (B,)
    valid = torch.arange(x.size(1), device=x.device) < counts[:, None]  # (B, T)
    batch = torch.repeat_interleave(torch.arange(len(lengths), device=x.device), counts)  # (N,)
    return x[valid], batch  # (N, ...), (N,)


def nodes_to_padded(x: Tensor, batch: Tensor, max_length: int | None = None,
                    batch_size: int | None = None) -> tuple[Tensor, Tensor]:
    """Pad node features back to ``(B, T, F)``; the inverse of :func:`padded_to_nodes`.

    Node n goes to row ``batch[n]``, in its order among that sequence's nodes;
    ``batch`` need not be sorted (it is sorted stably first, as PyG's
    ``to_dense_batch``, which does the padding, requires).

    Parameters
    ----------
    x : Tensor, shape (N, ...)
    batch : Tensor, shape (N,), integer
        Sequence index of each node.
    max_length : int, optional
        T; default the longest sequence. A longer sequence raises (where
        ``to_dense_batch`` would drop its last nodes silently).
    batch_size : int, optional
        B; default ``batch.max() + 1``. Keeps trailing empty sequences:
        lengths [1, 1, 0] are ``batch = [0, 1]`` with B = 3.

    Returns
    -------
    padded : Tensor, shape (B, T, ...)
        Zero at padding positions.
    valid : Tensor, shape (B, T), dtype bool
        True at real tokens (the negation of a ``key_padding_mask``).

    Raises
    ------
    TypeError, ValueError, IndexError
        Not tensors or ints; shapes that disagree or a sequence longer than
        ``max_length``; a ``batch`` entry outside ``[0, batch_size)``.

    Examples
    --------
    >>> import torch
    >>> padded, valid = nodes_to_padded(torch.tensor([[1.0], [2.0]]), torch.tensor([1, 0]), batch_size=3)
    >>> padded[..., 0].tolist(), valid.tolist()
    ([[2.0], [1.0], [0.0]], [[True], [True], [False]])
    """
    from torch_geometric.utils import to_dense_batch

    check_tensor("x", x, dim=tuple(range(1, 64)), shape_text="(N, ...)")
    num_n = x.size(0)
    check_tensor("batch", batch, dim=1, shape_text=f"(N,) with N = {num_n}")
    if batch.is_floating_point() or batch.is_complex() or batch.dtype == torch.bool:
        raise TypeError(message("batch", "an integer Tensor", batch.dtype))
    if batch.numel() != num_n:
        raise ValueError(message("batch", f"a Tensor of shape (N,) with N = {num_n}", f"shape {tuple(batch.shape)}"))
    top = int(batch.max()) + 1 if num_n else 0
    num_b = top if batch_size is None else check_int("batch_size", batch_size, 0, MAX_LENGTH)
    if num_n and (int(batch.min()) < 0 or top > num_b):
        raise IndexError(message("batch", f"sequence indices in [0, {num_b})", f"[{int(batch.min())}, {top - 1}]"))
    longest = int(torch.bincount(batch.long(), minlength=num_b).max()) if num_b else 0  # (B,) -> max
    num_t = longest if max_length is None else check_int("max_length", max_length, 0, MAX_LENGTH)
    if longest > num_t:
        raise ValueError(message("max_length", f">= the longest sequence, {longest} nodes", num_t))
    _check_dense(num_b, num_t, x[0].numel() if num_n else 1)
    order = torch.argsort(batch, stable=True)  # (N,) sequences grouped, each in its own order
    return to_dense_batch(x[order], batch[order], max_num_nodes=num_t, batch_size=num_b)


# -- adjacency forms PyG users pass (edge_index, EdgeIndex, torch.sparse, SparseTensor) ---------------

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


__all__ += ["to_edge_index"]
