"""Compiled against eager, graphattn against PyG: two-layer models trained the way users run them.

    python benchmarks/compiled.py                       # every case (about 10 minutes on 2 cores)
    python benchmarks/compiled.py --cases sparse --dims 8 --repeats 5

One thread (``torch.set_num_threads(1)``), float32, forward + backward of a
two-layer model (layer, ReLU, layer; H = 8 heads of D channels, width H * D),
contenders interleaved (each repeat runs every contender once, in turn, so a
change in the machine's load reaches all of them alike). Time: the median
CPU time (``time.process_time``) of ``--repeats`` steps after a warm-up step
(the first compiled call is the compilation, reported apart); peak memory: the
peak resident set size above the one before a step (glibc asked to return
freed buffers, as ``graphattn bench`` does).

Contenders, each eager and under ``torch.compile`` (inductor; graphattn's
TransformerConv and AttentionConv with ``fullgraph=True``, which they hold;
the GAT layers without it, as in the first runs: PyG's self-loop handling
has data-dependent shapes (graphattn's GAT layers hold ``fullgraph=True`` since
2026-12-02); PyG's layers at their defaults):

- edge cases ``sparse`` (N = 10 000, 10 random in-edges) and ``denser``
  (N = 2 000, 200 random in-edges): ``ga.TransformerConv`` and PyG's
  ``TransformerConv`` (root weight, concat: PyG's defaults);
- and on the same graphs ``ga.GATConv`` / ``ga.GATv2Conv`` against PyG's
  ``GATConv`` / ``GATv2Conv`` at PyG's defaults (self-loops added);
- pattern cases ``window`` (N = 8 192, ``patterns.window(16, 16)``) and
  ``random`` (N = 8 192, ``patterns.random(16)``), edges built once outside the
  timing: ``ga.AttentionConv`` (MHA semantics) and PyG's ``TransformerConv``
  with ``root_weight=False`` (the same attention, PyG's per-edge path).

Allocator: every step is timed in one glibc state, set before the first
(``--malloc steady``, the default: large buffers stay on the heap, as after
a memory probe; ``--malloc glibc``: glibc's defaults, under which a lean
model pays page faults on every step; memory is then not probed:
:func:`graphattn.bench.worker.malloc_for_timing`).

Ratios are printed side by side: compiled over eager graphattn (<= 1 is the
target), and PyG over graphattn in the same mode (> 1 means graphattn is
faster or smaller). Results go to ``benchmarks/results/compiled-<stamp>.{json,md}``
with the date and the load average before and after.
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
from graphattn.bench.worker import (  # the probes `graphattn bench` uses
    MALLOC_STATES,
    _malloc_for_memory_run,
    _memory_probe,
    cpu_summary,
    malloc_for_timing,
)

HEADS = 8
RESULTS = Path(__file__).resolve().parent / "results"
CASES = {"sparse": (10_000, 10), "denser": (2_000, 200), "window": (8_192, None), "random": (8_192, None)}


class TwoLayer(nn.Module):
    """``conv2(relu(conv1(x)))``: the smallest model in which a layer's output is another layer's input."""

    def __init__(self, make):
        super().__init__()
        self.conv1, self.conv2 = make(), make()

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def graph(case: str, seed: int = 0) -> tuple[int, torch.Tensor]:
    N, degree = CASES[case]
    if case == "window":
        return N, ga.patterns.window(16, 16).edge_index(N)
    if case == "random":
        return N, ga.patterns.random(16, seed=seed).edge_index(N)
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(N).repeat_interleave(degree)  # (E,)
    return N, torch.stack([torch.randint(0, N, (N * degree,), generator=g), dst])  # (2, E), duplicates allowed


def contenders(case: str, D: int) -> dict:
    """``{pair: {name: make}}``: graphattn's layer and the PyG layer it replaces, each pair compared apart."""
    from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv

    W = HEADS * D
    if case in ("sparse", "denser"):
        return {
            "TransformerConv": {
                "ga.TransformerConv": lambda: ga.TransformerConv(W, D, heads=HEADS),
                "TransformerConv": lambda: TransformerConv(W, D, heads=HEADS),
            },
            "GATConv": {
                "ga.GATConv": lambda: ga.GATConv(W, D, heads=HEADS),
                "GATConv": lambda: GATConv(W, D, heads=HEADS),
            },
            "GATv2Conv": {
                "ga.GATv2Conv": lambda: ga.GATv2Conv(W, D, heads=HEADS),
                "GATv2Conv": lambda: GATv2Conv(W, D, heads=HEADS),
            },
        }
    return {
        "attention": {
            "ga.AttentionConv": lambda: ga.AttentionConv(W, W, heads=HEADS),
            "TransformerConv(root_weight=False)": lambda: TransformerConv(W, D, heads=HEADS, root_weight=False),
        }
    }


def _step(model, x, edge_index):
    xg = x.detach().requires_grad_()
    out = model(xg, edge_index)
    out.backward(torch.ones_like(out))
    model.zero_grad(set_to_none=True)


def _peak(model, x, edge_index) -> int:
    reset, read = _memory_probe(torch.device("cpu"))
    _malloc_for_memory_run(True)
    base = reset()
    _step(model, x, edge_index)
    peak = read(base)
    _malloc_for_memory_run(False)
    return peak


def run_case(case: str, D: int, repeats: int, pairs: list[str], probe: bool = True) -> list[dict]:
    N, edge_index = graph(case)
    torch.manual_seed(0)
    x = torch.randn(N, HEADS * D)
    runs = {}
    for pair, makes in contenders(case, D).items():
        if pairs and pair not in pairs:
            continue
        for name, make in makes.items():
            runs.update(_prepare(pair, name, make, x, edge_index))
    for _ in range(repeats):  # interleaved
        for run in runs.values():
            c0 = time.process_time()
            _step(run["target"], x, edge_index)
            run["cpu"].append(time.process_time() - c0)
    rows = []
    for (pair, name, mode), run in runs.items():
        cpu = sorted(run["cpu"])
        rows.append(
            dict(
                case=case,
                N=N,
                E=edge_index.size(1),
                D=D,
                pair=pair,
                layer=name,
                mode=mode,
                cpu_s=cpu[len(cpu) // 2],
                first_s=run["first_s"],
                peak_bytes=_peak(run["target"], x, edge_index) if probe else None,
            )
        )
    return rows


def _prepare(pair: str, name: str, make, x, edge_index) -> dict:
    """Eager and compiled versions of one two-layer model, each warmed up (compiled: compiled)."""
    runs = {}
    torch.manual_seed(1)
    model = TwoLayer(make)
    # GAT layers without fullgraph, as in the runs before (PyG's self-loops break the graph; graphattn's hold it)
    fullgraph = name.startswith("ga.") and "GAT" not in name
    for mode, target in (("eager", model), ("compiled", torch.compile(model, fullgraph=fullgraph))):
        c0 = time.process_time()
        _step(target, x, edge_index)  # warm-up; compiled: the compilation
        runs[(pair, name, mode)] = dict(target=target, first_s=time.process_time() - c0, cpu=[])
    return runs


def ratios(rows: list[dict]) -> list[str]:
    def mib(r):
        return "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.0f}"

    def memory(a, b):
        return "-" if a["peak_bytes"] is None else f"{a['peak_bytes'] / max(b['peak_bytes'], 1):.2f}x"

    lines = []
    for case, D, pair in dict.fromkeys((r["case"], r["D"], r["pair"]) for r in rows):
        group = {(r["layer"], r["mode"]): r for r in rows if (r["case"], r["D"], r["pair"]) == (case, D, pair)}
        ours = next(name for name, _ in group if name.startswith("ga."))
        theirs = next(name for name, _ in group if not name.startswith("ga."))
        ge, gc = group[(ours, "eager")], group[(ours, "compiled")]
        pe, pc = group[(theirs, "eager")], group[(theirs, "compiled")]
        lines.append(
            f"| {case} | {pair} | {D} | {ge['E']} | {ge['cpu_s'] * 1e3:.1f} / {mib(ge)} "
            f"| {gc['cpu_s'] * 1e3:.1f} / {mib(gc)} "
            f"| {pe['cpu_s'] * 1e3:.1f} / {mib(pe)} "
            f"| {pc['cpu_s'] * 1e3:.1f} / {mib(pc)} "
            f"| {gc['cpu_s'] / ge['cpu_s']:.2f}x / {memory(gc, ge)} "
            f"| {pc['cpu_s'] / gc['cpu_s']:.2f}x / {memory(pc, gc)} "
            f"| {pe['cpu_s'] / ge['cpu_s']:.2f}x |"
        )
    return lines


HEADER = (
    "| case | layers | D | E | graphattn eager ms / MiB | graphattn compiled | PyG eager | PyG compiled "
    "| compiled / eager graphattn (time / memory) | PyG compiled / graphattn compiled | PyG eager / graphattn eager |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="sparse,denser,window,random")
    parser.add_argument("--dims", default="8,64", help="channels per head D, comma-separated")
    parser.add_argument("--pattern-dims", default="8", help="D for the window and random cases")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", default="", help="only these pairs, e.g. TransformerConv,GATConv")
    parser.add_argument("--malloc", choices=MALLOC_STATES, default="steady", help="glibc's state while timing")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    malloc_for_timing(args.malloc)
    torch._dynamo.config.recompile_limit = 64  # each model instance is a new compilation of TwoLayer.forward
    load_before = os.getloadavg()
    rows = []
    for case in args.cases.split(","):
        dims = args.pattern_dims if case in ("window", "random") else args.dims
        for D in (int(d) for d in dims.split(",")):
            print(f"{case} D={D} ...", flush=True)
            torch._dynamo.reset()
            pairs = [p for p in args.pairs.split(",") if p]
            for r in run_case(case, D, args.repeats, pairs, probe=args.malloc == "steady"):
                rows.append(r)
                print(
                    f"  {r['layer']:36s} {r['mode']:8s} {r['cpu_s'] * 1e3:9.1f} ms cpu  "
                    f"{(r['peak_bytes'] or 0) / 2**20:7.1f} MiB  (first call {r['first_s']:.1f} s)",
                    flush=True,
                )
    table = "\n".join([HEADER, *ratios(rows)])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    meta = dict(
        date=time.strftime("%Y-%m-%d %H:%M"),
        load_before=load_before,
        load_after=os.getloadavg(),
        torch=torch.__version__,
        threads=1,
        repeats=args.repeats,
        malloc=args.malloc,
        cpu=cpu_summary(),
    )
    print(f"\n{table}\n\n{meta}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"compiled-{stamp}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (args.out / f"compiled-{stamp}.md").write_text(f"{table}\n\n{meta}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
