"""The fused CPU kernels for rows stored heads innermost, ``(n, D, H)`` in memory (numba), few channels per head.

:mod:`graphattn.ops.fused` keeps PyTorch's ``(n, H, D)`` rows and loops over
heads, then channels. At 8 channels per head every one of those loops is 8
long, and LLVM's loop vectoriser, built for long loops of unknown length, runs
it through its remainder code. Here the rows are ``(n, D, H)``: every loop over
heads, with ``H`` fixed when the kernel is compiled (one kernel per head count,
cached), unrolls, and LLVM's SLP vectoriser turns it into a few vector
operations (numba leaves that vectoriser off, ``NUMBA_SLP_VECTORIZE=0``;
:func:`_slp` turns it on while these kernels compile, for them only). Per-head
scratch (maxima, sums, accumulators) lives in stack buffers (:func:`_stack`:
an ``alloca``, which no argument can alias, so the vectoriser may reorder around
it), and the backward stages each edge's ``dk_j``, ``dv_j`` terms there before
adding them to the random rows. Measured on an AVX2 EPYC (machine B of
docs/pyg.md, sparse graph, H = D = 8, ``benchmarks/heads_last.py``): forward
3.4 ms against 8.0, backward 10.2 against 16.3 (minima).

Same formulas, same order of the sums over a target's edges and over a source's
rows (by ascending target) as the ``(n, H, D)`` kernels, one thread (the layers
ask for this layout only then: :func:`graphattn.ops.fused.heads_last_usable`).
Queries, keys and values (and their gradients) are PyTorch ``(n, H, D)`` views
whose memory is ``(n, D, H)`` (strides ``(H D, 1, H)``), which the layers produce
by projecting with their weights' rows permuted: no copy. ``out`` and
``grad_out`` stay in PyTorch's contiguous ``(L, H, D_v)``: the kernels transpose
each target's row on the stack.

Imported by :mod:`graphattn.ops.fused` with numba, never by ``import graphattn``.
"""

from __future__ import annotations

import contextlib
import math
import threading

import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from graphattn.ops.prefetch import DISTANCE, prefetch_row, prefetch_row_write
from graphattn.ops.vexp import exp

__all__ = ["CAP", "build"]

CAP = 16 * 16  # elements per stack buffer: H * D and H * D_v (fused.HEADS_LAST_HEADS x HEADS_LAST_CHANNELS)


@intrinsic
def _stack(typingctx, like):
    """A pointer to ``CAP`` elements of ``like``'s dtype on the stack: one ``alloca`` per call site, in the entry block."""
    if not isinstance(like, types.Array):
        return None

    def codegen(context, builder, signature, args):
        element = context.get_data_type(like.dtype)
        with builder.goto_entry_block():
            buffer = builder.alloca(ir.ArrayType(element, CAP))
        return builder.bitcast(buffer, element.as_pointer())

    return types.CPointer(like.dtype)(like), codegen


@contextlib.contextmanager
def _slp():
    """LLVM's SLP vectoriser on while a kernel compiles (numba reads the flag at each compilation)."""
    before = numba.config.SLP_VECTORIZE
    numba.config.SLP_VECTORIZE = 1
    try:
        yield
    finally:
        numba.config.SLP_VECTORIZE = before


_COMPILE = threading.Lock()


def _compiling(kernel):
    """``kernel`` (a numba dispatcher) whose compilations run with the SLP vectoriser on, under a lock.

    The flag is global to numba: set and restored only around a compilation (the dispatcher's ``compile``,
    which it calls when no compiled signature matches the arguments), never around the (``nogil``,
    concurrent) calls after it, so it cannot be left on. A call that matches goes straight to numba's
    C dispatcher: asking ``numba.typeof`` of every argument first, as this did, cost about 20 us a
    call (0.5 ms a step of a two-layer model on a 34-node graph, 1 thread).
    """
    compile_signature = kernel.compile

    def compile(signature):
        with _COMPILE, _slp():
            return compile_signature(signature)

    kernel.compile = compile  # looked up on the instance by the dispatcher's compile-for-arguments path
    return kernel


def build(H: int):
    """``(forward, backward)`` for ``H`` heads (a closure constant: numba's cache keys the head counts apart)."""
    jit = numba.njit(cache=True, fastmath={"reassoc", "contract"}, nogil=True)
    ahead = DISTANCE

    @jit
    def forward(crow, src, qT, kT, vT, bias, has_bias, drop, has_drop, scale, out, alpha):  # pragma: no cover
        L, D, _ = qT.shape
        Dv, E, hb = vT.shape[1], src.shape[0], bias.shape[1]
        zero = scale - scale  # 0 in the feature dtype
        s = numba.carray(_stack(qT), H)  # one buffer per call site
        top = numba.carray(_stack(qT), H)
        norm = numba.carray(_stack(qT), H)
        p = numba.carray(_stack(qT), H)
        acc = numba.carray(_stack(qT), (Dv, H))
        for i in range(L):
            e0, e1 = crow[i], crow[i + 1]
            for h in range(H):
                top[h] = -math.inf
                norm[h] = zero
            for d in range(Dv):
                for h in range(H):
                    acc[d, h] = zero
            for e in range(e0, e1):  # scores and their maximum per head
                if e + ahead < E:
                    prefetch_row(kT, src[e + ahead])
                j = src[e]
                for h in range(H):
                    s[h] = zero
                for d in range(D):
                    for h in range(H):
                        s[h] += qT[i, d, h] * kT[j, d, h]
                for h in range(H):
                    s[h] *= scale
                if has_bias:
                    for h in range(H):
                        s[h] += bias[e, h if hb > 1 else 0]
                for h in range(H):
                    alpha[e, h] = s[h]
                    top[h] = max(top[h], s[h])
            for h in range(H):
                if top[h] == -math.inf:  # every score -inf: the weights and the row are 0
                    top[h] = zero
            for e in range(e0, e1):  # p_e = exp(score - max), in a loop of its own
                for h in range(H):
                    alpha[e, h] = exp(alpha[e, h] - top[h])
            for e in range(e0, e1):  # sum_e p_e and sum_e p_e v_j
                if e + ahead < E:
                    prefetch_row(vT, src[e + ahead])
                j = src[e]
                for h in range(H):
                    p[h] = alpha[e, h]
                    norm[h] += p[h]
                if has_drop:  # dropout: the kept weights rescaled by 1 / (1 - p), the others 0
                    for h in range(H):
                        p[h] *= drop[e, h]
                for d in range(Dv):
                    for h in range(H):
                        acc[d, h] += p[h] * vT[j, d, h]
            for h in range(H):
                norm[h] = 1 / norm[h] if norm[h] != 0 else zero  # a NaN sum stays NaN
            for h in range(H):  # out in PyTorch's (L, H, D_v): no transpose after the kernel
                for d in range(Dv):
                    out[i, h, d] = acc[d, h] * norm[h]
            for e in range(e0, e1):
                for h in range(H):
                    alpha[e, h] *= norm[h]

    @jit
    def backward(
        crow, src, qT, kT, vT, alpha, go, ga, has_ga, drop, has_drop, scale, dqT, ds, dkT, dvT
    ):  # pragma: no cover
        L, D, _ = qT.shape
        Dv, E = vT.shape[1], src.shape[0]
        zero = scale - scale
        ag = numba.carray(_stack(qT), H)  # sum_e alpha_e g_e per head
        g = numba.carray(_stack(qT), H)
        w = numba.carray(_stack(qT), H)
        a = numba.carray(_stack(qT), H)
        acc = numba.carray(_stack(qT), (D, H))  # dq_i before the scale
        tk = numba.carray(_stack(qT), (D, H))  # this edge's dk_j term, staged
        tv = numba.carray(_stack(qT), (Dv, H))  # this edge's dv_j term, staged
        goT = numba.carray(_stack(qT), (Dv, H))  # grad_out_i, heads innermost
        qs = numba.carray(_stack(qT), (D, H))  # scale q_i: dk_j's term
        for i in range(L):
            e0, e1 = crow[i], crow[i + 1]
            for h in range(H):
                ag[h] = zero
            for h in range(H):  # grad_out arrives in PyTorch's (L, H, D_v): transposed here, per row
                for d in range(Dv):
                    goT[d, h] = go[i, h, d]
            for d in range(D):
                for h in range(H):
                    qs[d, h] = qT[i, d, h] * scale
                    acc[d, h] = zero
            for e in range(e0, e1):  # g_e = grad_out_i · v_j (+ grad_alpha_e) and sum_e alpha_e g_e
                if e + ahead < E:
                    prefetch_row(vT, src[e + ahead])
                j = src[e]
                for h in range(H):
                    g[h] = zero
                for d in range(Dv):
                    for h in range(H):
                        g[h] += goT[d, h] * vT[j, d, h]
                if has_drop:
                    for h in range(H):
                        g[h] *= drop[e, h]
                if has_ga:
                    for h in range(H):
                        g[h] += ga[e, h]
                for h in range(H):
                    ds[e, h] = g[h]
                    ag[h] += alpha[e, h] * g[h]
            for e in range(e0, e1):  # d score = alpha (g - sum alpha g), dq_i, dk_j and dv_j
                if e + ahead < E:
                    n = src[e + ahead]
                    prefetch_row(kT, n)
                    prefetch_row_write(dkT, n)
                    prefetch_row_write(dvT, n)
                j = src[e]
                for h in range(H):
                    a[h] = alpha[e, h]
                    w[h] = a[h] * (ds[e, h] - ag[h])
                    ds[e, h] = w[h]
                if has_drop:
                    for h in range(H):
                        a[h] *= drop[e, h]
                for d in range(D):
                    for h in range(H):
                        acc[d, h] += w[h] * kT[j, d, h]
                        tk[d, h] = w[h] * qs[d, h]
                for d in range(Dv):
                    for h in range(H):
                        tv[d, h] = a[h] * goT[d, h]
                for d in range(D):
                    for h in range(H):
                        dkT[j, d, h] += tk[d, h]
                for d in range(Dv):
                    for h in range(H):
                        dvT[j, d, h] += tv[d, h]
            for d in range(D):
                for h in range(H):
                    dqT[i, d, h] = acc[d, h] * scale

    return _compiling(forward), _compiling(backward)
