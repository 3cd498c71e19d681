"""Context-parallel traffic: graphattn's exchange plan against ring attention, planned and measured.

    python benchmarks/context_parallel.py                  # planned table (L = 16k .. 1M, P = 2 .. 64) + timings
    python benchmarks/context_parallel.py --no-time        # the planned table only (deterministic; minutes)
    python benchmarks/context_parallel.py --time-length 8192 --repeats 7

**Planned** (no process is started): for each pattern, L and P equal blocks,
the rows every process receives (``graphattn.distributed.pattern_rows``,
derived from the pattern's parameters in O(P L), never the L x L grid)
against ring attention's, where every key/value block passes every process:
``(P - 1) / P * L`` rows. Bytes: keys and values of H = 16 heads of
D = 64 channels in bfloat16, 4096 bytes a row. The worst process is what a
synchronous step waits for, so the ratio is max(graph) / ring.

**Measured**: 2 and 4 local gloo processes (CPU), L = ``--time-length``,
H = 8, D = 32, float32: the median wall time of the planned exchange
(``graphattn.distributed.exchange``, one ``all_to_all_single``) against an
``all_gather`` of every block (the volume ring attention moves),
over ``--repeats`` calls after a warm-up, with the date and load average.
Every process plans from the pattern's edge list (``build_plan``, O(E) memory
each: BigBird at L = 16384 is about 10M edges), so keep ``--time-length`` modest.

Results: ``benchmarks/results/context-parallel-<stamp>.{csv,md}``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from graphattn import distributed as gd
from graphattn import patterns as P

LENGTHS = [2**14, 2**16, 2**18, 2**20]
PROCS = [2, 4, 8, 16, 32, 64]
ROW_BYTES = 16 * (64 + 64) * 2  # H = 16 heads, D = D_v = 64, bfloat16: one key row and one value row
MiB = 2**20


def planned_patterns():
    """The compared patterns, named for the table."""
    return {
        "complete": P.full(),
        "window_128": P.window(128, 128),
        "strided_128": P.strided(128),
        "bigbird_b128": P.bigbird(block=128, window_blocks=3, global_blocks=2, random_blocks=3, seed=0),
        "random_16": P.random(16, seed=0),
    }


def equal_blocks(L: int, procs: int) -> list:
    return [L // procs + (r < L % procs) for r in range(procs)]


def planned(lengths, procs) -> list:
    """One dict per (pattern, L, P): rows and bytes received per process, and ring attention's."""
    table = []
    for name, pattern in planned_patterns().items():
        for L in lengths:
            for p in procs:
                sizes = equal_blocks(L, p)
                recv = gd.pattern_rows(pattern, sizes).sum(1).double()  # (P,) rows each process receives
                ring = gd.ring_rows(sizes).double()  # (P,)
                table.append(
                    {
                        "pattern": name,
                        "L": L,
                        "P": p,
                        "rows_max": int(recv.max()),
                        "rows_mean": round(float(recv.mean()), 1),
                        "ring_rows": int(ring.max()),
                        "MiB_max": round(float(recv.max()) * ROW_BYTES / MiB, 2),
                        "ring_MiB": round(float(ring.max()) * ROW_BYTES / MiB, 2),
                        "max_over_ring": round(float(recv.max() / ring.max()), 6),
                        "mean_over_ring": round(float(recv.mean() / ring.mean()), 6),
                    }
                )
                print(
                    "{pattern:>13} L={L:>8} P={P:>3}  max {rows_max:>8} rows ({MiB_max:>8.2f} MiB)  "
                    "ring {ring_rows:>8} rows ({ring_MiB:>8.2f} MiB)  max/ring {max_over_ring:.4f}  "
                    "mean/ring {mean_over_ring:.4f}".format(**table[-1]),
                    flush=True,
                )
    return table


def markdown(rows: list, columns: list) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _percent(row: dict) -> str:
    """Worst and mean process over ring attention, in percent (3 significant digits)."""
    return f"{100 * row['rows_max'] / row['ring_rows']:.3g} % ({100 * row['rows_mean'] / row['ring_rows']:.3g} %)"


def pivot(rows: list) -> str:
    """The two tables of docs/distributed.md: worst/mean process against ring, and MiB at the largest L."""
    procs = sorted({r["P"] for r in rows})
    cell = {(r["pattern"], r["L"], r["P"]): r for r in rows}
    text = "| pattern | L | " + " | ".join(f"P = {p}" for p in procs) + " |\n|---|---|" + "---|" * len(procs) + "\n"
    for name, L in dict.fromkeys((r["pattern"], r["L"]) for r in rows):
        text += f"| {name} | {L} | " + " | ".join(_percent(cell[name, L, p]) for p in procs) + " |\n"
    big = max(r["L"] for r in rows)
    text += f"\nMiB received by the worst process at L = {big} (ring attention: every other block)\n\n"
    text += "| pattern | " + " | ".join(f"P = {p}" for p in procs) + " |\n|---|" + "---|" * len(procs) + "\n"
    for name in dict.fromkeys(r["pattern"] for r in rows):
        text += f"| {name} | " + " | ".join(f"{cell[name, big, p]['MiB_max']:.1f}" for p in procs) + " |\n"
    text += "| ring attention | " + " | ".join(f"{cell[name, big, p]['ring_MiB']:.1f}" for p in procs) + " |\n"
    return text


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _time_worker(rank: int, world: int, port: int, L: int, repeats: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    heads, dim = 8, 32
    sizes = equal_blocks(L, world)
    rows = torch.randn(sizes[rank], heads, 2 * dim)  # (n, H, D + D_v) float32
    everything = [torch.empty(n, heads, 2 * dim) for n in sizes]  # ring's volume: every block
    for name, pattern in planned_patterns().items():
        start = time.perf_counter()
        plan = gd.build_plan(pattern, sizes, rank) if name != "complete" else None
        plan_s = time.perf_counter() - start
        if plan is None:  # the complete graph's plan is every row: its L^2 edges are not built, only its rows
            a, none = sum(sizes[:rank]), torch.empty(2, 0, dtype=torch.long)
            recv = torch.cat([torch.arange(0, a), torch.arange(a + sizes[rank], L)])  # (L - n,)
            plan = gd.ExchangePlan(
                sizes=tuple(sizes),
                rank=rank,
                rows=gd.pattern_rows(pattern, sizes),
                send_index=torch.arange(sizes[rank]).repeat(world - 1),
                recv_source=recv,
                edge_index=none,
                edge_ids=none[0],
                global_edge_index=none,
                num_edges=0,
            )
        graph_s = _median_seconds(lambda plan=plan: gd.exchange(rows, plan), repeats)
        ring_s = _median_seconds(lambda: dist.all_gather(everything, rows), repeats)
        if rank == 0:
            queue.put(
                {
                    "pattern": name,
                    "procs": world,
                    "L": L,
                    "rows_received_max": int(plan.rows.sum(1).max()),
                    "exchange_ms": round(graph_s * 1e3, 3),
                    "all_gather_ms": round(ring_s * 1e3, 3),
                    "ratio": round(graph_s / ring_s, 3),
                    "plan_s": round(plan_s, 3),
                }
            )
    dist.destroy_process_group()


def measured(L: int, repeats: int, procs=(2, 4)) -> list:
    results, ctx = [], mp.get_context("fork")
    for world in procs:
        queue = ctx.Queue()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(_time_worker, args=(world, port, L, repeats, queue), nprocs=world, start_method="fork")
        while not queue.empty():
            results.append(queue.get())
            print(
                "{procs} processes {pattern:>13} L={L}: exchange {exchange_ms} ms (at most {rows_received_max} rows), "
                "all-gather {all_gather_ms} ms, ratio {ratio}, plan {plan_s} s".format(**results[-1]),
                flush=True,
            )
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=LENGTHS)
    parser.add_argument("--procs", type=lambda s: [int(x) for x in s.split(",")], default=PROCS)
    parser.add_argument("--no-time", action="store_true", help="the planned table only")
    parser.add_argument("--time-length", type=int, default=2**14)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    stamp = datetime.datetime.now(datetime.UTC)
    head = f"{stamp:%Y-%m-%d %H:%M} UTC, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    print(head)
    plan_rows = planned(args.lengths, args.procs)
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"context-parallel-{stamp:%Y%m%d-%H%M%S}"
    with open(f"{base}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(plan_rows[0]))
        writer.writeheader()
        writer.writerows(plan_rows)
    text = f"# Context-parallel traffic\n\n{head}\n\n## Planned, per process (keys + values, 4096 bytes a row)\n\n"
    text += "Rows received by the worst process over ring attention's (the mean process in brackets):\n\n"
    text += pivot(plan_rows) + "\nEvery row:\n\n" + markdown(plan_rows, list(plan_rows[0]))
    if not args.no_time:
        timed = measured(args.time_length, args.repeats)
        text += (
            f"\n## Measured exchange, gloo on one machine, L = {args.time_length}, H = 8, D = 32, float32\n\n"
            f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n\n"
        )
        text += markdown(timed, list(timed[0]))
    Path(f"{base}.md").write_text(text)
    print(f"wrote {base}.csv and {base}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
