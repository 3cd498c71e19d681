"""A tiny graph, where per-call overhead is the cost: a two-layer ``TransformerConv`` on KarateClub, graphattn against PyG.

    python benchmarks/tiny.py                  # 200 alternated steps, 1 thread
    python benchmarks/tiny.py --repeats 500

KarateClub (34 nodes, 156 edges; bundled with PyG, no download), ``conv(34 -> 4 heads x 8) -> relu ->
conv(32 -> 1 head x 4)``, cross-entropy on the four club labels, forward and backward, eager and compiled
(``fullgraph=True``), PyG's ``TransformerConv`` and ``ga.TransformerConv`` with the same weights, one
thread, contenders alternated (each repeat runs every one once); minimum and median wall time, and
graphattn's time over PyG's. On graphs this small nothing is spent in the kernels: graphattn's Python
(validation, the structure cache's check, the operators' dispatch) is what is measured. Machine B of
docs/pyg.md, 2026-12-03 16:38 UTC, load 0.8, two runs: graphattn 1.37-1.39x PyG's time eager,
1.66-1.67x compiled (minima): slower.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import graphattn as ga
from graphattn.bench.worker import cpu_summary, malloc_for_timing


class TwoLayer(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv1, self.conv2 = conv(34, 8, heads=4), conv(32, 4, heads=1)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def main(argv=None) -> int:
    from torch_geometric.datasets import KarateClub
    from torch_geometric.nn import TransformerConv

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    malloc_for_timing("steady")
    data = KarateClub()[0]
    torch.manual_seed(0)
    pyg = TwoLayer(TransformerConv)
    ours = TwoLayer(ga.TransformerConv)
    ours.load_state_dict(pyg.state_dict())
    runs = {"PyG eager": pyg, "graphattn eager": ours}
    runs |= {
        "PyG compiled": torch.compile(pyg, fullgraph=True),
        "graphattn compiled": torch.compile(ours, fullgraph=True),
    }

    def step(model):
        F.cross_entropy(model(data.x, data.edge_index), data.y).backward()

    for model in runs.values():
        for _ in range(5):  # compile, warm the caches
            step(model)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, model in runs.items():
            start = time.perf_counter()
            step(model)
            times[name].append(time.perf_counter() - start)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}, {cpu_summary()}")
    print("# KarateClub, two-layer TransformerConv, forward + backward, 1 thread, ms (min; median)")
    for name, values in times.items():
        print(f"{name:20s} {min(values) * 1e3:6.2f}; {statistics.median(values) * 1e3:6.2f}")
    for mode in ("eager", "compiled"):
        ours_t, pyg_t = times[f"graphattn {mode}"], times[f"PyG {mode}"]
        ratio = (min(ours_t) / min(pyg_t), statistics.median(ours_t) / statistics.median(pyg_t))
        print(f"graphattn / PyG, {mode}: {ratio[0]:.2f}x; {ratio[1]:.2f}x the time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
