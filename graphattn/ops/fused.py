"""The fused CPU kernel of the CSR path: scores, softmax and weighted sum in one pass per target (numba).

For float32/float64 features on the CPU (and with a first-order backward), the
``"csr"`` kernel runs here instead of :mod:`graphattn.ops.csr`'s three library
calls (sampled matmul, segment softmax, sparse-dense matmul). With dropout too:
the mask is drawn by torch, in the library path's layout (the same bits under
one seed), and the kernels scale the kept weights by ``1 / (1 - p)``.

- Forward, for each target i (blocks of targets on ``prange`` on several
  threads), over its incoming edges (sorted, CSR), edge-major with the heads
  innermost: the per-head scores ``scale * q_i · k_j (+ bias)`` and their
  maximum; ``p_e = exp(score - max)`` in a loop of its own (vectorised in
  float32, :mod:`graphattn.ops.vexp`: ``expf`` called per edge and head took
  about a quarter of the forward at 8 channels per head); then the sum and
  ``sum_e p_e v_j`` in a small (H, D_v) accumulator, divided by the sum at
  the end (as are the weights). Nothing per edge but the weights
  ``alpha (E, H)`` the backward reads.
- Backward, per target: ``g_e = grad_out_i · v_j (+ grad_alpha_e)``,
  ``d score_e = alpha_e (g_e - sum_e' alpha_e' g_e')`` and ``dq_i``. On one
  thread ``dk_j`` and ``dv_j`` accumulate in the same pass; on several, a
  second pass per source j (the transposed CSR) sums them over its outgoing
  edges, so no two threads write one row (no atomics). Both sum a row's terms
  by ascending target: the result does not depend on the thread count.
- Rows stored heads innermost (``(n, H, D)`` views of ``(n, D, H)`` memory, what
  ``ga.TransformerConv`` projects to at one thread: :func:`heads_last_usable`) run
  the kernels of :mod:`graphattn.ops.heads_last` instead (one thread, up to 16
  heads and 16 channels per head), and their gradients come back in that layout.
- The rows of the next edges' sources are prefetched (:mod:`graphattn.ops.prefetch`)
  while an edge is worked on: random rows, which the hardware cannot guess.
- One thread runs loops compiled without ``parallel`` (no thread pool: an idle
  OpenMP pool spins, and its CPU time counted against every operation after
  it, 8 ms on a 0.15 ms ``torch.equal``).

Same formulas as the library path, the same exact zero row for a target
without edges or with every score ``-inf``; sums accumulate in the feature
dtype, reassociated (``fastmath={"reassoc", "contract"}``: LLVM vectorises the
dot products; no assumption about inf or NaN, so ``-inf`` keeps its meaning).
Why numba and not a C++ extension (``torch.utils.cpp_extension``): that
compiles against PyTorch's headers (about a minute, and a compiler on the
user's machine); numba is one wheel, compiles these loops in seconds and
caches them next to this file (``cache=True``). It is imported the first time
the kernel runs, so ``import graphattn`` stays light; without numba the
library path runs.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

__all__ = ["usable", "heads_last_usable", "fused_forward", "fused_backward"]

BLOCK = 64  # targets per block of the parallel kernels' loop (a thread takes whole blocks, each with its scratch)
ENABLED = True  # switch: False runs the library path (tests compare the two)
_LOCK = threading.Lock()
_CALL_LOCK = threading.Lock()
_CONCURRENT = False  # True once the threading layer is known to take concurrent calls
_KERNELS: dict[bool, tuple] = {}  # parallel -> the compiled (forward, backward_targets, backward_sources)
HEADS_LAST_CHANNELS = 16  # channels per head up to which rows stored heads innermost run graphattn.ops.heads_last
HEADS_LAST_HEADS = 16  # heads up to which they do (one kernel per head count; their scratch holds 16 x 16)
_KERNELS_HL: dict[int, tuple] = {}  # heads -> the compiled (forward, backward) of graphattn.ops.heads_last
_NUMBA = None  # whether numba imports


def _build(parallel: bool):
    import math

    import numba
    import numpy as np

    from graphattn.ops.prefetch import DISTANCE, prefetch_row, prefetch_row_write
    from graphattn.ops.vexp import exp

    # the loop over blocks of targets/sources: prange on numba's threads, or range (one thread, no thread
    # pool); a closure variable, so numba's on-disk cache keys the two variants apart
    prange = numba.prange if parallel else range
    serial = not parallel  # one thread: dk, dv accumulated in the per-target pass (no second pass)
    jit = numba.njit(parallel=parallel, cache=True, fastmath={"reassoc", "contract"}, nogil=True)
    ahead = DISTANCE

    @numba.njit(inline="always", fastmath={"reassoc", "contract"})
    def add_source_terms(dk, dv, j, i, h, w, a, q, go):  # pragma: no cover (inlined into the kernels)
        """dk_j += w q_i and dv_j += a grad_out_i for one edge and head (inlined: no call per edge)."""
        for d in range(dk.shape[2]):
            dk[j, h, d] += w * q[i, h, d]
        for d in range(dv.shape[2]):
            dv[j, h, d] += a * go[i, h, d]

    @jit
    def forward(crow, src, q, k, v, bias, has_bias, drop, has_drop, scale, out, alpha, block):  # pragma: no cover
        L, H, D = q.shape
        zero = scale - scale  # 0 in the feature dtype (scale is a scalar of it): sums stay in it
        Dv = v.shape[2]
        hb = bias.shape[1]
        E = src.shape[0]
        for b in prange((L + block - 1) // block):  # blocks of targets; each its own scratch
            acc = np.empty((H, Dv), out.dtype)  # sum_e p_e v_j, then out_i
            top = np.empty(H, out.dtype)  # maximum score per head
            norm = np.empty(H, out.dtype)  # sum_e p_e, then its inverse
            for i in range(b * block, min(L, (b + 1) * block)):  # edge-major, heads innermost: contiguous rows
                e0, e1 = crow[i], crow[i + 1]
                for h in range(H):
                    for d in range(Dv):
                        acc[h, d] = zero
                    top[h] = -math.inf
                    norm[h] = zero
                for e in range(e0, e1):  # scores and their maximum per head
                    if e + ahead < E:
                        prefetch_row(k, src[e + ahead])
                    j = src[e]
                    for h in range(H):
                        s = zero
                        for d in range(D):
                            s += q[i, h, d] * k[j, h, d]
                        s *= scale
                        if has_bias:
                            s += bias[e, h if hb > 1 else 0]
                        alpha[e, h] = s
                        top[h] = max(top[h], s)
                for h in range(H):
                    if top[h] == -math.inf:  # every score -inf: exp gives 0, the weights and the row are 0
                        top[h] = zero
                for e in range(e0, e1):  # p_e = exp(score - max), in a loop of its own: vectorised (float32)
                    for h in range(H):
                        alpha[e, h] = exp(alpha[e, h] - top[h])
                for e in range(e0, e1):  # sum_e p_e and sum_e p_e v_j
                    if e + ahead < E:
                        prefetch_row(v, src[e + ahead])
                    j = src[e]
                    for h in range(H):
                        p = alpha[e, h]
                        norm[h] += p
                        if has_drop:  # dropout: the kept weights rescaled by 1 / (1 - p), the others 0
                            p *= drop[e, h]
                        for d in range(Dv):
                            acc[h, d] += p * v[j, h, d]
                for h in range(H):  # the weights: p_e / sum; the row: (sum_e p_e v_j) / sum
                    norm[h] = 1 / norm[h] if norm[h] != 0 else zero  # a NaN sum stays NaN (the library path's)
                    for d in range(Dv):
                        out[i, h, d] = acc[h, d] * norm[h]
                for e in range(e0, e1):
                    for h in range(H):
                        alpha[e, h] *= norm[h]

    @jit
    def backward_targets(
        crow, src, q, k, v, alpha, go, ga, has_ga, drop, has_drop, scale, dq, ds, dk, dv, block
    ):  # pragma: no cover
        L, H, D = dq.shape
        zero = scale - scale  # 0 in the feature dtype (scale is a scalar of it): sums stay in it
        Dv = v.shape[2]
        E = src.shape[0]
        for b in prange((L + block - 1) // block):
            acc = np.empty((H, D), dq.dtype)  # dq_i before the scale
            dot = np.empty(H, dq.dtype)  # sum_e alpha_e g_e per head
            for i in range(b * block, min(L, (b + 1) * block)):
                e0, e1 = crow[i], crow[i + 1]
                for h in range(H):
                    for d in range(D):
                        acc[h, d] = zero
                    dot[h] = zero
                for e in range(e0, e1):  # g_e = grad_out_i · v_j (+ grad_alpha_e) and sum_e alpha_e g_e
                    if e + ahead < E:
                        prefetch_row(v, src[e + ahead])
                    j = src[e]
                    for h in range(H):
                        g = zero
                        for d in range(Dv):
                            g += go[i, h, d] * v[j, h, d]
                        if has_drop:
                            g *= drop[e, h]
                        if has_ga:
                            g += ga[e, h]
                        ds[e, h] = g
                        dot[h] += alpha[e, h] * g
                for e in range(e0, e1):  # d score = alpha (g - sum alpha g), dq_i (and on one thread dk_j, dv_j)
                    if e + ahead < E:
                        n = src[e + ahead]
                        prefetch_row(k, n)
                        if serial:
                            prefetch_row_write(dk, n)
                            prefetch_row_write(dv, n)
                    j = src[e]
                    for h in range(H):
                        a = alpha[e, h]
                        w = a * (ds[e, h] - dot[h])
                        ds[e, h] = w
                        for d in range(D):
                            acc[h, d] += w * k[j, h, d]
                        if serial:  # one thread: dk_j and dv_j here, in the order of the per-source pass
                            if has_drop:
                                a *= drop[e, h]
                            add_source_terms(dk, dv, j, i, h, w, a, q, go)
                for h in range(H):
                    for d in range(D):
                        dq[i, h, d] = acc[h, d] * scale

    @jit
    def backward_sources(
        crow_t, perm_t, col_t, q, alpha, go, ds, drop, has_drop, scale, dk, dv, block
    ):  # pragma: no cover
        S, H, D = dk.shape
        Dv = dv.shape[2]
        E = col_t.shape[0]
        for b in prange((S + block - 1) // block):
            for j in range(b * block, min(S, (b + 1) * block)):
                for h in range(H):
                    for d in range(D):
                        dk[j, h, d] = 0.0
                    for d in range(Dv):
                        dv[j, h, d] = 0.0
                for t in range(crow_t[j], crow_t[j + 1]):
                    if t + ahead < E:
                        n = col_t[t + ahead]
                        prefetch_row(q, n)
                        prefetch_row(go, n)
                    e, i = perm_t[t], col_t[t]
                    for h in range(H):
                        w, a = ds[e, h], alpha[e, h]
                        if has_drop:
                            a *= drop[e, h]
                        add_source_terms(dk, dv, j, i, h, w, a, q, go)
                for h in range(H):
                    for d in range(D):
                        dk[j, h, d] *= scale

    return forward, backward_targets, backward_sources


def _has_numba() -> bool:
    global _NUMBA
    if _NUMBA is None:
        try:
            import numba  # noqa: F401

            _NUMBA = True
        except ImportError:  # the library path
            _NUMBA = False
    return _NUMBA


def _parallel_ok() -> bool:
    import numba

    return int(getattr(numba.config, "NUMBA_NUM_THREADS", 1)) > 1


def _kernels():
    """The kernels for torch's thread count: serial for one thread (no thread pool), else ``prange``."""
    parallel = torch.get_num_threads() > 1 and _parallel_ok()
    with _LOCK:
        if parallel not in _KERNELS:
            _KERNELS[parallel] = _build(parallel)
        return _KERNELS[parallel]


def _run(kernel, *args) -> None:
    """Call a compiled kernel on numba threads as many as torch's; serialised on numba's "workqueue" layer.

    The "omp" and "tbb" layers take concurrent calls; "workqueue" (numba's
    fallback when neither is installed) aborts on them, so there the calls
    queue on a lock. One thread runs the serial kernels: no thread pool (an
    idle OpenMP pool spins, and its CPU time would count against every
    operation that follows).
    """
    global _CONCURRENT
    import numba

    threads = torch.get_num_threads()
    if threads == 1 or not _parallel_ok():
        kernel(*args)
        return
    numba.set_num_threads(min(threads, int(getattr(numba.config, "NUMBA_NUM_THREADS", 1))))
    if _CONCURRENT:
        kernel(*args)
        return
    with _CALL_LOCK:
        kernel(*args)
        _CONCURRENT = numba.threading_layer() != "workqueue"


def usable(query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None) -> bool:
    """Whether the fused kernel runs these inputs: CPU, float32/float64 alike, numba present."""
    if not ENABLED or query.device.type != "cpu" or query.dtype not in (torch.float32, torch.float64):
        return False
    if key.dtype != query.dtype or value.dtype != query.dtype or (bias is not None and bias.dtype != query.dtype):
        return False
    return _has_numba()


def _serial() -> bool:
    return torch.get_num_threads() == 1 or not _parallel_ok()


def heads_last_usable(like: Tensor, heads: int, channels: int) -> bool:
    """Whether rows stored heads innermost run a fused kernel of their own here (:mod:`graphattn.ops.heads_last`).

    CPU, float32/float64, numba, one thread, 2 to :data:`HEADS_LAST_HEADS` heads and 2 to
    :data:`HEADS_LAST_CHANNELS` channels per head: where the layers project to that layout
    (their weights' rows permuted) instead of PyTorch's ``(n, H, D)``.
    """
    if not ENABLED or like.device.type != "cpu" or like.dtype not in (torch.float32, torch.float64):
        return False
    return _heads_last_shape(heads, channels) and _has_numba() and _serial()


def _heads_last_shape(heads: int, channels: int) -> bool:
    return 2 <= heads <= HEADS_LAST_HEADS and 2 <= channels <= HEADS_LAST_CHANNELS


def _heads_last(*tensors: Tensor) -> bool:
    """Every ``(n, H, D)`` tensor a view of ``(n, D, H)`` memory, within the heads-last kernels' range.

    The last (the values) decides; query and key rows without channels (``D = 0``: :func:`graphattn.ops.scored_attention`,
    GAT's scores) have no layout and pass.
    """
    H = tensors[-1].size(1)
    for t in tensors:
        if t.size(1) != H:
            return False
        if t.size(2) == 0 and t is not tensors[-1]:  # no query/key channels (GAT's scores): any layout
            continue
        if not _heads_last_shape(H, t.size(2)) or not t.transpose(1, 2).is_contiguous():
            return False
    return _serial()


def _kernels_heads_last(heads: int):
    from graphattn.ops.heads_last import build

    with _LOCK:
        if heads not in _KERNELS_HL:
            _KERNELS_HL[heads] = build(heads)
        return _KERNELS_HL[heads]


def _np_last(t: Tensor):
    """A heads-last ``(n, H, D)`` view as its ``(n, D, H)`` memory, a NumPy array (no copy)."""
    return t.detach().transpose(1, 2).numpy()


def _block(n: int) -> int:
    """Targets (or sources) per block of the kernels' outer loop: all of them on one thread (one scratch)."""
    return max(n, 1) if torch.get_num_threads() == 1 or not _parallel_ok() else BLOCK


def _scalar(x: float, like: Tensor):
    """``x`` as a NumPy scalar of ``like``'s dtype: the kernels' sums and products stay in that dtype."""
    return like.new_tensor(x).numpy()[()]


def _np(t: Tensor):
    return t.detach().contiguous().numpy()


def _drop(keep: Tensor | None, p: float, like: Tensor) -> Tensor:
    """Dropout's factor per sorted edge and head, ``(E, H)``: ``1 / (1 - p)`` kept, 0 dropped; ``keep`` (H, E)."""
    if keep is None:
        return like.new_zeros(1, 1)  # unused (has_drop False)
    return keep.t().to(like.dtype).mul_(1.0 / (1.0 - p)).contiguous()  # (E, H)


def fused_forward(
    graph, query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None, scale: float, keep: Tensor | None, p: float
) -> tuple[Tensor, Tensor]:
    """``out (L, H, D_v)`` and ``alpha (E, H)`` (before dropout) in sorted edge order.

    ``bias`` ``(E, H or 1)`` sorted or None; ``keep`` (H, E) sorted, dropout's mask (drawn by the caller,
    as the library path draws it) or None.
    """
    L, H, _ = query.shape
    last = _heads_last(query, key, value)  # rows stored heads innermost: their own kernel
    rows = _np_last if last else _np
    out = query.new_empty(L, H, value.size(2))  # (L, H, D_v): both kernels write PyTorch's layout
    alpha = query.new_empty(graph.E, H)  # (E, H)
    b = query.new_zeros(1, 1) if bias is None else bias  # (E, H or 1)
    args = (
        graph.crow.numpy(),
        graph.src.numpy(),
        rows(query),
        rows(key),
        rows(value),
        _np(b),
        bias is not None,
        _drop(keep, p, query).numpy(),
        keep is not None,
        _scalar(scale, query),
        out.numpy(),
        alpha.numpy(),
    )
    if last:
        _kernels_heads_last(H)[0](*args)
        return out, alpha
    _run(_kernels()[0], *args, _block(L))
    return out, alpha


def fused_backward(
    graph,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    alpha: Tensor,
    grad_out: Tensor,
    grad_alpha: Tensor | None,
    scale: float,
    keep: Tensor | None,
    p: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``dq, dk, dv`` (n, H, d) and ``d score (E, H)`` (sorted); ``alpha``, ``grad_alpha`` (E, H) sorted.

    ``alpha`` before dropout, ``grad_alpha`` its gradient; ``keep`` (H, E) sorted, the forward's mask, or None.
    """
    H = query.size(1)
    last = _heads_last(query, key, value)  # the forward's kernel's layout: dq, dk, dv come back in it
    serial = _serial()  # (always, when last)
    rows = _np_last if last else _np
    if last:
        dq, dk, dv = (x.new_empty(x.size(0), x.size(2), H) for x in (query, key, value))  # (n, D, H)
    else:
        dq, dk, dv = (x.new_empty(x.shape) for x in (query, key, value))  # contiguous, as the kernels write
    go = _np(grad_out)  # (L, H, D_v): the heads-last kernel transposes each row on the stack
    if serial:  # dk, dv accumulated in the per-target pass
        dk.zero_()
        dv.zero_()
    ds = query.new_empty(graph.E, H)  # (E, H)
    q, a = rows(query), _np(alpha)
    ga = query.new_zeros(1, 1) if grad_alpha is None else grad_alpha  # (E, H)
    drop = _drop(keep, p, query).numpy()  # (E, H)
    args = (
        graph.crow.numpy(),
        graph.src.numpy(),
        q,
        rows(key),
        rows(value),
        a,
        go,
        _np(ga),
        grad_alpha is not None,
        drop,
        keep is not None,
        _scalar(scale, query),
        dq.numpy(),
        ds.numpy(),
        dk.numpy(),
        dv.numpy(),
    )
    if last:
        _kernels_heads_last(H)[1](*args)  # dk scaled in the kernel
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), ds
    _, backward_targets, backward_sources = _kernels()
    _run(backward_targets, *args, _block(query.size(0)))
    if serial:
        dk.mul_(scale)
    else:  # per source: no two threads write one row
        perm_t, crow_t, col_t = graph.transposed()
        _run(
            backward_sources,
            crow_t.numpy(),
            perm_t.numpy(),
            col_t.numpy(),
            q,
            a,
            go,
            ds.numpy(),
            drop,
            keep is not None,
            _scalar(scale, query),
            dk.numpy(),
            dv.numpy(),
            _block(key.size(0)),
        )
    return dq, dk, dv, ds
