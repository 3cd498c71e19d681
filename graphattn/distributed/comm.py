"""The exchange: one ``all_to_all_single`` with uneven splits, forward and backward.

Forward, each process sends the rows the plan lists for each other process
and receives the rows it needs; backward, the gradients of the received rows
travel back the same way (splits swapped) and are summed into the rows they
came from (a row sent to several processes gets the sum of their gradients).
That return is itself differentiable (its adjoint is the exchange), so second
derivatives are exact.
``all_to_all_single`` with uneven ``input_split_sizes`` / ``output_split_sizes``
works on gloo (CPU) and NCCL (GPU); checked on torch 2.13.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from graphattn.distributed.plan import ExchangePlan

__all__ = ["exchange"]


def _all_to_all(rows: Tensor, out_rows: int, out_splits: list, in_splits: list, group) -> Tensor:
    """Rows (n_in, ...) scattered by ``in_splits``, gathered by ``out_splits`` into (out_rows, ...)."""
    out = rows.new_empty((out_rows, *rows.shape[1:]))  # (out_rows, ...)
    dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=group)
    return out


class _Exchange(torch.autograd.Function):
    """Forward: this process's rows -> the rows it receives. Backward: :class:`_Return` (differentiable)."""

    @staticmethod
    def forward(ctx, rows: Tensor, plan: ExchangePlan, group):
        ctx.plan, ctx.group, ctx.n_local = plan, group, rows.size(0)
        send = rows.index_select(0, plan.send_index.to(rows.device))  # (n_send, ...)
        return _all_to_all(send, plan.recv_source.numel(), plan.recv_counts, plan.send_counts, group)

    @staticmethod
    def backward(ctx, grad: Tensor):  # (n_recv, ...)
        return _Return.apply(grad, ctx.plan, ctx.group, ctx.n_local), None, None  # (n, ...)


class _Return(torch.autograd.Function):
    """The adjoint of :class:`_Exchange`: received-row gradients back to their owners, summed per row.

    Its own backward is :class:`_Exchange` (the exchange is linear), so
    ``create_graph=True`` gives exact second derivatives.
    """

    @staticmethod
    def forward(ctx, grad: Tensor, plan: ExchangePlan, group, n_local: int):
        ctx.plan, ctx.group = plan, group
        index = plan.send_index.to(grad.device)  # (n_send,)
        back = _all_to_all(grad, index.numel(), plan.send_counts, plan.recv_counts, group)  # (n_send, ...)
        return grad.new_zeros((n_local, *grad.shape[1:])).index_add_(0, index, back)  # (n, ...)

    @staticmethod
    def backward(ctx, grad: Tensor):  # (n, ...)
        return _Exchange.apply(grad, ctx.plan, ctx.group), None, None, None  # (n_recv, ...)


def exchange(rows: Tensor, plan: ExchangePlan, group=None) -> Tensor:
    """The rows other processes own that this process's edges read; differentiable.

    Collective: every process of ``group`` must call it with its own plan of
    the same graph (and, under autograd, run the backward too).

    Parameters
    ----------
    rows : Tensor, shape (n, ...)
        This process's rows (``n = plan.sizes[plan.rank]``), e.g. keys and
        values concatenated on the channel axis, ``(n, H, D + D_v)``.
    plan : ExchangePlan
    group : ProcessGroup, optional
        Default the world group.

    Returns
    -------
    Tensor, shape (n_recv, ...)
        Row t is the row of global position ``plan.recv_source[t]``.

    Notes
    -----
    When no process receives anything (``plan.rows`` is zero, which every
    process knows) no collective runs.
    """
    if not bool(plan.rows.any()):
        return rows[:0]  # (0, ...), still connected to rows for autograd
    return _Exchange.apply(rows, plan, group)
