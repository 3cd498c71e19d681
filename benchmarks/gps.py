"""A whole GraphGPS model, forward + backward: PyG's stock ``GPSConv`` against graphattn's.

    python benchmarks/gps.py                    # 1000 graphs of 20-40 nodes, 64 channels, 4 heads, 7 rounds
    python benchmarks/gps.py --quick            # 200 graphs, 3 rounds (a smoke run)
    python benchmarks/gps.py --channels 32 --heads 8 --compile

Model (float32): two ``GPSConv(channels, GINConv(MLP), heads)`` layers at PyG's
defaults otherwise (batch norm, dropout 0, ReLU), a sum pool and a linear
read-out; a random batch of ``--graphs`` graphs of 20-40 nodes, 4 random
in-edges per node inside its graph. Variants, all with the same weights:

- ``stock``: PyG's ``GPSConv`` (``to_dense_batch`` + ``nn.MultiheadAttention`` + ``h[mask]``)
- ``GPSAttention``: the stock layer with its attention swapped for
  :class:`graphattn.gps.GPSAttention` (one SDPA call on the padded layout)
- ``graphattn``: ``use_graphattn(model)``, i.e. :class:`graphattn.gps.GPSConv`
  (the attention on the node layout, on the ragged operator; never pads)

Timing: one thread, one warm-up call each, then ``--rounds`` rounds in which
each variant runs once, interleaved (so a load change hits all alike); the
median CPU time (``time.process_time``) and wall time per variant, all in one
glibc allocator state set before the first call (``--malloc steady``, the default: large
buffers kept on the heap; ``--malloc glibc``: glibc's defaults, memory not probed:
:func:`graphattn.bench.worker.malloc_for_timing`). Peak memory:
the peak resident set size above the resident size before one more call
(glibc asked to return freed buffers, as ``graphattn bench`` does). Ratios are
stock over each variant (> 1: faster / smaller than stock). Prints the date
and the load average at start and end.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch
from torch import nn

from graphattn.bench.worker import (  # the probes `graphattn bench` uses
    MALLOC_STATES,
    _malloc_for_memory_run,
    _memory_probe,
    cpu_summary,
    malloc_for_timing,
)


class GPS(nn.Module):
    """``layers`` x ``GPSConv(channels, GINConv(MLP), heads)``, sum pool, linear read-out."""

    def __init__(self, channels: int, heads: int, layers: int = 2):
        super().__init__()
        from torch_geometric.nn import GINConv, GPSConv

        def gin():
            return GINConv(nn.Sequential(nn.Linear(channels, channels), nn.ReLU(), nn.Linear(channels, channels)))

        self.blocks = nn.ModuleList(GPSConv(channels, gin(), heads=heads) for _ in range(layers))
        self.head = nn.Linear(channels, 1)

    def forward(self, x, edge_index, batch):
        from torch_geometric.nn import global_add_pool

        for block in self.blocks:
            x = block(x, edge_index, batch)  # (N, channels)
        return self.head(global_add_pool(x, batch))  # (B, 1)


def make_batch(graphs: int, channels: int, degree: int = 4, seed: int = 0):
    """``x (N, channels), edge_index (2, N * degree), batch (N,)``: graphs of 20-40 nodes, edges inside each."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 41, (graphs,), generator=g)  # (B,)
    batch = torch.repeat_interleave(torch.arange(graphs), lengths)  # (N,)
    start = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])  # (B,) first node of each graph
    dst = torch.arange(batch.numel()).repeat_interleave(degree)  # (E,)
    offset = (torch.rand(dst.numel(), generator=g) * lengths[batch[dst]]).long()  # (E,) in [0, n_b)
    src = start[batch[dst]] + offset  # (E,)
    return torch.randn(batch.numel(), channels, generator=g), torch.stack([src, dst]), batch


def variants(channels: int, heads: int, compiled: bool) -> dict:
    from graphattn.gps import GPSAttention, use_graphattn

    torch.manual_seed(0)
    stock = GPS(channels, heads)
    swapped = copy.deepcopy(stock)
    for block in swapped.blocks:
        block.attn = GPSAttention.from_multihead_attention(block.attn)
    models = {"stock": stock, "GPSAttention": swapped, "graphattn": use_graphattn(copy.deepcopy(stock))}
    return {k: torch.compile(m) if compiled else m for k, m in models.items()}


def step(model, x, edge_index, batch) -> None:
    out = model(x, edge_index, batch)
    out.sum().backward()
    for p in model.parameters():
        p.grad = None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, default=1000)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compile", action="store_true", help="torch.compile every variant")
    parser.add_argument("--quick", action="store_true", help="200 graphs, 3 rounds")
    parser.add_argument("--malloc", choices=MALLOC_STATES, default="steady", help="glibc's state while timing")
    args = parser.parse_args(argv)
    if args.quick:
        args.graphs, args.rounds = 200, 3
    torch.set_num_threads(1)
    malloc_for_timing(args.malloc)  # every variant timed in one allocator state
    load = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}, torch {torch.__version__}, 1 thread, load average {load}")
    print(cpu_summary())
    x, edge_index, batch = make_batch(args.graphs, args.channels)
    print(
        f"{args.graphs} graphs, N = {x.size(0)} nodes, E = {edge_index.size(1)}, channels {args.channels}, "
        f"heads {args.heads}, {'compiled' if args.compile else 'eager'}, forward + backward"
    )
    models = variants(args.channels, args.heads, args.compile)
    for model in models.values():
        step(model, x, edge_index, batch)  # warm-up (compilation)
    cpu, wall = {k: [] for k in models}, {k: [] for k in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            t0, c0 = time.perf_counter(), time.process_time()
            step(model, x, edge_index, batch)
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - t0)
    peak = dict.fromkeys(models, float("nan"))  # --malloc glibc: not probed (a probe changes the state)
    reset, read = _memory_probe(torch.device("cpu"))
    probed = models if args.malloc == "steady" else {}
    for name, model in probed.items():
        _malloc_for_memory_run(True)
        base = reset()
        step(model, x, edge_index, batch)
        peak[name] = read(base)
        _malloc_for_memory_run(False)
    med = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    med_wall = {k: sorted(v)[len(v) // 2] for k, v in wall.items()}
    print(f"{'variant':14s} {'cpu ms':>9s} {'wall ms':>9s} {'peak MiB':>9s}  stock/variant: cpu  wall  memory")
    for name in models:
        print(
            f"{name:14s} {med[name] * 1e3:9.1f} {med_wall[name] * 1e3:9.1f} {peak[name] / 2**20:9.1f}"
            f"  {med['stock'] / med[name]:19.2f} {med_wall['stock'] / med_wall[name]:5.2f}"
            f" {peak['stock'] / max(peak[name], 1):7.2f}"
        )
    print(f"load average at end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
