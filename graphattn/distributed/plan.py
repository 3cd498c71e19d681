"""The exchange plan: which key/value rows each process needs from each other, computed once from the graph.

Process r owns the contiguous block ``[start_r, stop_r)`` of the L positions
(queries, keys and values alike; blocks in rank order, sizes may differ, a
block may be empty). Its queries read the sources of the edges that enter
them; the sources outside its own block are the rows it receives. The plan is
the same on every process (it is a function of the graph and the block sizes
only), so no process has to ask another what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from graphattn.graphs import check_edge_index
from graphattn.patterns import is_pattern
from graphattn.validate import as_int, check_int, message

__all__ = ["ExchangePlan", "block_bounds", "build_plan", "owners"]


def block_bounds(sizes) -> Tensor:
    """Block boundaries ``(P + 1,)`` int64: process r owns ``[bounds[r], bounds[r + 1])``.

    Raises
    ------
    TypeError, ValueError
        ``sizes`` not a non-empty sequence of non-negative ints.
    """
    if isinstance(sizes, Tensor):
        sizes = sizes.tolist()
    if not isinstance(sizes, (list, tuple)) or not sizes:
        raise TypeError(message("sizes", "a non-empty sequence of block sizes, one per process", repr(sizes)))
    sizes = [check_int("sizes", s) for s in sizes]
    return torch.tensor([0] + sizes).cumsum(0)  # (P + 1,)


def owners(bounds: Tensor, positions: Tensor) -> Tensor:
    """The process owning each position: the r with ``bounds[r] <= x < bounds[r + 1]`` (empty blocks skipped)."""
    return torch.searchsorted(bounds, positions, right=True) - 1  # (n,)


@dataclass(frozen=True, eq=False, repr=False)
class ExchangePlan:
    """What one process sends, receives and attends, for one graph split into blocks.

    Built by :func:`build_plan`; reusable across layers and steps as long as
    the graph and the block sizes stay the same.

    Attributes
    ----------
    sizes : tuple of int
        Positions per process, in rank order (sum L).
    rank : int
        The process this plan is for.
    rows : Tensor, shape (P, P), int64
        ``rows[r, s]`` = key/value rows process r receives from process s
        (the distinct sources in block s of the edges into block r);
        diagonal 0. The same on every process: the whole traffic.
    send_index : Tensor, shape (n_send,), int64
        Local row ids (in ``[0, sizes[rank])``) this process sends, grouped by
        destination rank in ascending order, ascending within a group.
    recv_source : Tensor, shape (n_recv,), int64
        Global positions of the rows it receives, ascending (so grouped by
        source rank).
    edge_index : Tensor, shape (2, E_local), int64
        The local graph: row 0 = key row in the gathered buffer ``[own rows,
        received rows]`` (``sizes[rank] + n_recv`` rows), row 1 = local
        query in ``[0, sizes[rank])``.
    edge_ids : Tensor, shape (E_local,), int64
        Position of each local edge in the global edge list (the edges whose
        target is in this block, in global order): ``edge_bias[plan.edge_ids]``
        gives this process's share of a global ``edge_bias``.
    global_edge_index : Tensor, shape (2, E_local), int64
        The same local edges in global positions.
    num_edges : int
        E of the global graph.
    """

    sizes: tuple
    rank: int
    rows: Tensor
    send_index: Tensor
    recv_source: Tensor
    edge_index: Tensor
    edge_ids: Tensor
    global_edge_index: Tensor
    num_edges: int

    def __repr__(self) -> str:
        return (
            f"ExchangePlan(rank={self.rank}, sizes={self.sizes}, receives {self.recv_source.numel()} rows, "
            f"sends {self.send_index.numel()} rows, {self.edge_ids.numel()} of {self.num_edges} edges)"
        )

    @property
    def world_size(self) -> int:
        return len(self.sizes)

    @property
    def length(self) -> int:
        """L, the whole sequence."""
        return sum(self.sizes)

    @property
    def start(self) -> int:
        """First global position of this process's block."""
        return sum(self.sizes[: self.rank])

    @property
    def send_counts(self) -> list:
        """Rows sent to each process (P,): ``rows[:, rank]``."""
        return self.rows[:, self.rank].tolist()

    @property
    def recv_counts(self) -> list:
        """Rows received from each process (P,): ``rows[rank, :]``."""
        return self.rows[self.rank].tolist()

    def traffic(self, heads: int, channels: int, value_channels: int | None = None, element_size: int = 4) -> dict:
        """Rows and bytes each process sends and receives in one forward exchange.

        The forward sends key and value rows; the backward sends their
        gradients back the same way (the same bytes in the other direction).

        Parameters
        ----------
        heads : int
            H.
        channels : int
            D, channels per head of the keys.
        value_channels : int, optional
            D_v, channels per head of the values; default ``channels``.
        element_size : int, default 4
            Bytes per element (4 for float32, 2 for bfloat16).

        Returns
        -------
        dict
            ``recv_rows``, ``send_rows`` (lists of P ints), ``recv_bytes``,
            ``send_bytes`` (lists of P ints, bytes), ``row_bytes`` (int, one
            key row plus one value row).
        """
        d_v = channels if value_channels is None else value_channels
        row_bytes = (
            check_int("heads", heads, 1)
            * (check_int("channels", channels, 1) + d_v)
            * check_int("element_size", element_size, 1)
        )
        recv, send = self.rows.sum(1), self.rows.sum(0)  # (P,), (P,)
        return {
            "recv_rows": recv.tolist(),
            "send_rows": send.tolist(),
            "row_bytes": row_bytes,
            "recv_bytes": (recv * row_bytes).tolist(),
            "send_bytes": (send * row_bytes).tolist(),
        }


def _global_edges(graph, L: int) -> Tensor:
    if is_pattern(graph):
        return graph.edge_index(L, L)  # (2, E), O(E)
    check_edge_index(graph, L, L, name="graph")
    return graph.long()  # (2, E)


def build_plan(graph, sizes, rank: int) -> ExchangePlan:
    """Plan the exchange of process ``rank`` for ``graph`` split into blocks of ``sizes``.

    Parameters
    ----------
    graph : Tensor, shape (2, E), or graphattn.patterns.Pattern
        The global graph on L = sum(sizes) positions: row 0 = source j (key),
        row 1 = target i (query); a pattern stands for ``pattern.edge_index(L)``.
    sizes : sequence of int
        Positions per process, in rank order.
    rank : int
        The process, in ``[0, len(sizes))``.

    Returns
    -------
    ExchangePlan

    Raises
    ------
    TypeError, ValueError, IndexError
        ``sizes`` not non-negative ints, ``rank`` out of range, ``graph``
        neither a pattern nor a valid edge list on L positions.

    Notes
    -----
    O(E log E) time and O(E) memory: one ``unique`` over the cross edges,
    keyed ``(target's process) * L + source``. A pattern's edges are built
    once, in O(E) (never an L x L grid); for traffic alone at sizes where the
    edges do not fit, :func:`graphattn.distributed.traffic.pattern_rows` plans
    from the pattern's rule.

    Examples
    --------
    >>> from graphattn.patterns import window
    >>> plan = build_plan(window(1, 1), [3, 3], rank=0)
    >>> plan
    ExchangePlan(rank=0, sizes=(3, 3), receives 1 rows, sends 1 rows, 8 of 16 edges)
    >>> plan.rows.tolist(), plan.send_index.tolist(), plan.recv_source.tolist()
    ([[0, 1], [1, 0]], [2], [3])
    """
    bounds = block_bounds(sizes)  # (P + 1,)
    P, L = bounds.numel() - 1, int(bounds[-1])
    if as_int(rank) is None:
        raise TypeError(message("rank", "an int", type(rank).__name__))
    rank = check_int("rank", rank, 0, P - 1)
    src, dst = _global_edges(graph, L)  # (E,), (E,)
    own_dst, own_src = owners(bounds, dst), owners(bounds, src)  # (E,), (E,)
    cross = own_src != own_dst  # (E,)
    key = torch.unique(own_dst[cross] * L + src[cross])  # (U,) sorted by receiver, then source
    receiver, source = key // L, key % L  # (U,), (U,)
    sender = owners(bounds, source)  # (U,)
    rows = torch.zeros(P, P, dtype=torch.long).index_put_((receiver, sender), torch.ones_like(key), accumulate=True)
    a, n = int(bounds[rank]), int(bounds[rank + 1] - bounds[rank])
    send_index = source[sender == rank] - a  # (n_send,) grouped by receiver (key order), ascending within
    recv_source = source[receiver == rank]  # (n_recv,) ascending
    mine = (own_dst == rank).nonzero().squeeze(1)  # (E_local,) global edge ids
    j, i = src[mine], dst[mine]  # (E_local,), (E_local,)
    inside = (j >= a) & (j < a + n)  # (E_local,)
    # own rows come first in the buffer; a received row sits at n + its rank in recv_source (ascending)
    local_j = torch.where(inside, j - a, n + torch.searchsorted(recv_source, j))  # (E_local,)
    return ExchangePlan(
        sizes=tuple(int(s) for s in (bounds[1:] - bounds[:-1]).tolist()),
        rank=rank,
        rows=rows,
        send_index=send_index,
        recv_source=recv_source,
        edge_index=torch.stack([local_j, i - a]),
        edge_ids=mine,
        global_edge_index=torch.stack([j, i]),
        num_edges=src.numel(),
    )
