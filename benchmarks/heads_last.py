"""A prototype, not graphattn's kernel: the fused kernels with the heads innermost, against graphattn's.

    python benchmarks/heads_last.py                 # N = 10k, 10 in-edges, H = 8, D = 8
    python benchmarks/heads_last.py --repeats 60

graphattn's fused kernels (:mod:`graphattn.ops.fused`) keep PyTorch's ``(N, H, D)``
rows and loop over heads, then channels; at D = 8 every loop is 8 long and
LLVM's loop vectoriser runs it through its remainder code. Here the rows are
``(N, D, H)``: each loop over heads, with ``H`` fixed when the kernel is
compiled, is one vector operation once LLVM's SLP vectoriser runs (numba turns
it off by default: ``NUMBA_SLP_VECTORIZE=0``; this script turns it on while it
compiles the prototypes only). The backward stages each edge's ``dk_j``, ``dv_j``
terms in a stack buffer first (:func:`_stack`: an ``alloca``, which no argument
can alias), so the read-modify-write of the random rows vectorises too.

Serial (one thread), float32, no bias, no dropout: enough to time the layout,
not a replacement. Both sides are called directly on the same inputs, alternated
(each repeat runs every contender once); the results are checked against
graphattn's (largest difference printed). ``+T`` adds the transposes into the
layout and back that a caller with ``(N, H, D)`` tensors would need.
Measured on machine B of docs/pyg.md (2026-12-03): forward 3.8 ms against
7.1-9.0 ms, backward 11.2-11.3 ms against 18.2-19.9 ms (minima).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from graphattn.bench.worker import MALLOC_STATES, cpu_summary, malloc_for_timing
from graphattn.ops import fused, structure
from graphattn.ops.prefetch import prefetch_row, prefetch_row_write
from graphattn.ops.vexp import exp

CAP = 4096  # elements per stack buffer
FASTMATH = {"reassoc", "contract"}


@intrinsic
def _stack(typingctx, like):
    """A pointer to ``CAP`` elements of ``like``'s dtype on the stack (one ``alloca`` per call site)."""
    if not isinstance(like, types.Array):
        return None

    def codegen(context, builder, signature, args):
        element = context.get_data_type(like.dtype)
        with builder.goto_entry_block():
            buffer = builder.alloca(ir.ArrayType(element, CAP))
        return builder.bitcast(buffer, element.as_pointer())

    return types.CPointer(like.dtype)(like), codegen


def build(H: int):
    """The heads-last forward and backward for ``H`` heads (a closure constant: the loops over heads unroll)."""
    jit = numba.njit(fastmath=FASTMATH, nogil=True)
    ahead = 8

    @jit
    def forward(crow, src, qT, kT, vT, scale, outT, alpha):  # pragma: no cover
        L, D, _ = qT.shape
        Dv, E = vT.shape[1], src.shape[0]
        zero = scale - scale
        s = numba.carray(_stack(qT), H)  # one buffer per call site
        top = numba.carray(_stack(qT), H)
        norm = numba.carray(_stack(qT), H)
        acc = numba.carray(_stack(qT), (Dv, H))
        for i in range(L):
            e0, e1 = crow[i], crow[i + 1]
            for h in range(H):
                top[h] = -math.inf
                norm[h] = zero
            for d in range(Dv):
                for h in range(H):
                    acc[d, h] = zero
            for e in range(e0, e1):
                if e + ahead < E:
                    prefetch_row(kT, src[e + ahead])
                j = src[e]
                for h in range(H):
                    s[h] = zero
                for d in range(D):
                    for h in range(H):
                        s[h] += qT[i, d, h] * kT[j, d, h]
                for h in range(H):
                    x = s[h] * scale
                    alpha[e, h] = x
                    top[h] = max(top[h], x)
            for h in range(H):
                if top[h] == -math.inf:
                    top[h] = zero
            for e in range(e0, e1):
                for h in range(H):
                    alpha[e, h] = exp(alpha[e, h] - top[h])
            for e in range(e0, e1):
                if e + ahead < E:
                    prefetch_row(vT, src[e + ahead])
                j = src[e]
                for h in range(H):
                    norm[h] += alpha[e, h]
                for d in range(Dv):
                    for h in range(H):
                        acc[d, h] += alpha[e, h] * vT[j, d, h]
            for h in range(H):
                norm[h] = 1 / norm[h] if norm[h] != 0 else zero
            for d in range(Dv):
                for h in range(H):
                    outT[i, d, h] = acc[d, h] * norm[h]
            for e in range(e0, e1):
                for h in range(H):
                    alpha[e, h] *= norm[h]

    @jit
    def backward(crow, src, qT, kT, vT, alpha, goT, scale, dqT, ds, dkT, dvT):  # pragma: no cover
        L, D, _ = qT.shape
        Dv, E = vT.shape[1], src.shape[0]
        zero = scale - scale
        ag = numba.carray(_stack(qT), H)
        w = numba.carray(_stack(qT), H)
        a = numba.carray(_stack(qT), H)
        g = numba.carray(_stack(qT), H)
        acc = numba.carray(_stack(qT), (D, H))
        tk = numba.carray(_stack(qT), (D, H))  # this edge's dk_j term, staged
        tv = numba.carray(_stack(qT), (Dv, H))  # this edge's dv_j term, staged
        for i in range(L):
            e0, e1 = crow[i], crow[i + 1]
            for h in range(H):
                ag[h] = zero
            for d in range(D):
                for h in range(H):
                    acc[d, h] = zero
            for e in range(e0, e1):
                if e + ahead < E:
                    prefetch_row(vT, src[e + ahead])
                j = src[e]
                for h in range(H):
                    g[h] = zero
                for d in range(Dv):
                    for h in range(H):
                        g[h] += goT[i, d, h] * vT[j, d, h]
                for h in range(H):
                    ds[e, h] = g[h]
                    ag[h] += alpha[e, h] * g[h]
            for e in range(e0, e1):
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
                for d in range(D):
                    for h in range(H):
                        acc[d, h] += w[h] * kT[j, d, h]
                        tk[d, h] = w[h] * qT[i, d, h]
                for d in range(Dv):
                    for h in range(H):
                        tv[d, h] = a[h] * goT[i, d, h]
                for d in range(D):
                    for h in range(H):
                        dkT[j, d, h] += tk[d, h]
                for d in range(Dv):
                    for h in range(H):
                        dvT[j, d, h] += tv[d, h]
            for d in range(D):
                for h in range(H):
                    dqT[i, d, h] = acc[d, h] * scale

    return forward, backward


def _last(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x).transpose(1, 2).contiguous().numpy()  # (N, H, D) <-> (N, D, H)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--degree", type=int, default=10)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--malloc", choices=MALLOC_STATES, default="steady", help="glibc's state while timing")
    args = parser.parse_args(argv)
    malloc_for_timing(args.malloc)
    torch.set_num_threads(1)
    N, K, H, D = args.nodes, args.degree, args.heads, args.dim
    if H * max(D, 1) > CAP:
        parser.error(f"--heads x --dim must be at most {CAP}")
    rng = np.random.default_rng(0)
    edge_index = torch.stack([torch.from_numpy(rng.integers(0, N, N * K)), torch.arange(N).repeat_interleave(K)])
    graph = structure.prepare(edge_index, N, N)
    crow, src = graph.crow.numpy(), graph.src.numpy()
    q, k, v, go = (rng.standard_normal((N, H, D)).astype(np.float32) for _ in range(4))
    scale, none = np.float32(D**-0.5), np.zeros((1, 1), np.float32)
    ours_forward, ours_backward, _ = fused._kernels()
    slp = numba.config.SLP_VECTORIZE
    numba.config.SLP_VECTORIZE = 1  # read per compilation: on for the prototypes only
    try:
        forward, backward = build(H)
        qT, kT, vT, goT = (_last(x) for x in (q, k, v, go))
        forward(crow, src, qT, kT, vT, scale, np.empty_like(vT), np.empty((graph.E, H), np.float32))
        backward(
            crow,
            src,
            qT,
            kT,
            vT,
            np.empty((graph.E, H), np.float32),
            goT,
            scale,
            *(np.empty_like(qT), np.empty((graph.E, H), np.float32), np.zeros_like(kT), np.zeros_like(vT)),
        )
    finally:
        numba.config.SLP_VECTORIZE = slp
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}, N = {N}, {K} in-edges, "
        f"H = {H}, D = {D}, float32, 1 thread, kernels called directly, ms (min; median), malloc {args.malloc}, "
        f"{cpu_summary()}"
    )
    times: dict[str, list[float]] = {
        n: [] for n in ("fused fwd", "heads-last fwd", "fused bwd", "heads-last bwd", "heads-last bwd +T")
    }
    for _ in range(args.repeats):
        out, alpha = np.empty_like(v), np.empty((graph.E, H), np.float32)
        t = time.perf_counter()
        ours_forward(crow, src, q, k, v, none, False, none, False, scale, out, alpha, N)
        times["fused fwd"].append(time.perf_counter() - t)
        qT, kT, vT, goT = (_last(x) for x in (q, k, v, go))
        outT, alphaT = np.empty_like(vT), np.empty((graph.E, H), np.float32)
        t = time.perf_counter()
        forward(crow, src, qT, kT, vT, scale, outT, alphaT)
        times["heads-last fwd"].append(time.perf_counter() - t)
        dq, dk, dv, ds = np.empty_like(q), np.zeros_like(k), np.zeros_like(v), np.empty((graph.E, H), np.float32)
        t = time.perf_counter()
        ours_backward(crow, src, q, k, v, alpha, go, none, False, none, False, scale, dq, ds, dk, dv, N)
        dk *= scale
        times["fused bwd"].append(time.perf_counter() - t)
        t0 = time.perf_counter()
        qT, kT, vT, goT = (_last(x) for x in (q, k, v, go))
        dqT, dsT, dkT, dvT = np.empty_like(qT), np.empty((graph.E, H), np.float32), np.zeros_like(kT), np.zeros_like(vT)
        t = time.perf_counter()
        backward(crow, src, qT, kT, vT, alpha, goT, scale, dqT, dsT, dkT, dvT)
        dkT *= scale
        t1 = time.perf_counter()
        grads = [_last(x) for x in (dqT, dkT, dvT)]
        times["heads-last bwd"].append(t1 - t)
        times["heads-last bwd +T"].append(time.perf_counter() - t0)
    diff = max(
        float(np.abs(a - b).max())
        for a, b in [(out, _last(outT)), (alpha, alphaT), (ds, dsT), *zip((dq, dk, dv), grads)]
    )
    for name, t in times.items():
        print(f"{name:18s} {1e3 * min(t):7.2f}; {1e3 * statistics.median(t):7.2f}")
    print(f"# largest difference from graphattn's kernels: {diff:.1e}; load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
