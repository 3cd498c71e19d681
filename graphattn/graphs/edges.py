"""Edge lists and masks: validation, mask <-> edge list, sorting (part of :mod:`graphattn.graphs`)."""

from __future__ import annotations

import torch
from torch import Tensor

from graphattn.patterns import MAX_ELEMENTS, MAX_LENGTH
from graphattn.validate import as_int, check_edge_list, check_int, check_tensor, message

__all__ = ["check_edge_index", "mask_to_edge_index", "edge_index_to_mask", "sort_edge_index"]


def _size_pair(size, name: str = "size") -> tuple[int, int]:
    """Return ``(S, L)`` from an int ``N`` (square) or a pair ``(S, L)``, each in [0, MAX_LENGTH]."""
    if as_int(size) is not None:
        size = (size, size)
    pair = [as_int(s) for s in size] if isinstance(size, (tuple, list, torch.Size)) and len(size) == 2 else None
    if pair is None or None in pair:
        raise TypeError(message(name, "an int N or a pair of ints (S, L)", size))
    num_src, num_dst = pair
    if num_src is None or num_dst is None or not (0 <= num_src <= MAX_LENGTH and 0 <= num_dst <= MAX_LENGTH):
        raise ValueError(message(name, f"non-negative sizes <= {MAX_LENGTH}", tuple(pair)))
    return num_src, num_dst


def _check_dense(num_dst: int, num_src: int, heads: int = 1) -> None:
    """Refuse a dense (H, L, S) result of more than ``MAX_ELEMENTS`` entries before allocating it."""
    if heads * num_dst * num_src > MAX_ELEMENTS:
        raise ValueError(
            message(
                "size",
                f"a dense (H, L, S) of at most {MAX_ELEMENTS} entries",
                f"H = {heads}, L = {num_dst}, S = {num_src}",
                "keep the edge list",
            )
        )


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
    check_edge_list(name, edge_index, fix="build one with torch.tensor(..., dtype=torch.long)")
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
        raise TypeError(
            message(
                name,
                "a bool tensor where True means may attend",
                mask.dtype,
                f"for a 0/1 tensor where 1 means may attend, pass {name}.bool(); an "
                f"nn.MultiheadAttention mask (True = blocked) must be inverted first: ~{name}",
            )
        )
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
    check_edge_index(edge_index, num_sources, 2**63)  # any int64 target
    src, dst = edge_index.long()  # (E,), (E,) the key in int64: int32 edges would wrap
    if dst.numel() and (int(dst.max()) + 1) * max(num_sources, 1) <= 2**63 - 1:
        perm = torch.argsort(dst * max(num_sources, 1) + src, stable=True)  # (E,) key i S + j
    else:  # i S + j would not fit in int64: two stable passes, by source, then by target
        by_src = torch.argsort(src, stable=True)  # (E,)
        perm = by_src[torch.argsort(dst[by_src], stable=True)]  # (E,)
    return edge_index[:, perm], perm
