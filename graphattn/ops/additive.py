"""GATv2's additive scores as one operator, ``graphattn::gatv2_score``, with a fused CPU kernel (numba).

.. math::
    s_e^h = \\sum_c a_{hc}\\, \\mathrm{LeakyReLU}(x^{src}_{j,h,c} + x^{dst}_{i,h,c} + t_{e,h,c}),
    \\qquad e = (j, i)

(``t`` the optional edge term ``Θ_e e_ij``.) Written with PyTorch operations
this forms ``(E, H, C)`` tensors forward and backward; compiled, inductor
fuses the forward but materialises the ``(E, H, C)`` gradient and scatters it
twice. Here one pass over the edges does each direction, nothing per edge
but the scores (forward) and, per edge, the gradient written straight into
``dx_src[j]``, ``dx_dst[i]`` (and ``d t_e``) (backward), the rows of the edges
a few places ahead prefetched (:mod:`graphattn.ops.prefetch`): on the CPU about 3x
faster than inductor's code for the sparse benchmark graph (10k nodes, 110k
edges, 8 heads; D = 8 and 64).

- ``graphattn::gatv2_score(x_src (S, H, C), x_dst (L, H, C), src (E,), dst (E,),
  att (H, C), edge (E, H, C) or None, negative_slope) -> score (E, H)``
- ``graphattn::gatv2_score_backward(grad (E, H), ...) -> (dx_src, dx_dst, d_att, d_edge)``

Both check every index against ``S`` and ``L`` (IndexError) before reading.
One thread (no thread pool: the layer calls it when torch runs on one thread,
as training on a shared CPU does; with more, PyTorch's parallel operations
run instead); the sums accumulate in the feature dtype in edge order
(``fastmath`` reassociation inside a row only), but ``d att``, a sum over
every edge, in float64 (then rounded to the feature dtype). ``create_graph=True``
runs the backward with differentiable PyTorch operations (:func:`readable`),
so second derivatives are exact. Rows stored heads innermost (``(n, C, H)`` memory, as ``ga.GATv2Conv``
projects them at one thread) run kernels of their own (:func:`_build_heads_last`, one per head count: the
loops over heads vectorise; sparse benchmark graph, H = C = 8: forward 3.0-3.4 ms against 3.6-3.8,
backward 7-10 ms against 17-18, minima). :func:`usable` says where the layer calls
this operator (CPU, one thread, float32/float64, numba installed); elsewhere it runs
:func:`readable` itself, which tests pin to the kernel.
"""

from __future__ import annotations

import importlib.util
import threading

import torch
import torch.nn.functional as F
from torch import Tensor

from graphattn.ops import fused
from graphattn.ops.fused import _np, _np_last, _scalar  # the kernels' argument conversions, shared
from graphattn.ops.shared import as_layout
from graphattn.validate import message

__all__ = ["usable", "gatv2_score", "readable"]

ENABLED = True  # switch: False makes usable() False, so the layer runs readable() (tests compare the two)
NUMBA = importlib.util.find_spec("numba") is not None  # not imported here: the first call compiles the kernels
_LOCK = threading.Lock()
_KERNELS: list = []
_KERNELS_HL: dict[int, tuple] = {}  # heads -> (forward, backward) for rows stored heads innermost


def _build():
    import numba
    import numpy as np

    from graphattn.ops.prefetch import prefetch_edge, prefetch_edge_update

    jit = numba.njit(cache=True, fastmath={"reassoc", "contract"}, nogil=True)

    @jit
    def check(src, dst, S, L):  # the first bad edge, or -1
        for e in range(src.shape[0]):
            if src[e] < 0 or src[e] >= S or dst[e] < 0 or dst[e] >= L:
                return e
        return -1

    @jit
    def forward(x_src, x_dst, src, dst, att, edge, has_edge, slope, zero, score):
        H, C = att.shape
        E = src.shape[0]
        for e in range(E):
            prefetch_edge(e, src, dst, x_src, x_dst)
            j, i = src[e], dst[e]
            for h in range(H):
                s = zero  # the feature dtype's 0: the sum stays in that dtype
                for c in range(C):
                    z = x_src[j, h, c] + x_dst[i, h, c]
                    if has_edge:
                        z += edge[e, h, c]
                    s += att[h, c] * (z if z > 0 else slope * z)
                score[e, h] = s

    @jit
    def backward(grad, x_src, x_dst, src, dst, att, edge, has_edge, slope, dx_src, dx_dst, d_att, d_edge):
        H, C = att.shape
        E = src.shape[0]
        total = np.zeros((H, C), np.float64)  # d att: a sum over every edge, kept in float64, then rounded
        for e in range(E):
            prefetch_edge_update(e, src, dst, x_src, x_dst, dx_src, dx_dst)
            j, i = src[e], dst[e]
            for h in range(H):
                d = grad[e, h]
                for c in range(C):
                    z = x_src[j, h, c] + x_dst[i, h, c]
                    if has_edge:
                        z += edge[e, h, c]
                    g = d * att[h, c]  # d s / d z: a_hc LeakyReLU'(z)
                    if z > 0:
                        total[h, c] += d * z
                    else:
                        g *= slope
                        total[h, c] += d * (slope * z)
                    dx_src[j, h, c] += g
                    dx_dst[i, h, c] += g
                    if has_edge:
                        d_edge[e, h, c] = g
        for h in range(H):
            for c in range(C):
                d_att[h, c] = total[h, c]

    return check, forward, backward


def _build_heads_last(H: int):
    """``(forward, backward)`` for rows stored heads innermost, ``(n, C, H)`` memory, ``H`` a compile-time constant.

    The same sums in the same order as :func:`_build`'s kernels, the loops over heads innermost (unrolled and
    vectorised as in :mod:`graphattn.ops.heads_last`); ``att`` and ``d_att`` ``(C, H)``, ``edge`` and
    ``d_edge`` ``(E, C, H)``.
    """
    import numba
    import numpy as np

    from graphattn.ops.heads_last import _compiling, _stack
    from graphattn.ops.prefetch import prefetch_edge, prefetch_edge_update

    jit = numba.njit(cache=True, fastmath={"reassoc", "contract"}, nogil=True)

    @numba.njit(inline="always")
    def stage(zs, x_src, x_dst, edge, has_edge, j, i, e):  # pragma: no cover (inlined into both kernels)
        """``zs (C, H)`` = edge e's ``x_src[j] + x_dst[i] (+ edge[e])``: staged on the stack, so that the sums
        over it vectorise (with the ``has_edge`` test inside their loop LLVM kept them scalar, 4x slower).
        """
        C = zs.shape[0]
        for c in range(C):
            for h in range(H):
                zs[c, h] = x_src[j, c, h] + x_dst[i, c, h]
        if has_edge:
            for c in range(C):
                for h in range(H):
                    zs[c, h] += edge[e, c, h]

    @jit
    def forward(x_src, x_dst, src, dst, att, edge, has_edge, slope, zero, score):  # pragma: no cover
        C, E = att.shape[0], src.shape[0]
        s = numba.carray(_stack(x_src), H)
        zs = numba.carray(_stack(x_src), (C, H))  # this edge's z (stage)
        for e in range(E):
            prefetch_edge(e, src, dst, x_src, x_dst)
            j, i = src[e], dst[e]
            for h in range(H):
                s[h] = zero
            stage(zs, x_src, x_dst, edge, has_edge, j, i, e)
            for c in range(C):
                for h in range(H):
                    z = zs[c, h]
                    s[h] += att[c, h] * (z if z > 0 else slope * z)
            for h in range(H):
                score[e, h] = s[h]

    @jit
    def backward(
        grad, x_src, x_dst, src, dst, att, edge, has_edge, slope, dx_src, dx_dst, d_att, d_edge
    ):  # pragma: no cover
        C, E = att.shape[0], src.shape[0]
        total = numba.carray(_stack(np.empty(0, np.float64)), (C, H))  # d att, in float64 (as _build's)
        d = numba.carray(_stack(x_src), H)
        zs = numba.carray(_stack(x_src), (C, H))  # this edge's z (stage)
        t = numba.carray(_stack(x_src), (C, H))  # its d z, staged before the random rows
        for c in range(C):
            for h in range(H):
                total[c, h] = 0.0
        for e in range(E):
            prefetch_edge_update(e, src, dst, x_src, x_dst, dx_src, dx_dst)
            j, i = src[e], dst[e]
            for h in range(H):
                d[h] = grad[e, h]
            stage(zs, x_src, x_dst, edge, has_edge, j, i, e)
            for c in range(C):
                for h in range(H):
                    z = zs[c, h]
                    g = d[h] * att[c, h]  # d s / d z: a_hc LeakyReLU'(z)
                    w = z
                    if not z > 0:
                        g *= slope
                        w = slope * z
                    total[c, h] += d[h] * w
                    t[c, h] = g
            for c in range(C):
                for h in range(H):
                    dx_src[j, c, h] += t[c, h]
            for c in range(C):
                for h in range(H):
                    dx_dst[i, c, h] += t[c, h]
            if has_edge:
                for c in range(C):
                    for h in range(H):
                        d_edge[e, c, h] = t[c, h]
        for c in range(C):
            for h in range(H):
                d_att[c, h] = total[c, h]

    return _compiling(forward), _compiling(backward)


def _kernels():
    with _LOCK:
        if not _KERNELS:
            _KERNELS.extend(_build())
        return _KERNELS


def _kernels_heads_last(H: int):
    with _LOCK:
        if H not in _KERNELS_HL:
            _KERNELS_HL[H] = _build_heads_last(H)
        return _KERNELS_HL[H]


def _heads_last(x_src: Tensor, x_dst: Tensor, edge: Tensor | None) -> bool:
    """Both node rows (and the edge term) stored heads innermost, within the heads-last kernels' range."""
    return fused._heads_last(*(t for t in (edge, x_dst, x_src) if t is not None))


@torch.compiler.assume_constant_result  # read when traced (a call dynamo cannot trace): a compiled model keeps it
def _one_thread() -> bool:
    return torch.get_num_threads() == 1


def usable(x_src: Tensor, x_dst: Tensor, att: Tensor, edge: Tensor | None = None) -> bool:
    """Whether the layer runs the operator: CPU on one thread, float32/float64 alike, numba installed (``ENABLED``).

    The kernel runs on one thread; with more, PyTorch's (and compiled, inductor's) parallel code runs instead.
    """
    dtype = x_src.dtype
    return (
        ENABLED
        and NUMBA
        and x_src.device.type == "cpu"
        and _one_thread()
        and dtype in (torch.float32, torch.float64)
        and x_dst.dtype == att.dtype == dtype
        and (edge is None or edge.dtype == dtype)
    )


def readable(x_src: Tensor, x_dst: Tensor, src: Tensor, dst: Tensor, att: Tensor, edge, negative_slope: float):
    """The scores ``(E, H)`` with PyTorch operations (PyG's formula), differentiable to any order."""
    h = x_src.index_select(0, src) + x_dst.index_select(0, dst)  # (E, H, C): Θ_s x_j + Θ_t x_i
    if edge is not None:
        h = h + edge  # (E, H, C)
    return (F.leaky_relu(h, negative_slope) * att).sum(-1)  # (E, H, C) · (1, H, C) -> (E, H)


def _checked(src: Tensor, dst: Tensor, S: int, L: int) -> None:
    bad = int(_kernels()[0](_np(src), _np(dst), S, L))
    if bad >= 0:
        raise IndexError(
            message(
                "edge_index",
                f"sources < S = {S} and targets < L = {L}",
                f"edge {bad}: ({int(src[bad])}, {int(dst[bad])})",
            )
        )


def _edge_arg(edge: Tensor | None, like: Tensor, rows=_np):
    """``(edge as the kernel reads it, has_edge)``; ``rows``: ``_np`` or, for the heads-last kernels, ``_np_last``."""
    return (rows(edge), True) if edge is not None else (like.new_empty(1, 1, 1).numpy(), False)


@torch.library.custom_op("graphattn::gatv2_score", mutates_args=())
def gatv2_score(
    x_src: Tensor, x_dst: Tensor, src: Tensor, dst: Tensor, att: Tensor, edge: Tensor | None, negative_slope: float
) -> Tensor:
    """GATv2's scores ``(E, H)`` (module); ``edge`` ``(E, H, C)`` or None."""
    _checked(src, dst, x_src.size(0), x_dst.size(0))
    score = x_src.new_empty(src.size(0), x_src.size(1))  # (E, H)
    slope, zero = _scalar(negative_slope, x_src), _scalar(0.0, x_src)
    if _heads_last(x_src, x_dst, edge):  # (n, C, H) memory: their own kernel, att as (C, H)
        kernel, rows, att_np = _kernels_heads_last(x_src.size(1))[0], _np_last, _np(att.t())
    else:
        kernel, rows, att_np = _kernels()[1], _np, _np(att)
    edge_np, has_edge = _edge_arg(edge, x_src, rows)
    kernel(rows(x_src), rows(x_dst), _np(src), _np(dst), att_np, edge_np, has_edge, slope, zero, score.numpy())
    return score


@gatv2_score.register_fake
def _(x_src, x_dst, src, dst, att, edge, negative_slope):
    return x_src.new_empty(src.size(0), x_src.size(1))


@torch.library.custom_op("graphattn::gatv2_score_backward", mutates_args=())
def gatv2_score_backward(
    grad: Tensor,
    x_src: Tensor,
    x_dst: Tensor,
    src: Tensor,
    dst: Tensor,
    att: Tensor,
    edge: Tensor | None,
    negative_slope: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``dx_src (S, H, C)``, ``dx_dst (L, H, C)``, ``d_att (H, C)``, ``d_edge (E, H, C)`` (``(0, H, C)`` without ``edge``)."""
    _checked(src, dst, x_src.size(0), x_dst.size(0))  # called directly too: never a write out of bounds
    last = _heads_last(x_src, x_dst, edge)  # (the thread count may differ from the forward's)
    rows = _np_last if last else _np
    # the kernel writes in its own layout (heads-last: the inputs', no copy; else contiguous, the inputs read as
    # contiguous copies); the gradients go back in the inputs' layout, as the fake's empty_like promises
    zeros = torch.zeros_like if last else (lambda t: t.new_zeros(t.shape))
    dx_src, dx_dst, d_att = zeros(x_src), zeros(x_dst), torch.zeros_like(att)
    if edge is None:
        d_edge = x_src.new_empty(0, *x_src.shape[1:])  # (0, H, C)
    else:
        d_edge = torch.empty_like(edge) if last else edge.new_empty(edge.shape)  # (E, H, C)
    kernel = _kernels_heads_last(x_src.size(1))[1] if last else _kernels()[2]
    d_att_rows = d_att.t() if last else d_att  # (C, H) views for the heads-last kernel
    edge_np, has_edge = _edge_arg(edge, x_src, rows)
    kernel(
        _np(grad),
        rows(x_src),
        rows(x_dst),
        _np(src),
        _np(dst),
        _np(att.t() if last else att),
        edge_np,
        has_edge,
        _scalar(negative_slope, x_src),
        rows(dx_src),
        rows(dx_dst),
        d_att_rows.numpy(),
        rows(d_edge) if has_edge else edge_np,
    )
    if edge is not None:
        d_edge = as_layout(d_edge, edge)
    return as_layout(dx_src, x_src), as_layout(dx_dst, x_dst), d_att, d_edge


@gatv2_score_backward.register_fake
def _(grad, x_src, x_dst, src, dst, att, edge, negative_slope):
    d_edge = torch.empty_like(edge) if edge is not None else x_src.new_empty(0, *x_src.shape[1:])
    return torch.empty_like(x_src), torch.empty_like(x_dst), torch.empty_like(att), d_edge


def _setup(ctx, inputs, output):
    x_src, x_dst, src, dst, att, edge, negative_slope = inputs
    ctx.save_for_backward(x_src, x_dst, src, dst, att, edge)
    ctx.negative_slope = negative_slope


def _backward(ctx, grad):
    x_src, x_dst, src, dst, att, edge = ctx.saved_tensors
    needs = ctx.needs_input_grad
    if torch.is_grad_enabled():  # create_graph=True: the readable formula's backward, itself differentiable
        wanted = [(k, t) for k, t in ((0, x_src), (1, x_dst), (4, att), (5, edge)) if t is not None and needs[k]]
        with torch.enable_grad():
            alias = [t.view_as(t) if t.requires_grad else t.detach().requires_grad_() for _, t in wanted]
            args = {k: a for (k, _), a in zip(wanted, alias)}
            score = readable(
                args.get(0, x_src),
                args.get(1, x_dst),
                src,
                dst,
                args.get(4, att),
                args.get(5, edge),
                ctx.negative_slope,
            )
            result = torch.autograd.grad(score, alias, grad, create_graph=True, allow_unused=True) if alias else ()
        grads = dict(zip((k for k, _ in wanted), result))
        return grads.get(0), grads.get(1), None, None, grads.get(4), grads.get(5), None
    dx_src, dx_dst, d_att, d_edge = gatv2_score_backward(
        grad.contiguous(), x_src, x_dst, src, dst, att, edge, ctx.negative_slope
    )
    return dx_src, dx_dst, None, None, d_att, d_edge if edge is not None else None, None


gatv2_score.register_autograd(_backward, setup_context=_setup)
