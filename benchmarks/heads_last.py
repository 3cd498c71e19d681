"""The fused kernels for two row layouts, called directly: ``(N, H, D)`` against heads innermost ``(N, D, H)``.

    python benchmarks/heads_last.py                 # N = 10k, 10 in-edges, H = 8, D = 8
    python benchmarks/heads_last.py --dim 16 --repeats 60

:mod:`graphattn.ops.fused`'s kernels on PyTorch's ``(N, H, D)`` rows against
:mod:`graphattn.ops.heads_last`'s on the same values stored ``(N, D, H)`` (what
``ga.TransformerConv`` projects to at one thread), forward and backward, one
thread, float32, no bias or dropout, the kernels called directly (no autograd),
alternated (each repeat runs every contender once); minimum and median wall
time. Both kernels take ``grad_out`` and give ``out`` in ``(N, H, D)``; ``+T``
adds the transposes of q, k, v into the heads-last layout and of dq, dk, dv back,
what a caller holding ``(N, H, D)`` tensors would pay. The results are checked against each
other (largest difference printed). Measured on machine B of docs/pyg.md
(2026-12-03, on the prototype of these kernels): forward 3.4 ms against 8.0,
backward 10.2 against 16.3 (minima).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from graphattn.bench.worker import MALLOC_STATES, cpu_summary, malloc_for_timing
from graphattn.ops import fused, structure
from graphattn.ops.heads_last import CAP


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
    forward, backward = fused._kernels_heads_last(H)
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
        qT, kT, vT = (_last(x) for x in (q, k, v))
        outT, alphaT = np.empty_like(v), np.empty((graph.E, H), np.float32)  # out in (N, H, D) from both
        t = time.perf_counter()
        forward(crow, src, qT, kT, vT, none, False, none, False, scale, outT, alphaT)
        times["heads-last fwd"].append(time.perf_counter() - t)
        dq, dk, dv, ds = np.empty_like(q), np.zeros_like(k), np.zeros_like(v), np.empty((graph.E, H), np.float32)
        t = time.perf_counter()
        ours_backward(crow, src, q, k, v, alpha, go, none, False, none, False, scale, dq, ds, dk, dv, N)
        dk *= scale
        times["fused bwd"].append(time.perf_counter() - t)
        t0 = time.perf_counter()
        qT, kT, vT = (_last(x) for x in (q, k, v))
        dqT, dsT, dkT, dvT = np.empty_like(qT), np.empty((graph.E, H), np.float32), np.zeros_like(kT), np.zeros_like(vT)
        t = time.perf_counter()
        backward(crow, src, qT, kT, vT, alpha, go, none, False, none, False, scale, dqT, dsT, dkT, dvT)  # dk scaled
        t1 = time.perf_counter()
        grads = [_last(x) for x in (dqT, dkT, dvT)]
        times["heads-last bwd"].append(t1 - t)
        times["heads-last bwd +T"].append(time.perf_counter() - t0)
    diff = max(
        float(np.abs(a - b).max()) for a, b in [(out, outT), (alpha, alphaT), (ds, dsT), *zip((dq, dk, dv), grads)]
    )
    for name, t in times.items():
        print(f"{name:18s} {1e3 * min(t):7.2f}; {1e3 * statistics.median(t):7.2f}")
    print(f"# largest difference from graphattn's kernels: {diff:.1e}; load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
