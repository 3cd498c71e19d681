"""Whole GNN layers, forward + backward, side by side: graphattn's against PyG's.

    python benchmarks/train.py                 # eager, the three cases at D = 8 and 64 (a few minutes)
    python benchmarks/train.py --compile --cases sparse --dims 8 --layers ga.TransformerConv,TransformerConv
    python benchmarks/train.py --cases sparse --dims 8 --repeats 5

Cases (float32, H = 8 heads of D channels, input width H * D):

- ``sparse``: N = 10 000 nodes, 10 random in-edges per node (E = 100 000)
- ``denser``: N = 2 000 nodes, 200 random in-edges per node (E = 400 000)
- ``batched``: 1000 graphs of 20-40 nodes, global attention within each graph
  (the GraphGPS case): graphattn's layers get ``patterns.full()`` and the
  ``batch`` vector; GPSConv's attention is ``to_dense_batch`` +
  ``nn.MultiheadAttention``; the edge-list layers get the sum(n_b^2) edges of
  ``graphs.batch_sequences`` (built once, outside the timing).

Layers on the edge cases: ``ga.TransformerConv`` and ``TransformerConv`` (same
configuration: root weight, concat), ``GATConv``, ``GATv2Conv`` (no added self
loops), ``ga.AttentionConv`` (MHA semantics). Time: median of ``--repeats``
calls of forward + ``backward`` after one warm-up call; a call slower than
``--slow`` seconds is timed once. CPU time: the median ``time.process_time``
of the same calls (the process's own work; on a shared, loaded machine the
wall-clock time also counts waiting for a core, the CPU time does not, so its
ratios are the steadier ones there; with several threads it sums them). Peak memory: the peak resident set size
above the resident size before one more call (CPU; glibc asked to return
freed buffers, as ``graphattn bench`` does), ``max_memory_allocated`` on CUDA.
Ratios are each layer over the graphattn layer of the case (``ga.TransformerConv``;
``ga.AttentionConv`` on the batched case): > 1 means graphattn is faster or smaller.
A case whose estimated memory exceeds ``--memory-budget`` GiB is skipped.
Results go to ``benchmarks/results/train-<stamp>.{json,md}`` with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

import graphattn as ga
from graphattn.bench.worker import _malloc_for_memory_run, _memory_probe  # the probes `graphattn bench` uses

HEADS = 8
RESULTS = Path(__file__).resolve().parent / "results"


def edge_case(name: str, device, seed: int = 0):
    """``(x_width -> edge_index, batch)``: random in-edges (duplicates allowed, as sampled graphs have)."""
    N, degree = {"sparse": (10_000, 10), "denser": (2_000, 200)}[name]
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(N).repeat_interleave(degree)  # (E,)
    src = torch.randint(0, N, (N * degree,), generator=g)  # (E,)
    return N, torch.stack([src, dst]).to(device), None


def batched_case(device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 41, (1000,), generator=g)  # (B,)
    edge_index, batch = ga.graphs.batch_sequences(lengths)  # (2, sum n^2), (N,)
    return int(lengths.sum()), edge_index.to(device), batch.to(device)


class DenseBatchMHA(nn.Module):
    """GPSConv's global attention: ``to_dense_batch`` + ``nn.MultiheadAttention`` + unpad."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x, batch):
        from torch_geometric.utils import to_dense_batch

        h, mask = to_dense_batch(x, batch)  # (B, T, F), (B, T)
        h, _ = self.attn(h, h, h, key_padding_mask=~mask, need_weights=False)
        return h[mask]  # (N, F)


def layers(case: str, D: int):
    """``{name: (module, call(module, x, edge_index, batch))}`` for one case."""
    from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv

    W = HEADS * D
    edges = {
        "ga.TransformerConv": (ga.TransformerConv(W, D, heads=HEADS), lambda m, x, e, b: m(x, e)),
        "TransformerConv": (TransformerConv(W, D, heads=HEADS), lambda m, x, e, b: m(x, e)),
        "GATConv": (GATConv(W, D, heads=HEADS, add_self_loops=False), lambda m, x, e, b: m(x, e)),
        "GATv2Conv": (GATv2Conv(W, D, heads=HEADS, add_self_loops=False), lambda m, x, e, b: m(x, e)),
        "ga.AttentionConv": (ga.AttentionConv(W, W, heads=HEADS), lambda m, x, e, b: m(x, e)),
    }
    if case != "batched":
        return edges
    full = ga.patterns.full()
    return {
        "ga.AttentionConv": (ga.AttentionConv(W, W, heads=HEADS), lambda m, x, e, b: m(x, full, batch=b)),
        "ga.TransformerConv": (ga.TransformerConv(W, D, heads=HEADS), lambda m, x, e, b: m(x, full, batch=b)),
        "to_dense_batch+MHA": (DenseBatchMHA(W, HEADS), lambda m, x, e, b: m(x, b)),
        **{k: v for k, v in edges.items() if not k.startswith("ga.")},
    }


def estimate_bytes(name: str, E: int, N: int, D: int) -> int:
    """Rough peak of one forward + backward: per-edge layers hold several (E, H, D) tensors."""
    per_edge = {"TransformerConv": 10, "GATConv": 4, "GATv2Conv": 8}.get(name, 0)
    return 4 * (per_edge * E * HEADS * D + 20 * N * HEADS * D + 8 * E * HEADS)


def measure(module, call, x, edge_index, batch, repeats: int, slow: float, device, compiled: bool) -> dict:
    def step():
        xg = x.detach().requires_grad_()
        out = call(module, xg, edge_index, batch)
        out.backward(torch.ones_like(out))
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t0, c0 = time.perf_counter(), time.process_time()
    step()
    first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    times, cpu = [], []
    for _ in range(repeats if first < slow else int(compiled)):  # a compiled first call is the compilation
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    times, cpu = times or [first], cpu or [first_cpu]
    reset, read = _memory_probe(device)
    _malloc_for_memory_run(True)
    base = reset()
    step()
    peak = read(base)
    _malloc_for_memory_run(False)
    return dict(time_s=sorted(times)[len(times) // 2], cpu_s=sorted(cpu)[len(cpu) // 2], first_s=first,
                runs=len(times), peak_bytes=peak)


def run_case(case: str, D: int, args, device) -> list[dict]:
    N, edge_index, batch = batched_case(device) if case == "batched" else edge_case(case, device)
    E = edge_index.size(1)
    torch.manual_seed(0)
    x = torch.randn(N, HEADS * D, device=device)
    rows = []
    for name, (module, call) in layers(case, D).items():
        if args.layers and name not in args.layers.split(","):
            continue
        row = dict(case=case, N=N, E=E, D=D, H=HEADS, layer=name, compiled=False)
        need = estimate_bytes(name, E, N, D)
        if need > args.memory_budget * 2 ** 30:
            rows.append(dict(row, status=f"skipped: ~{need / 2 ** 30:.1f} GiB > budget"))
            continue
        module = module.to(device)
        for compiled in (False, True) if args.compile else (False,):
            target = torch.compile(module) if compiled else module
            try:
                rows.append(dict(row, compiled=compiled, status="ok",
                                 **measure(target, call, x, edge_index, batch, args.repeats, args.slow, device,
                                          compiled)))
            except (RuntimeError, NotImplementedError) as error:  # e.g. out of memory: report, go on
                rows.append(dict(row, compiled=compiled, status=f"failed: {str(error).splitlines()[0][:80]}"))
            print(_line(rows[-1]), flush=True)
    return rows


def add_ratios(rows: list[dict]) -> None:
    for r in rows:
        ref_name = "ga.AttentionConv" if r["case"] == "batched" else "ga.TransformerConv"
        ref = next((q for q in rows if q["case"] == r["case"] and q["D"] == r["D"] and q["layer"] == ref_name
                    and q["compiled"] == r["compiled"] and q["status"] == "ok"), None)
        if ref is not None and r["status"] == "ok":
            r["time_ratio"] = r["time_s"] / ref["time_s"]
            r["cpu_ratio"] = r["cpu_s"] / ref["cpu_s"]
            r["memory_ratio"] = r["peak_bytes"] / max(ref["peak_bytes"], 1)


def _line(r: dict) -> str:
    head = f"{r['case']:8s} D={r['D']:<3d} {r['layer']:20s} {'compiled' if r['compiled'] else 'eager':8s}"
    if r["status"] != "ok":
        return f"{head} {r['status']}"
    ratios = ""
    if "time_ratio" in r:
        ratios = f"  time x{r['time_ratio']:.2f}  cpu x{r['cpu_ratio']:.2f}  memory x{r['memory_ratio']:.2f}"
    return (f"{head} {r['time_s'] * 1e3:9.1f} ms (cpu {r['cpu_s'] * 1e3:7.1f} ms) "
            f"{r['peak_bytes'] / 2 ** 20:8.1f} MiB{ratios}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="sparse,denser,batched")
    parser.add_argument("--dims", default="8,64", help="channels per head D, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow", type=float, default=5.0, help="time a call slower than this (s) only once")
    parser.add_argument("--compile", action="store_true", help="also torch.compile every layer")
    parser.add_argument("--layers", default="", help="only these layers, comma-separated (e.g. for --compile)")
    parser.add_argument("--memory-budget", type=float, default=6.0, metavar="GIB")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - {"sparse", "denser", "batched"}
    if unknown or args.repeats < 1:
        parser.error(f"Expected '--cases' from sparse, denser, batched and '--repeats' >= 1 "
                     f"(got {args.cases!r}, {args.repeats})")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load}")
    rows = []
    for case in cases:
        for D in (int(d) for d in args.dims.split(",")):
            rows += run_case(case, D, args, device)
    add_ratios(rows)
    print("\nratios: other layer / graphattn layer of the case (> 1: graphattn faster / smaller)")
    for r in rows:
        print(_line(r))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(date=stamp, torch=torch.__version__, threads=torch.get_num_threads(), device=str(device),
                load_average=load, load_average_end=os.getloadavg() if load else None)
    (args.out / f"train-{stamp}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (args.out / f"train-{stamp}.md").write_text(
        f"# benchmarks/train.py {stamp}\n\n{meta}\n\n```\n" + "\n".join(_line(r) for r in rows) + "\n```\n")
    print(f"wrote {args.out / f'train-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
