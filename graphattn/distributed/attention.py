"""Context-parallel attention: a block of queries per process, the rows its edges cross exchanged."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from graphattn.distributed.comm import exchange
from graphattn.distributed.plan import ExchangePlan, build_plan
from graphattn.ops import attention as local_attention
from graphattn.ops import check_qkv
from graphattn.validate import check_int, message

__all__ = ["attention", "plan_for_group"]


def _check_initialised() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            message(
                "torch.distributed",
                "initialised before context-parallel attention",
                "no process group",
                "call torch.distributed.init_process_group first",
            )
        )


def plan_for_group(graph, num_local: int, group=None) -> ExchangePlan:
    """Build this process's plan: gathers every process's block size (one small collective).

    Parameters
    ----------
    graph : Tensor, shape (2, E), or graphattn.patterns.Pattern
        The global graph on L = sum of the block sizes positions.
    num_local : int
        This process's block size.
    group : ProcessGroup, optional
        Default the world group; ranks are the group's.

    Returns
    -------
    ExchangePlan

    Raises
    ------
    TypeError, ValueError
        ``num_local`` not a non-negative int; this process not in ``group``.
    RuntimeError
        ``torch.distributed`` not initialised.
    """
    num_local = check_int("num_local", num_local)  # a float 5.5 must not become 5 rows silently
    _check_initialised()
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            message(
                "group",
                "a process group this process belongs to",
                f"rank {rank} in it",
                "call context-parallel attention only on the group's members",
            )
        )
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"  # NCCL moves device tensors only
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]  # P x (1,)
    # the list form: all_gather_into_tensor is deprecated in torch 2.13 and all_gather_single is new there
    dist.all_gather(sizes, torch.tensor([num_local], device=device), group=group)
    return build_plan(graph, [int(s) for s in sizes], rank)


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    graph,
    *,
    group=None,
    scale: float | None = None,
    edge_bias: Tensor | None = None,
    dropout: float = 0.0,
    training: bool = True,
    need_weights: bool = False,
    impl: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """Graph attention over a sequence split across processes, exactly as on one process.

    Process r passes the queries, keys and values of its own contiguous block
    of positions ``[start_r, start_r + n_r)`` (blocks in rank order; sizes may
    differ, a block may be empty) and gets its block of the output of
    :func:`graphattn.attention` on the whole sequence. The key/value rows its
    queries read from other blocks, and only those, are exchanged with one
    ``all_to_all_single`` (gloo on CPU, NCCL on GPU); the backward sends the
    key/value gradients back the same way. Collective: every process of the
    group calls it (and runs the backward) with the same graph.

    Parameters
    ----------
    query : Tensor, shape (n_r, H, D)
        This process's queries (targets i).
    key : Tensor, shape (n_r, H, D)
        This process's keys (sources j), the same positions.
    value : Tensor, shape (n_r, H, D_v)
    graph : Tensor (2, E), graphattn.patterns.Pattern, or ExchangePlan
        The global graph on L = sum of n_r positions (row 0 = source j = key,
        row 1 = target i = query, global positions), the same on every
        process; or this process's plan from a previous call
        (:func:`plan_for_group` or :func:`~graphattn.distributed.build_plan`),
        which skips the planning.
    group : ProcessGroup, optional
        Default the world group.
    scale : float, optional
        Default ``1 / sqrt(D)``.
    edge_bias : Tensor, shape (E_local,) or (E_local, H), optional
        The bias of this process's edges only: the edges whose target lies in
        its block, in the order of the global edge list (for a pattern, sorted
        by target then source). Slice a global bias with
        ``edge_bias[plan.edge_ids]``; its gradient is then this process's
        share of the global gradient.
    dropout : float, default 0.0
        On the attention weights, drawn independently on each process.
    training : bool, default True
    need_weights : bool, default False
        Also return the weights of the local edges.
    impl : {"auto", "sdpa", "block", "csr"}, default "auto"
        The local kernel (:func:`graphattn.attention`).

    Returns
    -------
    output : Tensor, shape (n_r, H, D_v)
        This block of the output; a query with no incoming edge gets a zero row.
    alpha : Tensor, shape (E_local, H), or None
        Weights of the local edges (``plan.global_edge_index``), in their order.

    Raises
    ------
    TypeError, ValueError
        As :func:`graphattn.attention`; ``key`` and ``query`` of different
        lengths; a plan made for another rank, world size or block size.
    RuntimeError
        ``torch.distributed`` not initialised.

    See Also
    --------
    graphattn.distributed.build_plan, graphattn.distributed.exchange

    Notes
    -----
    The local call is :func:`graphattn.attention` on the n_r local queries
    with ``n_r + n_recv`` keys (own rows, then the received ones) and the
    relabelled local edges, so every kernel and check of one process applies.
    Keys and values travel as one ``(rows, H, D + D_v)`` tensor: one
    collective per call. Traffic per process is ``plan.traffic(H, D)``: a
    window's halo, not the sequence (docs/distributed.md).
    """
    check_qkv(query, key, value)
    if key.size(0) != query.size(0):
        raise ValueError(
            message(
                "key",
                "the rows of this process's block, as many as 'query'",
                f"{key.size(0)} keys and {query.size(0)} queries",
            )
        )
    _check_initialised()
    plan = graph if isinstance(graph, ExchangePlan) else plan_for_group(graph, query.size(0), group)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if (plan.world_size, plan.rank, plan.sizes[plan.rank]) != (world, rank, query.size(0)):
        raise ValueError(
            message(
                "graph",
                f"a plan for rank {rank} of {world} with {query.size(0)} rows",
                f"rank {plan.rank} of {plan.world_size} with {plan.sizes[plan.rank]} rows",
            )
        )
    d = key.size(-1)
    rows = torch.cat([key, value], -1)  # (n, H, D + D_v)
    buffer = torch.cat([rows, exchange(rows, plan, group)])  # (n + n_recv, H, D + D_v)
    keys, values = buffer[..., :d], buffer[..., d:]  # (n + n_recv, H, D), (n + n_recv, H, D_v)
    return local_attention(
        query,
        keys,
        values,
        plan.edge_index.to(query.device),
        scale=scale,
        edge_bias=edge_bias,
        dropout=dropout,
        training=training,
        need_weights=need_weights,
        impl=impl,
    )
