"""PyG's attention layers at their defaults against graphattn's drop-ins, forward + backward, side by side.

    python benchmarks/train.py                    # every case, D = 8 and 64, eager and compiled (long)
    python benchmarks/train.py --quick            # a smoke run: small graphs, D = 8, eager, 2 repeats
    python benchmarks/train.py --cases sparse,sampled --dims 64 --modes compiled
    python benchmarks/train.py --pairs GATConv --repeats 7

Pairs, each PyG layer at its defaults (``GATConv`` and ``GATv2Conv`` add self-loops) against graphattn's
layer with the same weights (``from_*``), H = 8 heads of D channels, input width H * D, float32:

- ``GATConv``: ``torch_geometric.nn.GATConv(W, D, heads=8)`` vs ``ga.GATConv``
- ``GATv2Conv``: ``torch_geometric.nn.GATv2Conv(W, D, heads=8)`` vs ``ga.GATv2Conv``
- ``TransformerConv``: ``torch_geometric.nn.TransformerConv(W, D, heads=8)`` vs ``ga.TransformerConv``

Cases:

- ``sparse``: N = 10 000 nodes, 10 random in-edges per node (E = 100 000, duplicates allowed)
- ``denser``: N = 2 000 nodes, 200 random in-edges per node (E = 400 000)
- ``sampled``: ``NeighborLoader``'s layout on the sparse graph: 1024 seed nodes, fan-out [10, 5]
  (pyg-lib is not needed: ``examples/minibatch.py``'s sampler, checked against ``k_hop_subgraph`` in
  tests/test_minibatch.py); every step gets a fresh batch (as in training), the same sequence for both
  layers, so graphattn rebuilds its structure each step and that cost is timed.

Modes: ``eager`` and ``compiled`` (``torch.compile`` of each layer, default options; the first two
calls, which compile, are not timed). Time: PyG's and graphattn's steps alternate (``--repeats``
rounds after two warm-up steps each), medians of CPU time (``time.process_time``: the process's own
work, the steadier figure on a shared machine) and of wall time. Peak memory: the peak resident set
size above the resident size before one more step (CPU; glibc asked to return freed buffers, as
``graphattn bench`` does), ``max_memory_allocated`` on CUDA. Ratios are PyG over graphattn: > 1 means
graphattn is faster or smaller; < 1 that it is slower. ``ceiling``: PyG's CPU time over that of the
layer's dense projections alone (its ``nn.Linear`` maps of the node features, forward and backward,
timed in the same rounds): the largest ratio any drop-in could reach if its attention were free.
Allocator: every row is timed in one glibc state, set before the first step (``--malloc steady``, the
default; ``--malloc glibc`` leaves glibc's defaults, under which a lean model pays page faults on every
step, and skips the memory probes: :func:`graphattn.bench.worker.malloc_for_timing`). One thread unless ``--threads``. Prints the
date and the load average at start and end; writes ``benchmarks/results/train-<stamp>.{json,md}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import torch

import graphattn as ga
from graphattn.bench.worker import (  # the probes `graphattn bench` uses
    MALLOC_STATES,
    _malloc_for_memory_run,
    _memory_probe,
    cpu_summary,
    malloc_for_timing,
)

HEADS = 8
RESULTS = Path(__file__).resolve().parent / "results"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CASES = ("sparse", "denser", "sampled")
PAIRS = ("GATConv", "GATv2Conv", "TransformerConv")


def random_graph(N: int, degree: int, seed: int = 0) -> torch.Tensor:
    """``edge_index (2, N * degree)``: ``degree`` random in-edges per node, sorted by target (duplicates allowed)."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(N).repeat_interleave(degree)  # (E,)
    src = torch.randint(0, N, (N * degree,), generator=g)  # (E,)
    return torch.stack([src, dst])


def graphs(case: str, quick: bool, steps: int):
    """``steps`` edge lists with their node counts: the same graph each step, or a fresh sampled batch."""
    scale = 10 if quick else 1
    if case == "denser":
        N = 2_000 // scale
        return [(N, random_graph(N, 200 // scale))] * steps
    N, degree = 10_000 // scale, 10
    edge_index = random_graph(N, degree)
    if case == "sparse":
        return [(N, edge_index)] * steps
    spec = importlib.util.spec_from_file_location("minibatch_example", EXAMPLES / "minibatch.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    ptr = torch.arange(0, N * degree + 1, degree)  # (N + 1,): edges are sorted by target, `degree` each
    g = torch.Generator().manual_seed(1)
    dummy = torch.zeros(N, 1)
    out = []
    for _ in range(steps):
        seeds = torch.randperm(N, generator=g)[: 1024 // scale]
        batch = example.sample(seeds, ptr, edge_index[0], [10, 5], dummy, dummy[:, 0], generator=g)
        out.append((batch.num_nodes, batch.edge_index))
    return out


def pair(name: str, D: int):
    """``(pyg_layer, graphattn_layer)`` with the same weights, PyG's defaults."""
    from torch_geometric import nn as pyg

    W = HEADS * D
    torch.manual_seed(0)
    ref = getattr(pyg, name)(W, D, heads=HEADS)
    ours = {
        "GATConv": lambda: ga.GATConv.from_gat_conv(ref),
        "GATv2Conv": lambda: ga.GATv2Conv.from_gatv2_conv(ref),
        "TransformerConv": lambda: ga.TransformerConv.from_transformer_conv(ref),
    }[name]()
    return ref, ours


def estimate_bytes(name: str, E: int, N: int, D: int) -> int:
    """Rough peak of PyG's eager forward + backward: its per-edge (E, H, D) tensors dominate.

    Compiled, inductor fuses them away (denser, D = 64: 93 MiB measured against 4.8 GiB eager), so the
    budget applies to eager rows only.
    """
    per_edge = {"TransformerConv": 10, "GATConv": 4, "GATv2Conv": 8}[name]
    return 4 * (per_edge * E * HEADS * D + 20 * N * HEADS * D + 8 * E * HEADS)


class Projections(torch.nn.Module):
    """The PyG layer's dense projections of the node features alone (no attention): the floor of any step.

    Every drop-in computes at least these matmuls forward and backward, so PyG's step time over this
    one's is the largest ratio a drop-in could reach if its attention cost nothing (the ceiling).
    """

    def __init__(self, ref):
        super().__init__()
        names = {"GATConv": ("lin",), "GATv2Conv": ("lin_l", "lin_r"), "TransformerConv": LINEARS}
        self.lins = torch.nn.ModuleList(
            [getattr(ref, n) for n in names[type(ref).__name__] if getattr(ref, n, None) is not None]
        )

    def forward(self, x, edge_index):
        return sum(lin(x) for lin in self.lins)  # (N, H * D): each projection, summed so one backward reaches all


LINEARS = ("lin_query", "lin_key", "lin_value", "lin_skip")


def make_step(module, device):
    def step(x, edge_index):
        xg = x.detach().requires_grad_()
        out = module(xg, edge_index)
        out.backward(torch.ones_like(out))
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step


def measure_pair(steps, inputs, repeats: int, device, probe: bool = True) -> dict:
    """Both layers' steps alternating on the same inputs: medians of CPU and wall time, then peak memory."""
    cpu, wall = {k: [] for k in steps}, {k: [] for k in steps}
    for i in range(2):  # warm-up (compilation: a second shape for sampled batches)
        for step in steps.values():
            step(*inputs[i])
    for r in range(repeats):
        for k, step in steps.items():
            t0, c0 = time.perf_counter(), time.process_time()
            step(*inputs[2 + r])
            cpu[k].append(time.process_time() - c0)
            wall[k].append(time.perf_counter() - t0)
    row = {}
    reset, read = _memory_probe(device)
    for k, step in steps.items():
        row[f"{k}_peak_bytes"] = float("nan")
        if probe:
            _malloc_for_memory_run(True)
            base = reset()
            step(*inputs[2 + repeats])
            row[f"{k}_peak_bytes"] = read(base)
            _malloc_for_memory_run(False)
        row[f"{k}_cpu_s"] = sorted(cpu[k])[len(cpu[k]) // 2]
        row[f"{k}_time_s"] = sorted(wall[k])[len(wall[k]) // 2]
    for what in ("cpu_s", "time_s", "peak_bytes"):
        row[f"ratio_{what}"] = row[f"pyg_{what}"] / max(row[f"ga_{what}"], 1e-12)
    if "floor" in steps:  # PyG over its projections alone: the ratio a drop-in with free attention would reach
        row["ceiling_cpu_s"] = row["pyg_cpu_s"] / max(row["floor_cpu_s"], 1e-12)
    return row


def run(case: str, D: int, name: str, mode: str, args, device) -> dict:
    steps_needed = args.repeats + 3
    batches = graphs(case, args.quick, steps_needed)
    N, E = batches[0][0], batches[0][1].size(1)
    row = dict(case=case, D=D, H=HEADS, layer=name, mode=mode, N=N, E=E)
    need = estimate_bytes(name, max(b[1].size(1) for b in batches), N, D)
    if mode == "eager" and need > args.memory_budget * 2**30:  # compiled PyG fuses its per-edge tensors away
        return dict(row, status=f"skipped: PyG needs ~{need / 2**30:.1f} GiB > --memory-budget")
    g = torch.Generator().manual_seed(2)
    inputs = [(torch.randn(n, HEADS * D, generator=g).to(device), e.to(device)) for n, e in batches]
    ref, ours = (m.to(device) for m in pair(name, D))
    modules = {"pyg": ref, "ga": ours, "floor": Projections(ref)}
    if mode == "compiled":
        torch.compiler.reset()  # each row compiles afresh (the floor's one forward would hit dynamo's recompile limit)
        modules = {k: torch.compile(m) for k, m in modules.items()}
    try:
        return dict(
            row,
            status="ok",
            **measure_pair(
                {k: make_step(m, device) for k, m in modules.items()},
                inputs,
                args.repeats,
                device,
                probe=args.malloc == "steady",
            ),
        )
    except (RuntimeError, NotImplementedError) as error:  # e.g. out of memory: report it, go on
        return dict(row, status=f"failed: {str(error).splitlines()[0][:80]}")


def line(r: dict) -> str:
    head = f"{r['case']:8s} D={r['D']:<3d} {r['layer']:16s} {r['mode']:8s} E={r['E']:<7d}"
    if r["status"] != "ok":
        return f"{head} {r['status']}"
    return (
        f"{head} PyG {r['pyg_cpu_s'] * 1e3:8.1f} ms {r['pyg_peak_bytes'] / 2**20:7.1f} MiB | "
        f"ga {r['ga_cpu_s'] * 1e3:8.1f} ms {r['ga_peak_bytes'] / 2**20:7.1f} MiB | PyG/ga: "
        f"cpu x{r['ratio_cpu_s']:.2f} wall x{r['ratio_time_s']:.2f} memory x{r['ratio_peak_bytes']:.2f}"
        + (f" | ceiling x{r['ceiling_cpu_s']:.2f}" if "ceiling_cpu_s" in r else "")
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--pairs", default=",".join(PAIRS), help="PyG layers, comma-separated")
    parser.add_argument("--dims", help="channels per head D, comma-separated (default 8,64)")
    parser.add_argument("--modes", help="eager, compiled or both (default both)")
    parser.add_argument("--repeats", type=int, help="timed rounds (default 5)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--quick", action="store_true", help="graphs 10x smaller; unless given, D = 8, eager, 2 repeats"
    )
    parser.add_argument("--memory-budget", type=float, default=6.0, metavar="GIB")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--malloc", choices=MALLOC_STATES, default="steady", help="glibc's state while timing")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    for key, full, quick in (("dims", "8,64", "8"), ("modes", "eager,compiled", "eager"), ("repeats", 5, 2)):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    cases, pairs = [c for c in args.cases.split(",") if c], [p for p in args.pairs.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    if set(cases) - set(CASES) or set(pairs) - set(PAIRS) or set(modes) - {"eager", "compiled"} or args.repeats < 1:
        parser.error(
            f"Expected '--cases' from {CASES}, '--pairs' from {PAIRS}, '--modes' from eager, compiled "
            f"and '--repeats' >= 1 (got {args.cases!r}, {args.pairs!r}, {args.modes!r}, {args.repeats})"
        )
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cpu":
        malloc_for_timing(args.malloc)
    load = os.getloadavg()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}, torch {torch.__version__}, {args.threads} thread(s), "
        f"load average {load}; ratios PyG / graphattn (> 1: graphattn faster or smaller)"
    )
    rows = []
    for case in cases:
        for D in (int(d) for d in args.dims.split(",")):
            for name in pairs:
                for mode in modes:
                    rows.append(run(case, D, name, mode, args, device))
                    print(line(rows[-1]), flush=True)
    end = os.getloadavg()
    print(f"load average at end {end}")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = dict(
        date=stamp,
        torch=torch.__version__,
        threads=args.threads,
        device=str(device),
        load_average=load,
        load_average_end=end,
        quick=args.quick,
        malloc=args.malloc,
        cpu=cpu_summary(),
    )
    (args.out / f"train-{stamp}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (args.out / f"train-{stamp}.md").write_text(
        f"# benchmarks/train.py {stamp}\n\n{meta}\n\n```\n" + "\n".join(line(r) for r in rows) + "\n```\n"
    )
    print(f"wrote {args.out / f'train-{stamp}.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
