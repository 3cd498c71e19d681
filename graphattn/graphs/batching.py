"""Variable-length batches as one disjoint graph; padded <-> node tensors (part of :mod:`graphattn.graphs`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from graphattn.graphs.edges import _check_dense
from graphattn.patterns import MAX_LENGTH, full, is_pattern
from graphattn.validate import as_int, check_int, check_tensor, message

__all__ = ["batch_sequences", "padded_to_nodes", "nodes_to_padded"]


def _length_tensor(lengths) -> Tensor:
    """``lengths`` as a LongTensor (B,) on the CPU, checked; a Tensor without a Python loop over its entries."""
    if (
        isinstance(lengths, Tensor)
        and lengths.dim() == 1
        and not (lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool)
    ):
        counts = lengths.detach().long().cpu()  # (B,)
        if counts.numel() and (int(counts.min()) < 0 or int(counts.sum()) > MAX_LENGTH):
            raise ValueError(
                message(
                    "lengths",
                    f"non-negative ints, {MAX_LENGTH} nodes at most in all",
                    f"a minimum of {int(counts.min())} and {int(counts.sum())} nodes",
                )
            )
        return counts
    return torch.tensor(_check_lengths(lengths), dtype=torch.long)  # (B,)


def _check_lengths(lengths) -> list[int]:
    if isinstance(lengths, Tensor):
        lengths = lengths.tolist()
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(message("lengths", "a sequence of ints, one per sequence", lengths))
    lengths = list(lengths)
    ints = [n for n in map(as_int, lengths) if n is not None and n >= 0]
    if len(ints) != len(lengths) or sum(ints) > MAX_LENGTH:
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
    counts = _length_tensor(lengths)  # (B,)
    pattern = full() if pattern is None else pattern
    if not is_pattern(pattern):
        raise TypeError(message("pattern", "a graphattn.patterns.Pattern, e.g. patterns.causal()", pattern))
    offsets = torch.cumsum(counts, 0) - counts  # (B,) first node of each sequence
    # One pattern.edge_index(n) per distinct length n (the Python loop runs over sizes, never over the B
    # sequences, so empty ones cost nothing); sequence b's E_n edges, shifted by its first node, fill
    # positions edge_starts[b] .. edge_starts[b] + E_n - 1 of the output: sequence order, each sorted.
    sizes = torch.unique(counts[counts > 0]).tolist()
    local = {n: pattern.edge_index(n) for n in sizes}  # n -> (2, E_n)
    per_seq = torch.zeros_like(counts)  # (B,) edges of each sequence
    for n in sizes:
        per_seq[counts == n] = local[n].size(1)
    edge_starts = torch.cumsum(per_seq, 0) - per_seq  # (B,)
    edge_index = torch.empty(2, int(per_seq.sum()), dtype=torch.long)  # (2, E)
    for n in sizes:
        seqs = (counts == n).nonzero().squeeze(1)  # (G,) the sequences of length n
        edges = local[n]  # (2, E_n)
        slots = edge_starts[seqs, None] + torch.arange(edges.size(1))  # (G, E_n) output positions
        edge_index[:, slots.reshape(-1)] = (edges[:, None, :] + offsets[seqs, None]).reshape(2, -1)  # (2, G*E_n)
    batch = torch.repeat_interleave(torch.arange(counts.numel()), counts)  # (N,)
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


def nodes_to_padded(
    x: Tensor, batch: Tensor, max_length: int | None = None, batch_size: int | None = None
) -> tuple[Tensor, Tensor]:
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
