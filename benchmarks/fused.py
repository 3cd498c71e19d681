"""The attention operator alone, forward + backward: fused CPU kernel, library CSR path, compiled per-edge code.

    python benchmarks/fused.py                 # N = 10k, 10 in-edges, H = 8, D = 8 and 64
    python benchmarks/fused.py --dims 8 --repeats 20

One thread, float32, CPU time (``time.process_time``), contenders interleaved
(each repeat runs every one once, in turn), median of ``--repeats``. Contenders:

- ``fused``: ``graphattn.attention`` on the CSR path with the fused kernel
  (:mod:`graphattn.ops.fused`);
- ``library``: the same call with the fused kernel switched off (sampled
  matmul, segment softmax, sparse-dense matmul);
- ``per-edge compiled``: the per-edge formulation PyG's ``TransformerConv``
  runs (gather q_i, k_j, v_j, score, ``torch_geometric.utils.softmax``,
  scatter-add), under ``torch.compile`` (inductor fuses it into per-edge loops).

Every step runs in one declared state of glibc's allocator (``--malloc steady``,
the default, or ``--malloc glibc``: :func:`graphattn.bench.worker.malloc_for_timing`),
as in the layer benchmarks. Prints the median milliseconds and the ratios to
``fused``, with the date, load average and CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch_geometric.utils import scatter, softmax

import graphattn as ga
from graphattn.bench.worker import MALLOC_STATES, cpu_summary, malloc_for_timing
from graphattn.ops import fused


def per_edge(q, k, v, edge_index, scale):
    src, dst = edge_index
    score = (q.index_select(0, dst) * k.index_select(0, src)).sum(-1) * scale  # (E, H)
    alpha = softmax(score, dst, num_nodes=q.size(0))  # (E, H)
    msg = v.index_select(0, src) * alpha.unsqueeze(-1)  # (E, H, D)
    return scatter(msg, dst, 0, dim_size=q.size(0), reduce="sum")  # (N, H, D)


def step(fn, q, k, v):
    for t in (q, k, v):
        t.grad = None
    start = time.process_time()
    fn(q, k, v)[0].sum().backward()
    return time.process_time() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--degree", type=int, default=10)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dims", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--malloc", choices=MALLOC_STATES, default="steady", help="glibc's state while timing")
    args = parser.parse_args(argv)
    malloc_for_timing(args.malloc)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    N, K, H = args.nodes, args.degree, args.heads
    edge_index = torch.stack([torch.randint(0, N, (N * K,)), torch.arange(N).repeat_interleave(K)])  # (2, E)
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}, "
        f"N = {N}, {K} in-edges, H = {H}, torch {torch.__version__}, 1 thread, fwd+bwd, CPU ms (median), "
        f"malloc {args.malloc}, {cpu_summary()}"
    )
    compiled = torch.compile(per_edge)
    for D in args.dims:
        scale = D**-0.5
        q, k, v = (torch.randn(N, H, D, requires_grad=True) for _ in range(3))

        def ours(q, k, v, scale=scale):
            return ga.attention(q, k, v, edge_index, scale=scale, impl="csr")

        def library(q, k, v, scale=scale):
            fused.ENABLED = False
            try:
                return ga.attention(q, k, v, edge_index, scale=scale, impl="csr")
            finally:
                fused.ENABLED = True

        contenders = {
            "fused": ours,
            "library": library,
            "per-edge compiled": lambda q, k, v, scale=scale: compiled(q, k, v, edge_index, scale),
        }
        times = {name: [] for name in contenders}
        for fn in contenders.values():  # warm-up (compilation)
            step(fn, q, k, v)
        for _ in range(args.repeats):
            for name, fn in contenders.items():
                times[name].append(step(fn, q, k, v))
        base = statistics.median(times["fused"])
        cells = ", ".join(
            f"{name} {1e3 * statistics.median(t):.1f} ms ({statistics.median(t) / base:.2f}x)"
            for name, t in times.items()
        )
        print(f"D = {D}: {cells}")
    print(f"# load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
