"""GATv2's edge scores as one operator: ``s_e = att · leaky_relu(x_l[j] + x_r[i] (+ edge_e))``, no (E, H, C) tensor.

GATv2 (Brody et al. 2022) scores edge ``e = (j -> i)``, head ``h``, as

.. math::
    s_e^h = \\sum_c a^h_c \\, \\mathrm{LeakyReLU}\\big(x^l_{j,h,c} + x^r_{i,h,c} (+ x^e_{e,h,c})\\big)

PyG's ``GATv2Conv`` (and graphattn's layer before this operator) gathers both
node halves per edge and adds them, an ``(E, H, C)`` tensor, then applies the
nonlinearity and the dot product: three more ``(E, H, C)`` tensors forward and
their gradients backward. ``graphattn::gatv2_score`` computes each score in
registers, edge by edge (numba, the source and target rows prefetched a few
edges ahead, :mod:`graphattn.ops.prefetch`), and its backward recomputes the
sum from the same rows: ``d x^l_j``, ``d x^r_i`` (scatter-added in edge
order), ``d a`` (summed in float64, then rounded) and the edge term's gradient
only when it is asked for.

The numba kernels run on the CPU in float32/float64 on one thread (the
backward scatter-adds into source and target rows: no thread-safe split yet);
otherwise (CUDA, half types, several threads, no numba) the readable
formulation runs: the same sum with PyTorch operations, and its gradients
written out (:func:`reference_score_backward`). With grad mode on in the backward
(``create_graph=True``), the readable formulation runs under autograd, so
second derivatives are exact. Registered at import, as the other ``graphattn::``
operators (:mod:`graphattn.ops.operators`).
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn.ops.fused import _has_numba, _np, _scalar

__all__ = ["gatv2_score", "gatv2_score_op", "gatv2_score_backward_op", "reference_score", "reference_score_backward"]

_LOCK = threading.Lock()
_KERNELS: list = []  # [(forward, backward)] once built


def _build():
    import numba
    import numpy as np

    from graphattn.ops.prefetch import DISTANCE, prefetch_row, prefetch_row_write

    jit = numba.njit(cache=True, fastmath={"reassoc", "contract"}, nogil=True)
    ahead = DISTANCE

    @jit
    def forward(src, dst, xl, xr, att, edge, has_edge, slope, score):  # pragma: no cover (compiled)
        E = src.shape[0]
        H, C = att.shape
        zero = slope - slope  # 0 in the feature dtype: sums stay in it
        for e in range(E):
            if e + ahead < E:
                prefetch_row(xl, src[e + ahead])
                prefetch_row(xr, dst[e + ahead])
            j, i = src[e], dst[e]
            for h in range(H):
                s = zero
                for c in range(C):
                    z = xl[j, h, c] + xr[i, h, c]
                    if has_edge:
                        z += edge[e, h, c]
                    s += att[h, c] * (z if z > 0 else slope * z)
                score[e, h] = s

    @jit
    def backward(
        src, dst, xl, xr, att, edge, has_edge, slope, one, g, dxl, dxr, datt, dedge, need_edge
    ):  # pragma: no cover
        E = src.shape[0]
        H, C = att.shape
        total = np.zeros((H, C), np.float64)  # d att: a sum over every edge, kept in float64
        for e in range(E):
            if e + ahead < E:
                n, m = src[e + ahead], dst[e + ahead]
                prefetch_row(xl, n)
                prefetch_row(xr, m)
                prefetch_row_write(dxl, n)
                prefetch_row_write(dxr, m)
            j, i = src[e], dst[e]
            for h in range(H):
                gh = g[e, h]
                for c in range(C):
                    z = xl[j, h, c] + xr[i, h, c]
                    if has_edge:
                        z += edge[e, h, c]
                    positive = z > 0
                    total[h, c] += gh * (z if positive else slope * z)
                    dz = gh * att[h, c] * (one if positive else slope)
                    dxl[j, h, c] += dz
                    dxr[i, h, c] += dz
                    if need_edge:
                        dedge[e, h, c] = dz
        for h in range(H):
            for c in range(C):
                datt[h, c] = total[h, c]

    return forward, backward


def _kernels():
    with _LOCK:
        if not _KERNELS:
            _KERNELS.append(_build())
        return _KERNELS[0]


def _kernels_run(x_l: Tensor, x_r: Tensor, att: Tensor, edge: Tensor | None) -> bool:
    """The kernels run these inputs: CPU, one thread, one float dtype (float32/float64) for all, numba present."""
    dtype = x_l.dtype
    if x_l.device.type != "cpu" or dtype not in (torch.float32, torch.float64) or torch.get_num_threads() > 1:
        return False
    if any(t is not None and t.dtype != dtype for t in (x_r, att, edge)):
        return False
    return _has_numba()


def reference_score(x_l, x_r, att, src, dst, edge, negative_slope: float) -> Tensor:
    """The readable formulation (PyG's): ``(leaky_relu(x_l[src] + x_r[dst] (+ edge)) * att).sum(-1)`` -> (E, H)."""
    h = x_l.index_select(0, src) + x_r.index_select(0, dst)  # (E, H, C)
    if edge is not None:
        h = h + edge  # (E, H, C)
    return (F.leaky_relu(h, negative_slope) * att).sum(-1)  # (E, H, C) · (H, C) -> (E, H)


def reference_score_backward(grad, x_l, x_r, att, src, dst, edge, negative_slope: float, need_edge: bool):
    """The readable formulation's gradients, written out: ``d x_l``, ``d x_r``, ``d att``, ``d edge`` (or (0, H, C))."""
    z = x_l.index_select(0, src) + x_r.index_select(0, dst)  # (E, H, C)
    if edge is not None:
        z = z + edge
    positive = z > 0  # (E, H, C)
    g = grad.unsqueeze(-1)  # (E, H, 1)
    d_att = (g * torch.where(positive, z, negative_slope * z)).sum(0)  # (H, C)
    dz = g * att * torch.where(positive, z.new_tensor(1.0), z.new_tensor(negative_slope))  # (E, H, C)
    d_l = torch.zeros_like(x_l).index_add_(0, src, dz)  # (S, H, C)
    d_r = torch.zeros_like(x_r).index_add_(0, dst, dz)  # (L, H, C)
    return d_l, d_r, d_att, dz if need_edge and edge is not None else x_l.new_empty(0, *att.shape)


@torch.library.custom_op("graphattn::gatv2_score", mutates_args=())
def gatv2_score_op(
    x_l: Tensor, x_r: Tensor, att: Tensor, src: Tensor, dst: Tensor, edge: Tensor | None, negative_slope: float
) -> Tensor:
    """``score (E, H)``; ``x_l (S, H, C)``, ``x_r (L, H, C)``, ``att (H, C)``, ``src``/``dst`` (E,), ``edge (E, H, C)``."""
    if not _kernels_run(x_l, x_r, att, edge):
        return reference_score(x_l, x_r, att, src, dst, edge, negative_slope)
    forward, _ = _kernels()
    score = x_l.new_empty(src.numel(), att.size(0))  # (E, H)
    e = x_l.new_zeros(1, 1, 1) if edge is None else edge
    forward(
        _np(src),
        _np(dst),
        _np(x_l),
        _np(x_r),
        _np(att),
        _np(e),
        edge is not None,
        _scalar(negative_slope, x_l),
        score.numpy(),
    )
    return score


@gatv2_score_op.register_fake
def _(x_l, x_r, att, src, dst, edge, negative_slope):
    return x_l.new_empty(src.size(0), att.size(0))


@torch.library.custom_op("graphattn::gatv2_score_backward", mutates_args=())
def gatv2_score_backward_op(
    grad: Tensor,
    x_l: Tensor,
    x_r: Tensor,
    att: Tensor,
    src: Tensor,
    dst: Tensor,
    edge: Tensor | None,
    negative_slope: float,
    need_edge: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``d x_l (S, H, C)``, ``d x_r (L, H, C)``, ``d att (H, C)`` and ``d edge (E, H, C)`` (``(0, H, C)`` unless asked)."""
    H, C = att.shape
    if not _kernels_run(x_l, x_r, att, edge):
        return reference_score_backward(grad, x_l, x_r, att, src, dst, edge, negative_slope, need_edge)
    _, backward = _kernels()
    dxl, dxr = torch.zeros_like(x_l), torch.zeros_like(x_r)
    datt = torch.empty_like(att)
    dedge = x_l.new_empty(src.numel() if need_edge and edge is not None else 0, H, C)
    e = x_l.new_zeros(1, 1, 1) if edge is None else edge
    backward(
        _np(src),
        _np(dst),
        _np(x_l),
        _np(x_r),
        _np(att),
        _np(e),
        edge is not None,
        _scalar(negative_slope, x_l),
        _scalar(1.0, x_l),
        _np(grad),
        dxl.numpy(),
        dxr.numpy(),
        datt.numpy(),
        dedge.numpy() if dedge.numel() else x_l.new_empty(1, 1, 1).numpy(),
        dedge.numel() > 0,
    )
    return dxl, dxr, datt, dedge


@gatv2_score_backward_op.register_fake
def _(grad, x_l, x_r, att, src, dst, edge, negative_slope, need_edge):
    H, C = att.shape
    E = src.size(0) if need_edge and edge is not None else 0
    return torch.empty_like(x_l), torch.empty_like(x_r), torch.empty_like(att), x_l.new_empty(E, H, C)


def _setup(ctx, inputs, output):
    x_l, x_r, att, src, dst, edge, negative_slope = inputs
    ctx.save_for_backward(x_l, x_r, att, src, dst, edge)
    ctx.negative_slope = negative_slope


def _backward(ctx, grad):
    x_l, x_r, att, src, dst, edge = ctx.saved_tensors
    needs = ctx.needs_input_grad
    need_edge = edge is not None and needs[5]
    if torch.is_grad_enabled():  # create_graph=True: the readable formulation under autograd (every order exact)
        with torch.enable_grad():
            inputs = [t.view_as(t) if t.requires_grad else t.detach().requires_grad_() for t in (x_l, x_r, att)]
            e = (edge.view_as(edge) if edge.requires_grad else edge.detach().requires_grad_()) if need_edge else edge
            wrt = inputs + ([e] if need_edge else [])
            score = reference_score(inputs[0], inputs[1], inputs[2], src, dst, e, ctx.negative_slope)
            grads = list(torch.autograd.grad(score, wrt, grad, create_graph=True, allow_unused=True))
        d_edge = grads[3] if need_edge else None
        return grads[0], grads[1], grads[2], None, None, d_edge, None
    dxl, dxr, datt, dedge = gatv2_score_backward_op(
        grad.contiguous(), x_l, x_r, att, src, dst, edge, ctx.negative_slope, need_edge
    )
    return dxl, dxr, datt, None, None, dedge if need_edge else None, None


gatv2_score_op.register_autograd(_backward, setup_context=_setup)


def gatv2_score(
    x_l: Tensor,
    x_r: Tensor,
    att: Tensor,
    src: Tensor,
    dst: Tensor,
    edge: Tensor | None = None,
    negative_slope: float = 0.2,
) -> Tensor:
    """GATv2's edge scores ``att · leaky_relu(x_l[src] + x_r[dst] (+ edge))`` on ``graphattn::gatv2_score``.

    Parameters
    ----------
    x_l : Tensor, shape (S, H, C)
        The source half ``Θ_s x_j``, one row per source node j.
    x_r : Tensor, shape (L, H, C)
        The target half ``Θ_t x_i``, one row per target node i.
    att : Tensor, shape (H, C)
        The attention vector of each head.
    src, dst : Tensor, shape (E,)
        Source j and target i of each edge (int64).
    edge : Tensor, shape (E, H, C), optional
        The projected edge features, added inside the nonlinearity.
    negative_slope : float, default 0.2
        LeakyReLU's slope for negative inputs.

    Returns
    -------
    Tensor, shape (E, H)
        The scores, in the edges' order; exact against the readable formulation
        (:func:`reference_score`), forward and backward, every order.
    """
    return gatv2_score_op(
        x_l.contiguous(),
        x_r.contiguous(),
        att.contiguous(),
        src.long().contiguous(),
        dst.long().contiguous(),
        None if edge is None else edge.contiguous(),
        float(negative_slope),
    )
